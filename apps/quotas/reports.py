"""Usage reports: per team or per user over a period, from the ledger and the job rows.

A user's row is one per (team, user): what a user in two teams used is charged to each team
apart and limited by each team's quota, so their rows say which team (``team``) and the
quota in force there (manager trial 14, F12: one row per user, its quota always null).

Scope: a team's totals are visible to its members (as the usage page always showed);
per-user rows to the user themselves, and to the managers of the teams the usage was
charged to (only that team's part); superusers see everything.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime

from django.db.models import Count, Q, Sum

from apps.accounts.selectors import managed_team_ids, team_ids
from apps.jobs.models import TERMINAL_STATES, Job, JobEvent

from .models import UsageRecord
from .selectors import user_quota_gpu_hours

GROUPS = ("team", "user")
FAILURE_KINDS = ("failed", "retry")  # attempts that failed, retried or not
# The columns of a team's row; a user's row has ``team`` after its key (:func:`columns`).
COLUMNS = ("key", "gpu_hours", "jobs_succeeded", "jobs_failed", "jobs_timed_out", "jobs_cancelled",
           "jobs_started", "wait_mean_s", "wait_p95_s", "failures", "preemptions", "quota_gpu_hours_per_user_day")


def columns(group: str) -> tuple[str, ...]:
    """A row's columns for ``group``, its key (the team's slug or the user's name) first."""
    return COLUMNS if group == "team" else (COLUMNS[0], "team", *COLUMNS[1:])


@dataclass
class ReportRow:
    key: str
    team: str | None = None  # a user's row: the team its usage was charged to
    gpu_hours: float = 0.0
    jobs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TERMINAL_STATES, 0))
    jobs_started: int = 0
    wait_mean_s: float | None = None
    wait_p95_s: float | None = None
    failures: int = 0
    preemptions: int = 0
    quota_gpu_hours_per_user_day: float | None = None

    def flat(self) -> dict:
        row = asdict(self)
        for state, n in row.pop("jobs").items():
            row[f"jobs_{state}"] = n
        return {column: row[column] for column in columns("team" if self.team is None else "user")}


def visible(user, group: str) -> Q:
    """Rows (with ``team_id``/``user_id`` fields) the caller may count."""
    if user.is_superuser:
        return Q()
    if group == "team":
        return Q(team_id__in=team_ids(user=user))
    return Q(team_id__in=managed_team_ids(user=user)) | Q(team_id__in=team_ids(user=user), user_id=user.pk)


def p95(values: list[float]) -> float | None:
    """Nearest-rank 95th percentile."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def usage_report(*, user, start: datetime, end: datetime, group: str, team=None) -> list[ReportRow]:
    """One row per team (or per team and user) with any activity in [start, end), plus the
    caller's teams; each with the per-member quota in force for its team. With ``team`` (one the caller may read, :func:`apps.accounts.selectors.team_filter`) only
    what was charged to it.

    GPU-hours: ledger records whose attempt ended in the period. Jobs by outcome: jobs
    that finished in it. Wait: submit → first start of jobs first started in it. Failures
    and preemptions: attempt events in it.
    """
    if group not in GROUPS:
        raise ValueError(group)
    from apps.accounts.models import Team

    # A row's identity: the team's slug, or (team slug, user name).
    keys = ("team__slug",) if group == "team" else ("team__slug", "user__username")
    scope = visible(user, group)
    if team is not None:
        scope &= Q(team_id=team.pk)
    rows: dict[tuple[str, ...], ReportRow] = {}

    def row(*names: str) -> ReportRow:
        if group == "team":
            return rows.setdefault(names, ReportRow(key=names[0]))
        return rows.setdefault(names, ReportRow(key=names[1], team=names[0]))

    if group == "team":
        for shown in Team.objects.filter(id__in=[team.pk] if team is not None else team_ids(user=user)):
            row(shown.slug)

    ledger = (UsageRecord.objects.filter(scope, ended_at__gte=start, ended_at__lt=end).order_by()
              .values_list(*keys).annotate(s=Sum("gpu_seconds")))
    for *names, seconds in ledger:
        row(*names).gpu_hours = round((seconds or 0.0) / 3600, 4)

    finished = (Job.objects.filter(scope, state__in=TERMINAL_STATES, finished_at__gte=start, finished_at__lt=end)
                .order_by().values_list(*keys, "state").annotate(n=Count("id")))
    for *names, state, n in finished:
        row(*names).jobs[state] = n

    waits: dict[tuple[str, ...], list[float]] = {}
    for *names, created, started in (Job.objects.filter(scope, first_started_at__gte=start, first_started_at__lt=end)
                                     .values_list(*keys, "created_at", "first_started_at")):
        waits.setdefault(tuple(names), []).append(max(0.0, (started - created).total_seconds()))
    for names, values in waits.items():
        r = row(*names)
        r.jobs_started = len(values)
        r.wait_mean_s = round(sum(values) / len(values), 1)
        r.wait_p95_s = round(p95(values), 1)

    event_scope = Q(job__in=Job.objects.filter(scope).values("pk"))
    events = (JobEvent.objects.filter(event_scope, created_at__gte=start, created_at__lt=end,
                                      kind__in=(*FAILURE_KINDS, "preempted"))
              .order_by().values_list(*(f"job__{key}" for key in keys), "kind").annotate(n=Count("id")))
    for *names, kind, n in events:
        if kind == "preempted":
            row(*names).preemptions += n
        else:
            row(*names).failures += n

    # The per-member quota in force for each row's team (the same for every member of a team).
    quotas = {shown.slug: user_quota_gpu_hours(user=None, team=shown)
              for shown in Team.objects.filter(slug__in={names[0] for names in rows})}
    for names, r in rows.items():
        r.quota_gpu_hours_per_user_day = quotas.get(names[0])
    return sorted(rows.values(), key=lambda r: (-r.gpu_hours, r.key, r.team or ""))


DEFAULT_DAYS = 7


# Usage is counted from the service's records: dates outside these years are typing errors (and
# 0001-01-01 or 9999-12-31 leave Python's calendar once a day is added or taken).
MIN_YEAR, MAX_YEAR = 1970, 9000


def period_parse(raw_from: str | None, raw_to: str | None, *, now: datetime) -> tuple[datetime, datetime]:
    """``from``/``to`` as ISO dates (whole days, ``to`` inclusive) or datetimes; default the last 7 days."""
    from datetime import date, timedelta

    from django.utils import timezone
    from django.utils.dateparse import parse_date, parse_datetime

    from apps.core.errors import FieldErrors

    def parse(name: str, raw: str, end: bool) -> datetime:
        out_of_range = f"{raw!r} is out of range: give a date from {MIN_YEAR}-01-01 to {MAX_YEAR}-12-31"
        moment = day = None
        try:
            # A bare date is a whole day (parse_datetime would read it as midnight).
            day = parse_date(raw)
            moment = None if day else parse_datetime(raw)
        except ValueError:
            pass
        if moment is None and day is None:
            raise FieldErrors({name: f"{raw!r} is not an ISO date (2026-01-31) or date-time"})
        # The year checked is the one given: a date's end is the next midnight, so "to=0001-01-01"
        # was refused as "0001-01-02" and "to=9000-12-31", inside the range, as 9001 (trial28).
        if not MIN_YEAR <= (day or moment).year <= MAX_YEAR:
            raise FieldErrors({name: out_of_range})
        if moment is None:
            assert isinstance(day, date)
            moment = datetime.combine(day, datetime.min.time())
        if end and day is not None:
            moment += timedelta(days=1)
        return moment if timezone.is_aware(moment) else timezone.make_aware(moment)

    end = parse("to", raw_to, True) if raw_to else now
    start = parse("from", raw_from, False) if raw_from else None
    if start is None:
        start = end - timedelta(days=DEFAULT_DAYS)
    if start >= end:
        raise FieldErrors({"from": "must be before 'to'"})
    if end - start > timedelta(days=3660):
        raise FieldErrors({"from": "the period may span at most 10 years"})
    return start, end


@dataclass
class PageReport:
    """What a page (portal usage, admin report) shows for its query string."""

    group: str
    start: datetime
    end: datetime
    rows: list[dict]
    errors: dict[str, str]
    team: str = ""  # the one team asked for (``?team=``), "" for all the caller's


def report_for_page(params, *, user, now: datetime) -> PageReport:
    """The report for ``params`` (a QueryDict): an unknown group shows teams, a bad period the
    default one with the error beside it (the API answers both with a 400 instead).

    ``?team=`` keeps it to one of the caller's teams, as the API does; a team the caller is not
    in is a 404 saying so, as the pages answer for anything of another team (it was ignored: the
    page showed the caller's own teams under a robotics URL, trial 14 F32)."""
    from django.http import Http404

    from apps.accounts.selectors import team_filter
    from apps.core.errors import FieldErrors

    try:
        team = team_filter(user=user, slug=params.get("team") or None)
    except FieldErrors as exc:
        raise Http404(f"team: {exc.errors['team']}") from None
    group = params.get("group") if params.get("group") in GROUPS else "team"
    errors: dict[str, str] = {}
    try:
        start, end = period_parse(params.get("from") or None, params.get("to") or None, now=now)
    except FieldErrors as exc:
        errors = exc.errors
        start, end = period_parse(None, None, now=now)
    rows = [row.flat() for row in usage_report(user=user, start=start, end=end, group=group, team=team)]
    return PageReport(group=group, start=start, end=end, rows=rows, errors=errors, team=team.slug if team else "")
