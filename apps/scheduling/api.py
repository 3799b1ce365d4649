"""``teams/``: the limits in force for each of the caller's teams and its fair-share standing."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.api import query_strict
from apps.core.openapi import ERROR, paginated
from apps.core.pagination import ListPage
from apps.core.selectors import get_or_404

from .standing import TEAM_NOT_VISIBLE, standing_teams, team_standings


class LimitOut(serializers.Serializer):
    value = serializers.FloatField(allow_null=True, help_text="null: no limit")
    source = serializers.ChoiceField(choices=["team", "site default"])


class TeamStandingOut(serializers.Serializer):
    id = serializers.IntegerField()
    team = serializers.CharField()
    name = serializers.CharField()
    role = serializers.CharField(allow_null=True)
    window = serializers.CharField()
    urgent_by = serializers.ChoiceField(choices=["members", "managers"],
                                       help_text="who may submit urgent jobs: every member, or the managers only")
    policy = serializers.ChoiceField(choices=["fair", "fifo"],
                                     help_text="the scheduler's policy now: under fifo fair share orders nothing")
    limits = serializers.DictField(child=LimitOut(), help_text=(
        "max_gpus (with in_use), max_gpus_per_job, user_gpu_hours_per_day (with my_used_24h), "
        "urgent_gpu_hours_per_day (with used_24h), urgent_max_gpus (with in_use), storage_gb (uploaded datasets "
        "and weights, GiB, with used; also used_bytes and limit_bytes)"))
    fair_share = serializers.DictField(help_text=(
        "shares, total_shares, share_fraction, decayed_gpu_hours, total_decayed_gpu_hours, usage_fraction, "
        "level (share over usage fraction; null = no usage), standing, half_life_hours, members, my_factor"))


class TeamList(APIView):
    """Every team of the caller with its limits in force and fair-share standing, a page at a
    time like every other list (it was a bare list that ignored ?limit=; manager trial 15, F26)."""

    @extend_schema(responses={200: paginated(TeamStandingOut), 400: ERROR}, operation_id="teams_list")
    def get(self, request):
        query_strict(request, takes=(), what="the team list", paged=True)
        paginator = ListPage()
        page = paginator.paginate_queryset(standing_teams(user=request.user), request, view=self)
        return paginator.get_paginated_response(team_standings(user=request.user, teams=list(page)))


class TeamDetail(APIView):
    """One of the caller's teams; another team's id is a 404, as one that does not exist."""

    @extend_schema(responses={200: TeamStandingOut, 404: ERROR})
    def get(self, request, pk: int):
        query_strict(request, takes=(), what="a team")
        team = get_or_404(standing_teams(user=request.user), pk, TEAM_NOT_VISIBLE)
        return Response(team_standings(user=request.user, teams=[team])[0])
