"""The live pass at queue scale: what it reads of queued jobs and how it writes their positions back."""

from __future__ import annotations

import gc
import re
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.jobs.models import QUEUE_INFO_FIELDS, Job, JobState
from apps.jobs.services import QUEUE_INFO_CHUNK, job_cancel, job_class_set, job_queue_info_set
from apps.scheduling.inputs import QueueRows, cluster_state
from apps.scheduling.leader import LeaderLease, LeadershipLost
from apps.scheduling.loop import plan_and_start
from tests.jobs.bulk import insert_jobs

from .test_inputs import finish, submit

pytestmark = pytest.mark.django_db


def job_updates(queries) -> list[str]:
    """The statements that wrote jobs rows (an executemany is logged once, as "N times: UPDATE …")."""
    return [q["sql"] for q in queries.captured_queries if 'UPDATE "jobs_job"' in q["sql"]]


def job_writes(queries) -> list[tuple[int, tuple[str, ...]]]:
    """(rows, columns set) of each statement that wrote jobs rows: an executemany on SQLite
    ("N times: UPDATE … SET "c" = %s …"), one UPDATE … FROM (VALUES …) on PostgreSQL."""
    out = []
    for sql in job_updates(queries):
        columns = tuple(re.findall(r'"(\w+)" = (?:%s|v\.c\d+)', sql.split(" WHERE ")[0]))
        times = re.match(r"(\d+) times: ", sql)
        out.append((int(times.group(1)) if times else sql.count("::uuid)"), columns))
    return sorted(out)


def queue_behind_a_long_job(alice, bob, waiting: int):
    """A 50-epoch 2-GPU job running on the one node and ``waiting`` 2-GPU jobs queued behind it,
    planned and written once: (now, the queued jobs by id, the plan's queue entries)."""
    from apps.scheduling import policy
    from apps.scheduling.loop import queue_update

    submit(bob, epochs=50, resources={"gpu": 2})
    for k in range(waiting):
        submit(alice if k % 2 else bob, epochs=5 + k, resources={"gpu": 2})
    now = timezone.now()
    plan_and_start(now)
    state, jobs_by_id = cluster_state(now)
    entries = policy.plan(state, now.timestamp()).queue
    assert len(entries) == waiting and queue_update(entries, jobs_by_id, now) == 0  # nothing changed
    return now, jobs_by_id, entries


def test_one_arrival_ahead_rewrites_every_position_in_one_statement(alice, bob, demo_registered, node):
    """node-a has 2 GPUs: one 2-GPU job runs, twelve wait. A high-priority arrival moves every
    waiting job back one place: all twelve rows are written, as one statement, not twelve."""
    jobs = [submit(alice if k % 2 else bob, epochs=5 + k, resources={"gpu": 2}) for k in range(13)]
    plan_and_start()
    waiting = Job.objects.filter(state=JobState.QUEUED)
    before = {j.pk: j.queue_position for j in waiting}
    assert len(before) == 12 and sorted(before.values()) == list(range(1, 13))

    first = submit(alice, epochs=1, resources={"gpu": 2}, priority="high")
    with CaptureQueriesContext(connection) as queries:
        plan_and_start()
    assert gc.isenabled()  # the pass pauses the cyclic collector (policy.gc_paused) and restores it
    assert job_writes(queries) == [(13, QUEUE_INFO_FIELDS)]
    after = {j.pk: j.queue_position for j in Job.objects.filter(state=JobState.QUEUED)}
    assert after.pop(first.pk) == 1
    assert after == {pk: position + 1 for pk, position in before.items()}
    assert len(jobs) == 13


def test_a_pass_reads_and_writes_with_queries_constant_in_the_queue_length(alice, bob, demo_registered, node):
    """A field of a queued job that the pass loads lazily, or a row written alone, would cost a
    query per queued job: the same pass over 4 and over 24 waiting jobs runs as many queries,
    but for the write-back's, which is one statement per shape of row (whole rows; positions
    and reasons alone) however many rows."""

    def pass_queries() -> int:
        submit(alice, epochs=1, resources={"gpu": 2}, priority="high")  # moves every waiting job
        with CaptureQueriesContext(connection) as queries:
            plan_and_start()
        writes = job_updates(queries)
        assert 1 <= len(writes) <= 2, writes
        return len(queries.captured_queries) - 3 * len(writes)  # each in a savepoint of its own

    submit(bob, epochs=50, resources={"gpu": 2})  # runs: the rest wait behind it
    for k in range(4):
        submit(bob, epochs=5 + k, resources={"gpu": 2})
    plan_and_start()
    small = pass_queries()
    for k in range(20):
        submit(alice if k % 2 else bob, epochs=10 + k, resources={"gpu": 2})
    plan_and_start()
    assert pass_queries() == small


def queued_rows_read(queries) -> list[str]:
    """The statements that read queued jobs' rows (the queue read loads the planner's fields)."""
    return [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")
            and '"jobs_job"."queue_position"' in q["sql"] and '"jobs_job"."state" = \'queued\'' in q["sql"]]


def arrival_rows_read(queries) -> list[str]:
    """The statements that read recent arrivals' rows (by pk; a whole read filters on the day)."""
    return [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")
            and 'AS "team_slug"' in q["sql"] and '"jobs_job"."state"' not in q["sql"]]


def test_a_kept_queue_reads_only_new_and_changed_rows_and_equals_a_whole_read(alice, bob, demo_registered, node):
    """A scheduler keeps its queue between passes (QueueRows). After each kind of change
    another process makes to the queue, its next pass reads only the rows that changed, and
    what it plans from — every request, the recent arrivals (the ETAs' inflow) and the
    planner's fields it compares with — is what reading the whole queue gives."""
    rows = QueueRows()
    submit(bob, epochs=50, resources={"gpu": 2})  # runs: the rest wait behind it
    for k in range(6):
        submit(alice if k % 2 else bob, epochs=5 + k, resources={"gpu": 2})
    for k in range(3):
        finish(submit(bob, epochs=5), runtime_s=100.0 * (k + 1))  # a runtime model to estimate with
    plan_and_start(rows=rows)

    def waiting() -> Job:
        return Job.objects.filter(state=JobState.QUEUED).order_by("created_at").last()

    def check(change, reads: int, arrivals: int | None = None):
        change()
        now = timezone.now()
        with CaptureQueriesContext(connection) as queries:
            kept, kept_jobs = cluster_state(now, rows)
        assert len(queued_rows_read(queries)) == reads, queued_rows_read(queries)
        assert len(arrival_rows_read(queries)) == (reads if arrivals is None else arrivals), arrival_rows_read(queries)
        whole, whole_jobs = cluster_state(now)
        assert sorted(kept.queued, key=lambda r: r.job_id) == sorted(whole.queued, key=lambda r: r.job_id)
        assert kept.inflow == whole.inflow and len(kept.inflow) == Job.objects.count()
        assert {pk: {f: getattr(j, f) for f in QUEUE_INFO_FIELDS} for pk, j in kept_jobs.items()} == {
            pk: {f: getattr(j, f) for f in QUEUE_INFO_FIELDS} for pk, j in whole_jobs.items()}
        plan_and_start(rows=rows)  # and writes the new positions back, which the kept rows hold

    check(lambda: None, reads=0)
    check(lambda: submit(alice, epochs=1, resources={"gpu": 2}, priority="high"), reads=1)  # every position moves
    check(lambda: job_class_set(waiting(), priority_class="low", by=alice), reads=1)
    check(lambda: Job.objects.filter(pk=waiting().pk).update(gpus=1), reads=1)  # a superuser's edits
    check(lambda: Job.objects.filter(pk=waiting().pk).update(timeout_s=600), reads=1)
    check(lambda: job_cancel(job=waiting(), by=alice), reads=0)
    # a new job that succeeded (an arrival, not queued) and a new model: estimates made again
    check(lambda: finish(submit(alice, epochs=7), runtime_s=900.0), reads=0, arrivals=1)
    assert rows.rows and rows.arrival_rows, "the rows were kept"


def test_a_kept_queue_is_read_whole_again_by_a_new_leader_and_after_a_failed_pass(alice, demo_registered, node):
    """Kept rows are trusted only across one leader's passes that ended well: under a new
    token another scheduler may have written the planner's fields, and a pass that failed
    may have half written them."""
    rows = QueueRows()
    for k in range(4):
        submit(alice, epochs=5 + k, resources={"gpu": 2})  # one runs, three wait
    lease = LeaderLease("a", ttl_s=10)
    assert lease.hold()

    def whole_reads(token) -> int:
        with CaptureQueriesContext(connection) as queries:
            plan_and_start(token=token, rows=rows)
        return len([sql for sql in queued_rows_read(queries) if " IN (" not in sql.split("WHERE")[1]])

    assert whole_reads(lease.token) == 1
    assert whole_reads(lease.token) == 0
    lease.release()
    assert lease.hold()
    assert whole_reads(lease.token) == 1
    assert whole_reads(lease.token) == 0
    stale = lease.token
    lease.release()
    assert LeaderLease("b", ttl_s=10).hold()
    with pytest.raises(LeadershipLost):
        plan_and_start(token=stale, rows=rows)
    assert not rows.rows


def test_a_burst_that_reads_the_whole_queue_replaces_every_kept_row(alice, bob, teams, demo_registered, node,
                                                                    monkeypatch):
    """What the key leaves out (a team's renamed slug) is seen at the next whole read: also one
    made because many rows were new at once, which restarts the re-read clock."""
    from apps.scheduling import inputs

    rows = QueueRows()
    submit(bob, epochs=50, resources={"gpu": 2})
    for k in range(3):
        submit(alice, epochs=5 + k, resources={"gpu": 2})
    plan_and_start(rows=rows)
    teams["vision"].__class__.objects.filter(pk=teams["vision"].pk).update(slug="vision-2")
    monkeypatch.setattr(inputs, "BY_PK_AT_MOST", 2)
    for k in range(3):
        submit(bob, epochs=9 + k, resources={"gpu": 2})
    state, _ = cluster_state(timezone.now(), rows)
    assert len(state.queued) == 6 and {r.team for r in state.queued} == {"vision-2"}


def test_a_kept_queue_estimates_again_after_a_success_even_with_no_model(alice, demo_registered, node):
    """No training job has succeeded (no fitted model), so a val job's estimate is the median
    of finished val jobs: once some finish, the kept row has it too (before, the mode's stated default)."""
    from apps.scheduling.estimates import MODE_DEFAULT_RUNTIME_S

    from .test_inputs import as_val

    rows = QueueRows()
    val = as_val(submit(alice, epochs=3))
    state, _ = cluster_state(timezone.now(), rows)
    assert [r.walltime_s for r in state.queued] == [MODE_DEFAULT_RUNTIME_S["val"]]
    for runtime in (40.0, 60.0, 50.0):
        finish(as_val(submit(alice, epochs=3)), runtime_s=runtime)
    state, _ = cluster_state(timezone.now(), rows)
    assert [(r.job_id, r.walltime_s) for r in state.queued] == [(str(val.pk), 50.0)]


def test_queue_info_is_written_only_to_queued_rows_as_the_orm_would_write_it(alice, demo_registered, node):
    waiting, started, third = (submit(alice, epochs=e) for e in (3, 4, 5))
    Job.objects.filter(pk=started.pk).update(state=JobState.RUNNING, reason="its own")
    at = datetime(2026, 12, 2, 9, 30, 15, 250000, tzinfo=UTC)
    values = {
        "queue_position": 7, "estimated_start_at": at, "estimated_start_low_at": at - timedelta(minutes=5),
        "estimated_start_high_at": None, "reason": "waiting for 1 GPU on one node; expected 09:30 UTC",
        "priority_score": 1234.567, "priority_factors": {"fairshare": 0.5, "age": 0.25, "size": 1.0, "class": 0.667},
        "predicted_start_at": at, "predicted_model_start_at": at + timedelta(seconds=1),
    }
    assert job_queue_info_set([(waiting.pk, values), (started.pk, values)]) == 1
    waiting.refresh_from_db()
    assert {name: getattr(waiting, name) for name in values} == values
    started.refresh_from_db()
    assert started.reason == "its own" and started.queue_position is None
    # More rows than a chunk: every one written (one transaction per chunk).
    insert_jobs(QUEUE_INFO_CHUNK + 2, owners=[(third.team, alice)], queued_every=1)
    many = [(pk, {**values, "queue_position": k}) for k, pk in
            enumerate(Job.objects.filter(state=JobState.QUEUED).order_by("created_at").values_list("pk", flat=True))]
    assert len(many) > QUEUE_INFO_CHUNK and job_queue_info_set(many) == len(many)
    assert dict(Job.objects.filter(state=JobState.QUEUED).values_list("pk", "queue_position")) == {
        pk: written["queue_position"] for pk, written in many}
    assert job_queue_info_set([]) == 0


def test_a_row_whose_only_news_is_its_position_gets_only_its_position_and_reason(alice, bob, demo_registered, node):
    """After an arrival at the head of a long queue most rows only move down a place (their
    ETAs move by less than their slack): those are written as positions and reasons ("behind
    N higher-priority jobs") alone, in one statement; a row with other news is written whole,
    and so is one whose reason names another clock time than its stored ETA's."""
    from dataclasses import replace

    from apps.scheduling.loop import CLOCK_IN_REASON, queue_update

    now, jobs_by_id, entries = queue_behind_a_long_job(alice, bob, 5)
    assert all(CLOCK_IN_REASON.search(e.reason) for e in entries)  # "…; expected 14:20 UTC"

    def other_clock(match) -> str:
        return "00:01 UTC" if match.group(0) == "00:00 UTC" else "00:00 UTC"

    # Built on the stored reasons: the first pass's plan (plan_and_start) and this one differ by
    # the milliseconds between them, so an ETA near a minute's edge can name the next minute in
    # the entry while the stored reason kept the previous one (no news for the write-back, which
    # compares reasons without their clock times) — then a row meant as position-only had another
    # clock time and was written whole (a PostgreSQL CI run failed so, once).
    stored_reason = {e.job_id: jobs_by_id[e.job_id].reason for e in entries}
    moved = [replace(e, position=e.position + 1, reason=stored_reason[e.job_id]) for e in entries[:2]]
    moved.append(replace(entries[2], position=entries[2].position + 1,
                         reason=f"behind 9 jobs; {stored_reason[entries[2].job_id]}"))
    moved.append(replace(entries[3], position=entries[3].position + 1,
                         reason=CLOCK_IN_REASON.sub(other_clock, stored_reason[entries[3].job_id])))  # within the ETA's slack
    moved.append(replace(entries[4], position=entries[4].position + 1, priority=entries[4].priority + 10))
    with CaptureQueriesContext(connection) as queries:
        assert queue_update(moved, jobs_by_id, now) == 5
    assert job_writes(queries) == [(2, QUEUE_INFO_FIELDS), (3, ("queue_position", "reason"))]
    stored = {str(pk): (position, reason, score) for pk, position, reason, score in Job.objects.filter(
              state=JobState.QUEUED).values_list("pk", "queue_position", "reason", "priority_score")}
    assert stored == {e.job_id: (e.position, e.reason, round(e.priority, 3)) for e in moved}


def test_an_eta_that_drifts_by_less_than_its_slack_is_not_rewritten_and_one_that_moves_is(alice, bob, demo_registered,
                                                                                          node):
    """A waiting job's stored ETA and reason stand while the new ETA is within ETA_SLACK_S or
    ETA_SLACK_FRACTION of the time still to wait (a far ETA drifting by minutes, a reason's clock
    rolling over a minute); a move beyond that is written, reason and all."""
    from dataclasses import replace

    from apps.scheduling.loop import ETA_SLACK_FRACTION, queue_update

    now, jobs_by_id, entries = queue_behind_a_long_job(alice, bob, 6)
    last = entries[-1]
    stored = Job.objects.get(pk=last.job_id)
    wait_s = last.estimated_start - now.timestamp()
    assert wait_s > 3600 and stored.reason.endswith(" UTC")  # "…; expected 14:20 UTC": a clock time in it

    def moved(by_s: float) -> list:
        """Every waiting job as planned, the last one's ETA (range and the reason's clock) moved by ``by_s``."""
        at = last.estimated_start + by_s
        text = stored.reason.rsplit("expected ", 1)[0] + f"expected {time_text(at)}"
        return [*entries[:-1], replace(last, estimated_start=at, estimated_start_low=last.estimated_start_low + by_s,
                                       estimated_start_high=last.estimated_start_high + by_s, reason=text)]

    small = 0.5 * ETA_SLACK_FRACTION * wait_s  # minutes: more than the fixed 30 s, and the clock moves
    assert small > 120 and time_text(last.estimated_start + small) != time_text(last.estimated_start)
    assert queue_update(moved(small), jobs_by_id, now) == 0
    assert Job.objects.get(pk=last.job_id).estimated_start_at == stored.estimated_start_at

    large = 2 * ETA_SLACK_FRACTION * wait_s
    assert queue_update(moved(large), jobs_by_id, now) == 1
    written = Job.objects.get(pk=last.job_id)
    assert written.estimated_start_at.timestamp() == pytest.approx(last.estimated_start + large, abs=1e-3)
    assert written.reason.endswith(time_text(last.estimated_start + large)) and written.reason != stored.reason


def time_text(t: float) -> str:
    from apps.scheduling.policy.explain import fmt_time

    return fmt_time(t, t - 60)


def reference_writes(entries, jobs_by_id, now: datetime) -> list:
    """What queue_update writes, decided the plain way (the comparison it made until 3 December,
    kept here as the oracle): each entry's new values as the datetimes and dicts that would be
    stored, compared field by field with the stored job."""
    from apps.scheduling.loop import CLOCK_IN_REASON, ETA_SLACK_FRACTION, ETA_SLACK_S, PRIORITY_SLACK, queue_row

    def same_eta(old, new) -> bool:
        if old is None or new is None:
            return old is new
        slack = max(ETA_SLACK_S, ETA_SLACK_FRACTION * (old - now).total_seconds())
        return abs((old - new).total_seconds()) < slack

    def same_reason(old: str, new: str, eta) -> bool:
        return old == new or (eta is not None and CLOCK_IN_REASON.sub("", old) == CLOCK_IN_REASON.sub("", new))

    eta_fields = ("estimated_start_at", "estimated_start_low_at", "estimated_start_high_at")
    exact_fields = ("priority_factors", "predicted_start_at", "predicted_model_start_at")
    decided = []  # (job, what is written: None, the position and reason, or every field)
    for entry in entries:
        job = jobs_by_id[entry.job_id]
        new = queue_row(job, entry)  # the values written; the decision below is the plain one
        eta = new["estimated_start_at"]
        written = new
        if (all(getattr(job, f) == new[f] for f in exact_fields)
                and abs(job.priority_score - new["priority_score"]) < PRIORITY_SLACK
                and all(same_eta(getattr(job, f), new[f]) for f in eta_fields)):
            if job.queue_position == entry.position and same_reason(job.reason, new["reason"], eta):
                written = None
            elif CLOCK_IN_REASON.findall(job.reason) == CLOCK_IN_REASON.findall(new["reason"]):
                written = {"queue_position": entry.position, "reason": new["reason"]}
        decided.append([job, new, written])
    # Neighbours in order in the pass are stored in order (trial25 F1): both rewritten, until settled.
    changed = True
    while changed:
        changed = False
        for before, row in pairwise(decided):
            points = [r[1]["estimated_start_at"] for r in (before, row)]
            shown = [r[1]["estimated_start_at"] if r[2] is r[1] else r[0].estimated_start_at for r in (before, row)]
            if None not in points and points[0] <= points[1] and shown[0] > shown[1]:
                for r in (before, row):
                    if r[2] is not r[1]:
                        r[2], changed = r[1], True
    return sorted((str(job.pk), sorted(written.items())) for job, _, written in decided if written is not None)


def test_queue_update_writes_what_the_plain_comparison_would(alice, bob, demo_registered, node, monkeypatch):
    """queue_update decides each row on floats (``loop._news``), making datetimes and dicts only
    for the rows it writes; against the plain comparison (:func:`reference_writes`) every
    perturbation of a stored row — each field, near each slack's edge and on it to the
    microsecond's rounding, None against a value either way, a reason's clock times without an
    ETA, the model's point alone — writes the same rows with the same values."""
    import copy
    import random
    from dataclasses import replace

    from apps.scheduling import loop
    from apps.scheduling.loop import ETA_SLACK_FRACTION, ETA_SLACK_S, PRIORITY_SLACK, queue_update

    # _news compares these fields one by one: a new one must be added there (and above).
    assert QUEUE_INFO_FIELDS == ("queue_position", "estimated_start_at", "estimated_start_low_at",
                                 "estimated_start_high_at", "reason", "priority_score", "priority_factors",
                                 "predicted_start_at", "predicted_model_start_at")

    now, jobs_by_id, entries = queue_behind_a_long_job(alice, bob, 6)
    now_s = now.timestamp()
    rng = random.Random(7)

    def perturbed(entry, stored: dict):
        if rng.random() < 0.5:  # most rows of a pass have no news: some passes then write nothing
            return entry
        field = rng.choice(["eta", "low", "high", "near", "edge", "priority", "factor", "position", "reason_clock",
                            "reason", "none", "model", "stored_none", "no_eta_clock", "model_only", "nothing"])
        no_eta = {"estimated_start": None, "estimated_start_low": None, "estimated_start_high": None}
        if field in ("stored_none", "no_eta_clock", "model_only"):  # a stored row without an ETA
            job = stored[entry.job_id] = copy.copy(stored[entry.job_id])
            job.estimated_start_at = job.estimated_start_low_at = job.estimated_start_high_at = None
            if field == "stored_none":  # ... given one now
                return entry
            if field == "model_only":  # ... and without a first ETA: the model's point alone sets it
                job.predicted_start_at = job.predicted_model_start_at = None
                return replace(entry, **no_eta, estimated_start_model=now_s + 600)
            # ... still without one, its reason's clock times moved: compared as they are
            job.reason = entry.reason + " until 12:00 UTC"
            return replace(entry, **no_eta, estimated_start_model=None,
                           reason=entry.reason + rng.choice([" until 12:00 UTC", " until 13:00 UTC"]))
        if field == "near":  # a stored ETA 5 minutes away: the fixed ETA_SLACK_S applies
            job = stored[entry.job_id] = copy.copy(stored[entry.job_id])
            job.estimated_start_at = now + timedelta(seconds=300)
            by = rng.choice([0.5, 0.99999, 1.0, 1.00001, 2])
            return replace(entry, estimated_start=now_s + 300 + rng.choice([-1, 1]) * ETA_SLACK_S * by)
        if field == "edge":  # on the slack's edge to within the rounding of the microsecond stored
            job = stored[entry.job_id] = copy.copy(stored[entry.job_id])
            job.estimated_start_at = now + timedelta(seconds=rng.choice([300, 86_400 + 0.123457]))
            old = job.estimated_start_at.timestamp()
            slack = max(ETA_SLACK_S, ETA_SLACK_FRACTION * (old - now_s))
            by = rng.choice([-1e-6, -0.5e-6, -0.4e-6, 0.0, 0.4e-6, 0.5e-6, 0.6e-6, 1e-6])
            return replace(entry, estimated_start=old + rng.choice([-1, 1]) * (slack + by))
        if field in ("eta", "low", "high"):  # around the slack of the stored time
            name, stored_name = {"eta": ("estimated_start", "estimated_start_at"),
                                 "low": ("estimated_start_low", "estimated_start_low_at"),
                                 "high": ("estimated_start_high", "estimated_start_high_at")}[field]
            old = getattr(jobs_by_id[entry.job_id], stored_name).timestamp()
            slack = max(ETA_SLACK_S, ETA_SLACK_FRACTION * (old - now_s))
            by = rng.choice([0.5, 0.99999, 1.0, 1.00001, 2])
            return replace(entry, **{name: old + rng.choice([-1, 1]) * slack * by})
        if field == "priority":
            return replace(entry, priority=entry.priority + rng.choice([-1, 1]) * PRIORITY_SLACK * rng.choice([0.5, 1.0, 1.5]))
        if field == "factor":
            key = rng.choice(list(entry.factors))
            return replace(entry, factors={**entry.factors, key: entry.factors[key] + rng.choice([0.0004, 0.001, 0.01])})
        if field == "position":
            return replace(entry, position=entry.position + 1)
        if field == "reason_clock":
            return replace(entry, reason=re.sub(r"\d{2}:\d{2} UTC", "23:59 UTC", entry.reason))
        if field == "reason":
            return replace(entry, reason=entry.reason + " (changed)")
        if field == "none":
            return replace(entry, estimated_start=None, estimated_start_low=None, estimated_start_high=None)
        if field == "model":
            return replace(entry, estimated_start_model=None if rng.random() < 0.5 else entry.estimated_start_model + 60)
        return entry

    def writes(queue, stored: dict) -> list:
        got: list = []
        with monkeypatch.context() as patch:
            patch.setattr(loop, "job_queue_info_set", lambda updates: got.extend(updates) or len(updates))
            queue_update(queue, {key: copy.copy(job) for key, job in stored.items()}, now)
        return sorted((str(pk), sorted(news.items())) for pk, news in got)

    cases = written = 0
    for _ in range(300):
        stored = {key: copy.copy(job) for key, job in jobs_by_id.items()}
        for name in ("predicted_start_at", "predicted_model_start_at"):  # each unset on some rows
            if rng.random() < 0.2:
                for job in stored.values():
                    setattr(job, name, None)
        queue = [perturbed(entry, stored) for entry in entries]
        expected = reference_writes(queue, stored, now)
        assert writes(queue, stored) == expected
        cases += 1
        written += bool(expected)
    assert cases == 300 and 0 < written < 300  # both outcomes exercised


def test_near_etas_stored_stay_in_the_order_the_pass_gives_them(alice, bob, demo_registered, node):
    """trial25 F1 as the live pass stores it: three jobs that cannot overtake each other get ETAs
    40, 50 and 60 s away, in order. The running job's end then slides 25 s (an epoch ran longer)
    and the first one's row has other news too (its priority moved): it is rewritten (65 s),
    while the others moved by less than ETA_SLACK_S (30 s) and keep 50 and 60 s. Shown: position
    1 at +65 s, position 2 at +50 s ("start in 16 s" above "start in 9 s" in the trial); the pass
    itself had them in order."""
    from dataclasses import replace

    from apps.scheduling.loop import queue_update

    now, jobs_by_id, entries = queue_behind_a_long_job(alice, bob, 3)
    now_s = now.timestamp()

    def at(offsets, priority_bump=0.0):
        out = []
        for k, (e, off) in enumerate(zip(entries, offsets, strict=True)):
            t = now_s + off
            out.append(replace(e, estimated_start=t, estimated_start_low=t, estimated_start_high=t,
                               estimated_start_model=t, reason=f"{e.reason.rsplit('expected ', 1)[0]}expected {time_text(t)}",
                               priority=e.priority + (priority_bump if k == 0 else 0.0)))
        return out

    first = at((40.0, 50.0, 60.0))
    queue_update(first, jobs_by_id, now)
    second = at((65.0, 75.0, 85.0), priority_bump=5.0)
    assert [e.estimated_start for e in second] == sorted(e.estimated_start for e in second)  # the pass: in order
    queue_update(second, jobs_by_id, now)
    stored = [Job.objects.get(pk=e.job_id).estimated_start_at for e in second]
    assert stored == sorted(stored), [round(t.timestamp() - now_s) for t in stored]
