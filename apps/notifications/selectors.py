"""Reads, scoped: a user sees their own channels and the channels of teams they manage,
and the deliveries to those channels (the delivery log)."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from apps.accounts.selectors import managed_team_ids

from .models import Channel, Delivery


def channel_list(*, user) -> QuerySet[Channel]:
    return Channel.objects.filter(Q(user=user) | Q(team_id__in=managed_team_ids(user=user))).select_related("team")


def delivery_list(*, user) -> QuerySet[Delivery]:
    return Delivery.objects.filter(channel__in=channel_list(user=user)).select_related("channel", "channel__team",
                                                                                       "job")
