"""RQ tasks on the ``notifications`` queue (run by ``manage.py notify_worker``).

1. :func:`fan_out` turns one job event into Delivery rows: the job owner's personal
   channels where their preferences want it, the job's team channels subscribed to it.
   Nothing reaches a channel of another user or team.
2. :func:`deliver` sends one Delivery; a failure is recorded and raised, and RQ retries
   it with backoff (``NOTIFY_RETRY_INTERVALS``) until the last try marks it failed. A try
   to be retried is one WARNING line; only the last one's error reaches RQ's log with its
   traceback (:class:`QuietRetries`).
3. :func:`catch_up` (not a task: the leading scheduler runs it every ``NOTIFY_CATCH_UP_S``)
   redoes what Redis lost: a job event committed while Redis was down queued no fan-out
   (hooks.enqueue logs and drops it), and a Delivery whose ``deliver`` could not be queued
   stays pending untried. Both steps are idempotent (one Delivery per channel and cause; a
   delivery is claimed before it is sent), so doing them again costs queries, not messages.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from rq import Retry

from apps.jobs.models import Job
from apps.quotas.selectors import user_gpu_hours_24h, user_quota_gpu_hours

from .hooks import NOTIFYING_KINDS, enqueue
from .models import Channel, Delivery, Event, NotificationPreference
from .senders import send

log = logging.getLogger(__name__)
FINAL_KINDS = {"succeeded", "failed", "timed_out"}


def preference_of(user) -> NotificationPreference:
    return NotificationPreference.objects.filter(user=user).first() or NotificationPreference(user=user)


def still_member(user, team) -> bool:
    """Whether ``user`` may still hear about ``team``'s work: an active account with a membership.
    Someone removed from a team (or deactivated) whose job was left running there heard its
    later events on their own channels (sec21's leftover, fixed in sec22)."""
    from apps.accounts.models import Membership

    return bool(user is not None and user.is_active and Membership.objects.filter(user=user, team=team).exists())


# The one event a departed owner still hears on their own channels: their job cancelled by someone
# else, which is what a removal does to their queued jobs ("cancelled by alice: its owner bob was
# removed from vision").
DEPARTED_HEAR = {Event.CANCELLED}


def event_for(kind: str, wait_s: float | None, late_minutes: int) -> str | None:
    if kind == "running":
        return Event.STARTED_LATE if wait_s is not None and wait_s > late_minutes * 60 else None
    return kind if kind in Event.values else None


def fan_out(job_id: str, kind: str, event_id: int, *, quota: bool = True) -> int:
    """Create and queue the deliveries one job event causes. Returns how many were queued.

    Only channels that existed when the event happened hear it: :func:`catch_up` runs this
    again minutes later, and a channel created since must not get the past (trial 14, F21).
    ``quota=False`` (the catch-up) skips the quota check, which reads the usage of *now*.
    """
    from apps.jobs.models import JobEvent

    job = Job.objects.select_related("team", "user").filter(pk=job_id).first()
    if job is None:
        return 0
    cancellation = None
    if kind == "cancelled":
        cancellation = cancelled_by_another(job)
        if cancellation is None:
            return 0
    recorded = JobEvent.objects.filter(pk=event_id).first()
    happened_at = recorded.created_at if recorded is not None else timezone.now()
    channels = Channel.objects.filter(enabled=True, created_at__lte=happened_at)
    wait_s = (job.started_at - job.queued_at).total_seconds() if job.started_at and job.queued_at else None
    preference = preference_of(job.user)
    # A sweep's trials are heard through the sweep's own message (one per trial was 25 messages
    # for a 24-trial sweep: trial 16, G18), unless their owner asked for them.
    trial = job.parent_id is not None
    member = still_member(job.user, job.team)
    wanted: list[tuple[Channel, str]] = []
    for channel in channels.filter(user=job.user) if not trial or preference.on_sweep_trials else ():
        event = event_for(kind, wait_s, preference.started_late_minutes)
        if event and preference.wants(event) and (member or event in DEPARTED_HEAR):
            wanted.append((channel, event))
    for channel in channels.filter(team=job.team) if not trial else ():
        event = event_for(kind, wait_s, channel.started_late_minutes)
        if event and event in (channel.events or []):
            wanted.append((channel, event))
    sweep = recorded if job.is_sweep and recorded is not None and kind in FINAL_KINDS else None
    # Why it was preempted, as its timeline says (an operator's drain names them and their reason).
    preemption = recorded.message if kind == "preempted" and recorded is not None else ""
    queued = sum(queue_delivery(channel, event, job=job, cause=f"event:{event_id}",
                                payload=job_payload(job, event, wait_s, cancellation=cancellation, sweep=sweep,
                                                    preemption=preemption))
                 for channel, event in wanted)
    if quota and kind in FINAL_KINDS and member:
        queued += quota_check(job, preference)
    return queued


def cancelled_by_another(job: Job) -> dict | None:
    """Who cancelled ``job`` and why (its cancel's event data), when that was not its owner; None
    for the owner's own cancel (they know) and for a sweep's trial (its sweep ends the story)."""
    from apps.jobs.models import JobEvent

    if job.parent_id:
        return None
    for data in JobEvent.objects.filter(job=job, kind__in=("cancelled", "cancel_requested")) \
            .order_by("-seq").values_list("data", flat=True):
        if "cancelled_by" in (data or {}):
            return None if data.get("by_owner") else data
    return None


def quota_check(job: Job, preference: NotificationPreference) -> int:
    """Tell the user once a day when their rolling 24 h GPU-hours pass their threshold."""
    if not preference.on_quota_nearly_used:
        return 0
    quota = user_quota_gpu_hours(user=job.user, team=job.team)
    if not quota:
        return 0
    used = user_gpu_hours_24h(user=job.user)
    if used < quota * preference.quota_percent / 100:
        return 0
    day = timezone.now().date().isoformat()
    payload = {"event": Event.QUOTA_NEARLY_USED, "user": job.user.username, "team": job.team.slug,
               "gpu_hours_24h": round(used, 3), "quota_gpu_hours_24h": quota,
               "message": f"You used {used:.1f} of your {quota:g} GPU-hours in the last 24 h "
                          f"({used / quota:.0%}) under team {job.team.slug}."}
    return sum(queue_delivery(channel, Event.QUOTA_NEARLY_USED, job=None, cause=f"quota:{job.user_id}:{day}",
                              payload=payload)
               for channel in Channel.objects.filter(user=job.user, enabled=True))


MESSAGES = {
    Event.SUCCEEDED: "{task} succeeded",
    Event.FAILED: "{task} failed",
    Event.TIMED_OUT: "{task} timed out",
    Event.PREEMPTED: "{task} was preempted and requeued",
    Event.STARTED_LATE: "{task} started after waiting {wait}",
    Event.CANCELLED: "{task} was cancelled by {by}{why}",
}


def job_payload(job: Job, event: str, wait_s: float | None, *, cancellation: dict | None = None,
                sweep=None, preemption: str = "") -> dict:
    """The message of one job event; ``sweep``: a sweep's final JobEvent, whose summary (trials
    completed, pruned and failed, the best trial, the registered version) it carries;
    ``preemption``: the ``preempted`` event's message, said after the message and as ``reason``
    (operator trial 29: a drain-and-requeue said neither who nor why)."""
    wait = f"{wait_s / 60:.0f} min" if wait_s is not None else "?"
    cancellation = cancellation or {}
    why = f": {cancellation['reason']}" if cancellation.get("reason") else ""
    payload = {
        "event": event,
        "message": MESSAGES[event].format(task=job.task_name, wait=wait, by=cancellation.get("cancelled_by"),
                                          why=why),
        "job": {"id": str(job.pk), "task_name": job.task_name, "team": job.team.slug, "user": job.user.username,
                "state": job.state, "attempt": job.attempt, "priority_class": job.priority_class,
                "error": (job.error.splitlines() or [""])[0][:500]},
    }
    if wait_s is not None and event == Event.STARTED_LATE:
        payload["wait_seconds"] = round(wait_s)
    if event == Event.CANCELLED:
        payload["cancelled_by"], payload["reason"] = cancellation.get("cancelled_by"), cancellation.get("reason", "")
    if event == Event.PREEMPTED and preemption:
        payload["reason"] = preemption.removeprefix("preempted: ")
        payload["message"] = f"{payload['message']}: {payload['reason']}"
    if sweep is not None:
        payload["message"] = f"{payload['message']}: {sweep.message}"
        payload["sweep"] = {key: value for key, value in (sweep.data or {}).items()
                            if key in ("trials", "completed", "pruned", "failed", "best", "model")}
    if settings.PORTAL_URL:
        payload["url"] = f"{settings.PORTAL_URL.rstrip('/')}/jobs/{job.pk}/"
    return payload


def retry_policy() -> Retry | None:
    intervals = list(settings.NOTIFY_RETRY_INTERVALS)
    return Retry(max=len(intervals), interval=intervals) if intervals else None


def queue_delivery(channel: Channel, event: str, *, job: Job | None, cause: str, payload: dict) -> int:
    """One Delivery per (channel, cause): a fan-out that RQ runs twice sends nothing twice."""
    try:
        with transaction.atomic():  # a savepoint: the refused insert must not spoil a caller's transaction
            delivery = Delivery.objects.create(channel=channel, event=event, job=job, cause=cause, payload=payload)
    except IntegrityError:
        return 0
    enqueue("apps.notifications.tasks.deliver", delivery.pk, retry=retry_policy(),
            job_timeout=settings.NOTIFY_TIMEOUT_S * 3 + 30)
    return 1


class DeliveryRetried(Exception):
    """A failed try that RQ will retry: :func:`deliver` logged it as one WARNING line, so the
    notify worker does not log it again as an error with its traceback (:class:`QuietRetries`)."""


class QuietRetries:
    """Mixed into the notify worker's RQ worker class: a retried delivery failure is one WARNING
    line (channel, attempt k of n, the error) from :func:`deliver`, not also RQ's ERROR with a
    traceback (manager trial 15, F24: ~25 lines per retry). The final failure raises the error
    itself, which RQ logs as before."""

    def handle_exception(self, job, *exc_info):
        if isinstance(exc_info[1], DeliveryRetried):
            return
        super().handle_exception(job, *exc_info)


def delivery_claim(delivery: Delivery) -> bool:
    """Count a try of a pending delivery as ours, if no other run counted one since we read it.

    :func:`catch_up` may queue a delivery a second time while the first is still waiting in
    a backlogged queue; two workers then hold it at once, and only the claim's winner sends.
    """
    claimed = Delivery.objects.filter(pk=delivery.pk, state=Delivery.State.PENDING,
                                      attempts=delivery.attempts).update(attempts=F("attempts") + 1)
    if claimed:
        delivery.attempts += 1
    return bool(claimed)


def departed_recipient(delivery: Delivery) -> str | None:
    """Why a personal delivery about a team's job must not go out now (its owner left the team, or
    their account was deactivated, since it was queued: retries run for minutes); None when it may."""
    channel, job = delivery.channel, delivery.job
    if channel.user_id is None or job is None or delivery.event in DEPARTED_HEAR:
        return None
    if still_member(channel.user, job.team):
        return None
    return f"not sent: {channel.user.get_username()} is no longer a member of {job.team.slug}"


def deliver(delivery_id: int) -> str:
    delivery = Delivery.objects.select_related("channel__user", "job__team").filter(pk=delivery_id).first()
    if delivery is None or delivery.state != Delivery.State.PENDING:
        return delivery.state if delivery else "gone"
    if not delivery_claim(delivery):
        return "claimed by another run"
    if departed := departed_recipient(delivery):
        Delivery.objects.filter(pk=delivery.pk).update(state=Delivery.State.FAILED, last_error=departed)
        return Delivery.State.FAILED
    try:
        status = send(delivery)
    except Exception as exc:
        intervals = list(settings.NOTIFY_RETRY_INTERVALS)
        last = delivery.attempts > len(intervals)
        Delivery.objects.filter(pk=delivery.pk).update(
            last_error=str(exc)[:2000], response_status=getattr(exc, "status", None),
            state=Delivery.State.FAILED if last else Delivery.State.PENDING)
        tries = f"attempt {delivery.attempts} of {len(intervals) + 1}"
        if last:
            log.warning("delivery %s to %s failed (%s, giving up): %s", delivery.pk, delivery.channel, tries, exc)
            raise
        log.warning("delivery %s to %s failed (%s, next in %s s): %s", delivery.pk, delivery.channel, tries,
                    intervals[delivery.attempts - 1], exc)
        raise DeliveryRetried(str(exc)) from exc
    Delivery.objects.filter(pk=delivery.pk).update(state=Delivery.State.SENT, sent_at=timezone.now(),
                                                   response_status=status, last_error="")
    return Delivery.State.SENT


# An event's own fan-out, and a delivery's first try, have had this long before catch_up
# steps in: under normal load both run within seconds, and doing them again costs queries.
CATCH_UP_AFTER_S = 120.0


def catch_up(since, until) -> dict:
    """Fan out the notifying job events, and queue the untried deliveries, created in
    [since, until): what a fan-out or a ``deliver`` lost to Redis being down left undone.

    The caller (the scheduler's chores) moves the window on from where it ended, lagging
    :data:`CATCH_UP_AFTER_S` behind the clock; after a restart it starts an hour back.
    A channel hears only the events after its creation (see :func:`fan_out`), and the
    quota check is left to the next final event's own fan-out (it reads today's usage, not
    the event's), so what this creates is only what no fan-out had made.
    """
    from apps.core.redis_client import redis_client
    from apps.jobs.models import JobEvent

    redis_client().ping()  # still down: raise, so that the caller keeps the window for next time
    # Read before the fan-outs below add (already queued) deliveries of their own.
    untried = list(Delivery.objects.filter(state=Delivery.State.PENDING, attempts=0, created_at__gte=since,
                                           created_at__lt=until).values_list("pk", flat=True))
    events = list(JobEvent.objects.filter(kind__in=NOTIFYING_KINDS, created_at__gte=since, created_at__lt=until)
                  .values_list("job_id", "kind", "id"))
    fanned = sum(fan_out(str(job_id), kind, event_id, quota=False) for job_id, kind, event_id in events)
    for pk in untried:
        enqueue("apps.notifications.tasks.deliver", pk, retry=retry_policy(),
                job_timeout=settings.NOTIFY_TIMEOUT_S * 3 + 30)
    return {"events": len(events), "deliveries_created": fanned, "deliveries_requeued": len(untried)}


def prune_old(days: int = 90) -> int:
    """The delivery log keeps ``days`` days (the scheduler's chores call this)."""
    return Delivery.objects.filter(created_at__lt=timezone.now() - timedelta(days=days)).delete()[0]
