"""REST endpoints for the caller's API tokens and the audit log."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.api import StrictInput, field_errors, query_strict
from apps.core.errors import FieldErrors
from apps.core.openapi import ERROR, before_parameter, paginated
from apps.core.pagination import ListPage, NewestFirstPage
from apps.core.selectors import get_or_404

from .models import ApiToken, AuditEntry
from .selectors import audit_list, team_filter, token_list
from .services import token_issue, token_revoke
from .throttles import AuthThrottle

# --- tokens -------------------------------------------------------------------------------


class TokenOut(serializers.ModelSerializer):
    active = serializers.BooleanField(source="is_active", read_only=True)

    class Meta:
        model = ApiToken
        fields = ["id", "name", "key_prefix", "created_at", "expires_at", "revoked_at", "last_used_at", "active"]


class TokenCreatedOut(TokenOut):
    key = serializers.CharField(help_text="the token itself; shown only in this response, store it now")

    class Meta(TokenOut.Meta):
        fields = [*TokenOut.Meta.fields, "key"]


class TokenIn(StrictInput):
    forbidden = {"user": "tokens are always created for the caller",
                 "expires_at": "give expires_in_days instead"}
    name = serializers.RegexField(r"^[\w .:@+-]{1,100}$", max_length=100, default="default",
                                  error_messages={"invalid": "must be 1-100 letters, digits, spaces or . _ - : @ +"})
    expires_in_days = serializers.IntegerField(min_value=1, max_value=3650, required=False)


class TokenListCreate(APIView):
    def get_throttles(self):
        return [AuthThrottle()] if self.request.method == "POST" else super().get_throttles()

    @extend_schema(responses={200: paginated(TokenOut), 400: ERROR}, operation_id="tokens_list",
                   parameters=[before_parameter("tokens")],
                   description="Newest first. Follow `next` to page: it continues after the last token shown "
                               "(`before`).")
    def get(self, request):
        query_strict(request, takes=("before",), what="the token list", paged=True)
        paginator = NewestFirstPage(item="token")
        page = paginator.paginate_queryset(token_list(user=request.user), request, view=self,
                                           not_found="no token of yours with that id")
        return paginator.get_paginated_response(TokenOut(page, many=True).data)

    @extend_schema(request=TokenIn, responses={201: TokenCreatedOut, 400: ERROR, 429: ERROR})
    def post(self, request):
        data = TokenIn(data=request.data)
        data.is_valid(raise_exception=True)
        try:  # the same service as the portal's token page: name, expiry and cap rules live there
            token, key = token_issue(user=request.user, name=data.validated_data["name"],
                                     expires_in_days=data.validated_data.get("expires_in_days"))
        except FieldErrors as exc:
            return field_errors(exc.errors)
        token.key = key  # the plain key lives only on this instance, for this one response
        return Response(TokenCreatedOut(token).data, status=status.HTTP_201_CREATED)


class TokenDetail(APIView):
    @extend_schema(responses={200: TokenOut, 404: ERROR})
    def get(self, request, token_id: int):
        query_strict(request, takes=(), what="a token")
        return Response(TokenOut(get_or_404(token_list(user=request.user), token_id, "No token with that id among yours.")).data)

    @extend_schema(request=None, responses={200: TokenOut, 404: ERROR}, description="Revoke the token (idempotent).")
    def delete(self, request, token_id: int):
        token = get_or_404(token_list(user=request.user), token_id, "No token with that id among yours.")
        token_revoke(token=token, by=request.user)
        token.refresh_from_db()
        return Response(TokenOut(token).data)


# --- audit ------------------------------------------------------------------------------


class AuditOut(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name")
    team = serializers.SerializerMethodField()

    class Meta:
        model = AuditEntry
        fields = ["id", "created_at", "actor", "team", "action", "target_type", "target_id", "message", "data"]

    def get_team(self, entry: AuditEntry) -> str | None:
        return entry.team.slug if entry.team_id else None


AUDIT_PARAMETERS = ("team", "action", "after", "before")


class AuditList(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("team", str), OpenApiParameter("action", str, enum=AuditEntry.Action.values),
                    OpenApiParameter("after", int, description="only entries newer than the one with this id, "
                                                               "oldest first (a poller passes the newest id it has "
                                                               "and pages on; without it: newest first)"),
                    before_parameter("entries")],
        responses={200: paginated(AuditOut), 400: ERROR},
        operation_id="audit_list",
        description="Entries of the teams the caller manages (all for an admin), plus the caller's own tokens. "
                    "Newest first: follow `next` to page, it continues after the last entry shown (`before`); "
                    "with `after`, oldest first by offset (entries only arrive at its end).",
    )
    def get(self, request):
        # A parameter the list does not take is named, not ignored: ?after=abc answered page one as
        # if it had filtered (trial 14, F32).
        query_strict(request, takes=AUDIT_PARAMETERS, what="the audit list", paged=True)
        after = None
        if raw_after := request.query_params.get("after", ""):
            # '²' passes isdigit, not int() (sec19, F6); past 4300 digits int() raises too (review32).
            if not (raw_after.isascii() and raw_after.isdigit()) or len(raw_after.lstrip("0")) > 19:
                return field_errors({"after": f"must be an audit entry id (a whole number), got {raw_after[:50]!r}"})
            after = int(raw_after)
        action = request.query_params.get("action") or None
        if action and action not in AuditEntry.Action.values:
            raise serializers.ValidationError({"action": [f"must be one of {', '.join(AuditEntry.Action.values)}"]})
        try:
            team = team_filter(user=request.user, slug=request.query_params.get("team") or None, managed=True)
        except FieldErrors as exc:
            return field_errors(exc.errors)
        entries = audit_list(user=request.user, team=team.slug if team else None, action=action)
        if after is not None:
            # Oldest first: newest first, a poller reading one page of many skipped the entries
            # between that page and its last id (manager trial 15, F5).
            entries = entries.filter(pk__gt=after).order_by("pk")
        if after is not None:
            if "before" in request.query_params:
                return field_errors({"before": "cannot be given with after= (oldest first, paged by offset): "
                                               "give one of the two"})
            paginator = ListPage()
            page = paginator.paginate_queryset(entries, request, view=self)
        else:
            paginator = NewestFirstPage(item="audit entry", ordering=("-created_at", "-id"))
            page = paginator.paginate_queryset(entries, request, view=self, cursor_scope=audit_list(user=request.user),
                                               not_found="no audit entry with that id that you may read")
        return paginator.get_paginated_response(AuditOut(page, many=True).data)
