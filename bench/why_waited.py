"""Why the long waiters waited: an instrumented replay, pass by pass (issue 14, ETA diagnosis).

    python bench/why_waited.py --records /tmp/eta30/ns-s31.json --save why-s31.json
    python bench/why_waited.py --load-why why-s31.json          # summarise a saved trace again

``--records`` is a replay saved by ``bench/eta_calibration.py --save`` (its setup is reused
exactly, and its first starts are checked against this run's: the instrumentation observes,
it changes no start). Every job whose first start came ``--min-wait-days`` or more after its
submit in that record is followed through every planning pass it waited in:

- its rank (position in the pass's queue) and the queue's length;
- what the pass decided for it (``Waiting.kind``: ``reserved`` with the reservation's time,
  ``resources`` = blocked without one, ``quota`` / ``overquota`` / ``never``) and how many
  jobs ahead of it held a reservation;
- the jobs the pass started on a node whose GPUs it could use (its GPU-model constraint):
  their class, GPUs and rank, ahead of it (the fair order put them first) or behind it
  (backfilled past it);
- whether it was preempted and requeued;
- its ETA range at submit (the saved record's) and, once a day of replay time, the range a
  re-ask would show (the job is added to the pass's ``explain_only``; ETAs change no start).

The summary splits each long waiter's wait into the states above (time-weighted between
passes) and names its main cause; docs/scheduling.md, "Why the long waiters waited".
Instrumentation wraps ``plan``, ``rank_queue`` and ``Explainer.explain`` as the replay runs
(read-only: they return what they returned) and is removed afterwards.

Measured (4x8 seeds 11 and 31, main's defaults; docs): 93-98 % of the >= 7-day waits were spent
blocked below the reservation cut, the GPUs going to later, smaller arrivals ranked ahead; once
reserved, a job started within hours. Best signals: the job's own priority (size factor) at the
submit on s31 (AUC 0.85-0.87, not s11: 0.60), its rank / queue length two days in on both (0.67, 0.88).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import statistics
import sys
from collections import Counter
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import apps.scheduling.policy.explain as explain_mod  # noqa: E402
import apps.scheduling.policy.fair as fair  # noqa: E402
import apps.scheduling.simulator as sim  # noqa: E402
from apps.scheduling.policy import PolicyConfig  # noqa: E402

DAY_S = 86400.0


def config_of(replay: dict) -> PolicyConfig:
    """The PolicyConfig ``bench/eta_calibration.py`` replayed with (its ``replay`` block)."""
    return PolicyConfig(
        policy="fair",
        user_gpu_hours_per_day=None,
        eta_scenarios=replay["scenarios"],
        eta_head=replay["eta_head"],
        eta_after_budget_stretch=replay["after_budget_stretch"],
        eta_below_head_stretch=replay["below_head_stretch"],
        eta_below_head_load_max=replay.get("below_head_load_max", 0.9),  # not saved before eta29b
    )


def long_waiters(records: list, min_wait_s: float) -> list[tuple[float, float]]:
    """(submit, GPUs) of the record's jobs whose first start came ``min_wait_s`` or more after submit."""
    return [(r[0], float(r[6])) for r in records if r[4] is not None and r[4] - r[0] >= min_wait_s]


def usable(node_models: dict[str, frozenset], models: tuple) -> set[str]:
    """Nodes whose GPUs a job constrained to ``models`` may use (all nodes without a constraint)."""
    want = set(models)
    return {n for n, have in node_models.items() if not want or have & want}


def trace(replay: dict, tracked_keys: set, reask_s: float = DAY_S) -> dict:
    """Replay the setup with the instrumentation on; per tracked job its pass-by-pass states.

    ``tracked_keys``: (submit, GPUs) of the jobs to follow (a job matching one is followed;
    the summary keeps only those that did wait long in this run)."""
    tasks, _ = sim.load_trace(replay["trace"])
    tasks = tasks[: replay["max_tasks"]] if replay.get("max_tasks") else tasks
    nodes = sim.load_nodes(replay["nodes"])
    gpus = float(sum(len(n.gpus) for n in nodes))
    tasks = sim.rescale(tasks, gpus, replay["load"])
    owners = sim.assign_users(len(tasks), replay["seed"], 40, 6, 1.1)
    task_of = {t.name: t for t in tasks}
    node_models = {n.name: frozenset(g.model for g in n.gpus) for n in nodes}
    tracked = {t.name for t in tasks if (t.submit, float(t.gpus)) in tracked_keys}
    usable_of = {name: usable(node_models, task_of[name].gpu_models) for name in tracked}
    # job -> [t, rank, queue length, kind, reserved start, reserved jobs ahead, priority, fair-share factor, size factor]
    passes: dict[str, list] = {name: [] for name in tracked}
    etas: dict[str, list] = {name: [] for name in tracked}  # job -> [t, point, low, high] at re-asks
    passed_by: dict[str, list] = {name: [] for name in tracked}  # job -> [t, starter, gpus, class, ahead?]
    last_ask: dict[str, float] = {}
    box: dict = {}
    plan_of, rank_of, explain_of, metrics_of = sim.plan, fair.rank_queue, explain_mod.Explainer.explain, sim._metrics
    jobs: dict = {}

    def ranked(*a, **k):
        rows = rank_of(*a, **k)
        box["rows"] = rows
        return rows

    def explained(self, waiting, reserved_node, eta_model=None):
        box["waiting"] = waiting
        return explain_of(self, waiting, reserved_node, eta_model)

    def planned(state, now):
        queued_tracked = [q.job_id for q in state.queued if q.job_id in tracked]
        ask = frozenset(j for j in queued_tracked if now - last_ask.get(j, -math.inf) >= reask_s)
        if ask:
            state = replace(state, explain_only=(state.explain_only or frozenset()) | ask)
        box.clear()
        result = plan_of(state, now)
        if not queued_tracked:
            return result
        # The queue's order is the explainer's (``waiting``): the pass's entries cover only the jobs
        # in ``explain_only`` (the simulator's new jobs and the re-asked ones), not every job.
        order = box.get("waiting", ())
        position = {w.job.job_id: (k + 1, w) for k, w in enumerate(order)}
        reserved_rank = [k for k, w in enumerate(order) if w.kind == "reserved"]
        rank_all = {r.job.job_id: i + 1 for i, r in enumerate(box.get("rows", ()))}
        entries = {e.job_id: e for e in result.queue} if ask else {}
        for j in queued_tracked:
            got = position.get(j)
            if got is None:  # started in this pass
                continue
            pos, w = got
            until = w.until if w.kind == "reserved" else None
            prio, _, _, (f_share, _f_age, f_size, _f_class) = w.row
            ahead_res = bisect.bisect_left(reserved_rank, pos - 1)
            passes[j].append([now, pos, len(order), w.kind, until, ahead_res, prio, f_share, f_size])
            e = entries.get(j)
            if e is not None:
                last_ask[j] = now
                etas[j].append([now, e.estimated_start, e.estimated_start_low, e.estimated_start_high])
            my_rank = rank_all.get(j, pos)
            for s in result.starts:
                if s.node in usable_of[j]:
                    t = task_of[s.job_id]
                    cls = s.priority_class or sim.QOS_CLASS.get(t.qos, "low")
                    passed_by[j].append([now, s.job_id, t.gpus, cls, rank_all.get(s.job_id, 0) < my_rank])
        return result

    def keep(j, *a, **k):
        jobs.update(j)
        return metrics_of(j, *a, **k)

    sim.plan, fair.rank_queue, explain_mod.Explainer.explain, sim._metrics = planned, ranked, explained, keep
    try:
        sim.simulate_policy(tasks, owners, nodes, config_of(replay), seed=replay["seed"])
    finally:
        sim.plan, fair.rank_queue, explain_mod.Explainer.explain, sim._metrics = (
            plan_of,
            rank_of,
            explain_of,
            metrics_of,
        )
    out = {}
    for name in tracked:
        j = jobs.get(name)
        if j is None or j.first_start is None:
            continue
        out[name] = {
            "submit": j.task.submit,
            "first_start": j.first_start,
            "gpus": j.task.gpus,
            "models": list(j.task.gpu_models),
            "class": j.request.priority_class,
            "user": j.request.user,
            "preempted": j.preempted,
            "eta": [j.eta_at_submit, j.eta_low, j.eta_high],
            "passes": passes[name],
            "etas": etas[name],
            "passed_by": passed_by[name],
        }
    starts = sorted(
        (j.first_start, j.task.submit, float(j.task.gpus)) for j in jobs.values() if j.first_start is not None
    )
    return {"replay": replay, "jobs": out, "starts": starts}


def states(job: dict) -> dict[str, float]:
    """Seconds of the job's wait spent in each state, each pass's state held until the next pass."""
    spent: Counter = Counter()
    rows = job["passes"]
    for k, (t, _pos, _n, kind, until, ahead_res, *_) in enumerate(rows):
        end = rows[k + 1][0] if k + 1 < len(rows) else job["first_start"]
        if kind == "reserved":
            # A reservation due at the pass itself: the GPUs it counts on are held by jobs past their
            # walltime estimate (the reservation takes an overdue job as ending now), so it waits on
            # while they run on.
            key = "reserved, due now" if until is not None and until <= t + 1.0 else "reserved"
        elif kind == "resources":
            key = "blocked, no reservation" if ahead_res else "blocked, none reserved ahead"
        else:
            key = kind
        spent[key] += max(0.0, end - t)
    return dict(spent)


def cause(job: dict) -> str:
    """The main cause of a long wait (docs/scheduling.md, "Why the long waiters waited"): requeued
    after a preemption; holding a reservation for at least half the wait (waiting for its time);
    else whom the starts on its GPUs went to: jobs the fair order ranked ahead of it (outranked),
    or jobs ranked behind it that fitted where it did not (passed by backfill)."""
    if job["preempted"]:
        return "preempted and requeued"
    wait = job["first_start"] - job["submit"]
    spent = states(job)
    if spent.get("reserved", 0.0) + spent.get("reserved, due now", 0.0) >= 0.5 * wait:
        return "held a reservation most of the wait"
    ahead = sum(1 for p in job["passed_by"] if p[4])
    if ahead >= len(job["passed_by"]) - ahead:
        return "outranked: starts on its GPUs went to jobs ranked ahead"
    return "passed by backfill: starts on its GPUs went to jobs ranked behind"


def summarise(data: dict, min_wait_s: float = 7 * DAY_S, submit_of: dict[str, float] | None = None) -> dict:
    """Counts per cause, and per cause the figures the docs table shows."""
    jobs = {k: v for k, v in data["jobs"].items() if v["first_start"] - v["submit"] >= min_wait_s}
    by_cause: dict[str, list] = {}
    for name, job in jobs.items():
        by_cause.setdefault(cause(job), []).append(name)
    table = {}
    for c, names in sorted(by_cause.items(), key=lambda kv: -len(kv[1])):
        rows = [jobs[n] for n in names]
        waits = [(r["first_start"] - r["submit"]) / DAY_S for r in rows]
        gpus = Counter(_size(r["gpus"]) for r in rows)
        ranks0 = [r["passes"][0][1] for r in rows if r["passes"]]
        late = sum(1 for r in rows if r["eta"][2] is not None and r["first_start"] > r["eta"][2])
        ahead = sum(sum(1 for p in r["passed_by"] if p[4]) for r in rows)
        behind = sum(sum(1 for p in r["passed_by"] if not p[4]) for r in rows)
        res_share = [_reserved(states(r)) / max(1.0, r["first_start"] - r["submit"]) for r in rows]
        table[c] = {
            "jobs": len(rows),
            "median_wait_d": statistics.median(waits),
            "gpus": dict(gpus),
            "median_rank_at_submit": statistics.median(ranks0) if ranks0 else None,
            "late_vs_submit_range": late,
            "starts_on_its_nodes_ahead": ahead,
            "starts_on_its_nodes_behind": behind,
            "median_reserved_share": statistics.median(res_share),
        }
    return {
        "long_waiters": len(jobs),
        "causes": table,
        "passed_by": passed_by_table(jobs, submit_of),
        "reask": reask(jobs),
    }


def submits(replay: dict) -> dict[str, float]:
    """Each job's submit in the replay (the trace rescaled as :func:`trace` does)."""
    tasks, _ = sim.load_trace(replay["trace"])
    tasks = tasks[: replay["max_tasks"]] if replay.get("max_tasks") else tasks
    gpus = float(sum(len(n.gpus) for n in sim.load_nodes(replay["nodes"])))
    return {t.name: t.submit for t in sim.rescale(tasks, gpus, replay["load"])}


def passed_by_table(jobs: dict, submit_of: dict[str, float] | None = None) -> dict[str, dict]:
    """Starts on the long waiters' nodes during their waits: ranked ahead of the waiter (the fair
    order put them first) or behind it (backfilled past it), by class, by GPUs and (with
    ``submit_of``) how many were submitted after the waiter; a start counts once per waiter it passed."""
    out = {k: {"starts": 0, "submitted later": 0, "class": Counter(), "gpus": Counter()} for k in ("ahead", "behind")}
    for job in jobs.values():
        for _t, starter, gpus, cls, ahead in job["passed_by"]:
            row = out["ahead" if ahead else "behind"]
            row["starts"] += 1
            row["class"][cls] += 1
            row["gpus"][_size(gpus)] += 1
            if submit_of is not None and submit_of.get(starter, -math.inf) > job["submit"]:
                row["submitted later"] += 1
    return {k: {**v, "class": dict(v["class"]), "gpus": dict(v["gpus"])} for k, v in out.items()}


def reask(jobs: dict) -> dict[str, float]:
    """The ranges a re-ask showed during the wait: how many ended before the actual start (late)."""
    asks = [(e, job["first_start"]) for job in jobs.values() for e in job["etas"] if e[3] is not None]
    late = sum(1 for e, start in asks if start > e[3])
    by_job = [
        sum(1 for e in job["etas"] if e[3] is not None and job["first_start"] > e[3]) / len(job["etas"])
        for job in jobs.values()
        if job["etas"]
    ]
    return {
        "asks": len(asks),
        "late": late,
        "jobs_late_at_every_ask": sum(1 for x in by_job if x == 1.0),
        "jobs_asked": len(by_job),
    }


def auc(pos: list[float], neg: list[float]) -> float | None:
    """P(a value of ``pos`` > one of ``neg``), ties half: 0.5 = the feature tells nothing apart."""
    if not pos or not neg:
        return None
    ranked = sorted([(v, 1) for v in pos] + [(v, 0) for v in neg])
    rank_sum, k = 0.0, 0
    while k < len(ranked):  # average ranks over ties
        end = k
        while end + 1 < len(ranked) and ranked[end + 1][0] == ranked[k][0]:
            end += 1
        mid = (k + end) / 2 + 1
        rank_sum += sum(mid for i in range(k, end + 1) if ranked[i][1])
        k = end + 1
    return (rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


def requested_gpu_hours(f_size: float, cap_gpu_hours: float = 1000.0) -> float:
    """GPUs × walltime estimate from the size factor (``priority.size_factor`` inverted; the cap's floor)."""
    return math.expm1((1.0 - f_size) * math.log1p(cap_gpu_hours))


def at_age(job: dict, age_s: float) -> list | None:
    """The pass row in force ``age_s`` after the submit (None if it had started by then)."""
    if job["first_start"] - job["submit"] < age_s or not job["passes"]:
        return None
    times = [p[0] for p in job["passes"]]
    k = bisect.bisect_right(times, job["submit"] + age_s) - 1
    return job["passes"][max(0, k)]


def signals(job: dict, age_s: float) -> dict[str, float] | None:
    """What was known of the job at its submit (first pass) and at ``age_s`` into its wait."""
    if not job["passes"]:
        return None
    first, later = job["passes"][0], at_age(job, age_s)
    if later is None:
        return None
    point = job["eta"][0]
    return {
        "shown point at submit (wait)": (point - job["submit"]) if point is not None else math.inf,
        "GPUs": float(job["gpus"]),
        "requested GPU-h (size factor)": requested_gpu_hours(first[8]),
        "rank at submit": float(first[1]),
        "rank / queue at submit": first[1] / first[2],
        "fair-share factor at submit, negated (higher = heavier user)": -first[7],
        "priority at submit, negated (higher = further behind)": -first[6],
        f"rank at {age_s / DAY_S:g} d": float(later[1]),
        f"rank / queue at {age_s / DAY_S:g} d": later[1] / later[2],
        f"priority at {age_s / DAY_S:g} d, negated": -later[6],
        f"reserved at {age_s / DAY_S:g} d": float(later[3] == "reserved"),
        f"reserved jobs ahead at {age_s / DAY_S:g} d": float(later[5]),
    }


def discriminate(data: dict, min_wait_s: float, base_s: float, age_s: float) -> dict[str, tuple]:
    """Per signal: (AUC long vs base, median long, median base); long = waited >= ``min_wait_s``,
    base = waited ``base_s`` to ``min_wait_s``; only jobs still waiting at ``age_s``."""
    long_rows, base_rows = [], []
    for job in data["jobs"].values():
        wait = job["first_start"] - job["submit"]
        got = signals(job, age_s)
        if got is None or wait < base_s:
            continue
        (long_rows if wait >= min_wait_s else base_rows).append(got)
    out = {}
    for key in long_rows[0] if long_rows else ():
        a, b = [r[key] for r in long_rows], [r[key] for r in base_rows]
        out[key] = (auc(a, b), statistics.median(a), statistics.median(b) if b else None, len(a), len(b))
    return out


def _reserved(spent: dict[str, float]) -> float:
    return spent.get("reserved", 0.0) + spent.get("reserved, due now", 0.0)


def _size(gpus: float) -> str:
    return "<1" if gpus < 1 else str(int(gpus))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", help="a replay saved by bench/eta_calibration.py --save (setup + long waiters)")
    parser.add_argument("--load-why", help="summarise a trace saved by --save instead of replaying")
    parser.add_argument("--save", help="write the per-job trace here")
    parser.add_argument("--min-wait-days", type=float, default=7.0, help="the long waiters summarised")
    parser.add_argument(
        "--track-days", type=float, help="follow every job that waited this long (default --min-wait-days): a baseline"
    )
    parser.add_argument(
        "--base-days", type=float, help="compare with the jobs that waited this long to --min-wait-days"
    )
    parser.add_argument("--reask-hours", type=float, default=24.0, help="re-ask the ETA this often (replay time)")
    args = parser.parse_args(argv)
    min_wait_s = args.min_wait_days * DAY_S
    if args.load_why:
        with open(args.load_why) as fh:
            data = json.load(fh)
    else:
        if not args.records:
            parser.error("--records: a saved eta_calibration replay is required (or --load-why)")
        with open(args.records) as fh:
            saved = json.load(fh)
        track_s = args.track_days * DAY_S if args.track_days is not None else min_wait_s
        keys = set(long_waiters(saved["records"], min(track_s, min_wait_s)))
        data = trace(saved["replay"], keys, args.reask_hours * 3600.0)
        same = sorted((r[4], r[0], float(r[6])) for r in saved["records"] if r[4] is not None) == data["starts"]
        data["starts_match_record"] = same
        print(f"first starts as in {args.records}: {same}")
        data.pop("starts")
        if args.save:
            with open(args.save, "w") as fh:
                json.dump(data, fh)
    print(json.dumps(summarise(data, min_wait_s, submits(data["replay"])), indent=1))
    if args.base_days is not None:
        age_s = args.base_days * DAY_S
        print(
            f"| signal | AUC (>= {args.min_wait_days:g} d vs {args.base_days:g}-{args.min_wait_days:g} d) | median long | median base |"
        )
        print("|---|---:|---:|---:|")
        for key, (a, m_long, m_base, n_long, n_base) in discriminate(data, min_wait_s, age_s, age_s).items():
            print(f"| {key} | {a:.2f} | {m_long:,.3g} | {m_base:,.3g} | ({n_long} / {n_base})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
