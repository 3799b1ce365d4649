"""Position, ETA and reason for every job a pass does not start."""

from __future__ import annotations

import heapq
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence

from .admission import gpus_text
from .eta import EtaModel
from .eta_calibration import EDGES_S, OFFSET_S, Calibration, calibration_for
from .placement import EPS, NodeCapacity
from .types import DAY_S, Allocation, ClusterState, JobRequest, QueueEntry


class Waiting:
    """A job this pass does not start, and why."""

    __slots__ = ("job", "kind", "note", "until", "cls", "row")

    def __init__(
        self, job: JobRequest, kind: str, note: object = "", until: float | None = None, cls: str = "",
        row: tuple | None = None,
    ) -> None:
        self.job = job
        self.kind = kind  # "never" | "quota" | "resources" | "reserved" | "overquota"
        # never: the reason text; quota: ("team" | "user" | "user-np", in use, limit);
        # reserved: "starving" for a bounded-wait reservation; overquota: (used, quota)
        self.note = note
        self.until = until  # quota: when it frees up; reserved: reserved start
        self.cls = cls  # the class it would run as
        self.row = row  # the job's priority.Ranked row (priority first, factors last)


# "HH:MM UTC" of each minute of a day: a long queue's ETAs fall in thousands of minutes per pass
_CLOCK = tuple(f"{m // 60:02d}:{m % 60:02d} UTC" for m in range(1440))

_new = object.__new__
_set = object.__setattr__


def _entry(
    job_id: str,
    position: int,
    priority: float,
    factors: dict[str, float],
    estimated_start: float | None,
    reason: str,
    reserved_node: str | None,
    reserved_at: float | None,
    estimated_start_low: float | None,
    estimated_start_high: float | None,
    estimated_start_model: float | None,
) -> QueueEntry:
    """``QueueEntry(...)`` without the frozen dataclass's ``__init__`` (ten
    ``object.__setattr__`` calls, more than half the cost): one per waiting job per pass,
    10,000 on a long queue. Every field is set (tests/scheduling checks it against
    ``QueueEntry``'s fields)."""
    entry = _new(QueueEntry)
    _set(
        entry,
        "__dict__",
        {
            "job_id": job_id,
            "position": position,
            "priority": priority,
            "factors": factors,
            "estimated_start": estimated_start,
            "reason": reason,
            "reserved_node": reserved_node,
            "reserved_at": reserved_at,
            "estimated_start_low": estimated_start_low,
            "estimated_start_high": estimated_start_high,
            "estimated_start_model": estimated_start_model,
        },
    )
    return entry


def fmt_time(t: float, now: float) -> str:
    """``14:20 UTC`` on ``now``'s UTC day, else ``2026-12-01 14:20 UTC``: a time on another day
    says its date (at 18:16, "within quota again 18:10 UTC" read as the past: it meant tomorrow;
    manager trial 15, F11)."""
    pattern = "%H:%M UTC" if t // DAY_S == now // DAY_S else "%Y-%m-%d %H:%M UTC"
    return time.strftime(pattern, time.gmtime(t))


def hours(seconds: float) -> str:
    """GPU-hours for a reason, as precise as a small quota needs: "0.032 of 0.02" (one decimal
    said "0.0 of 0.02" of a user over quota: manager trial), "12.5 of 20"."""
    h = seconds / 3600
    text = f"{h:.1f}" if h >= 10 else f"{h:.3f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


class Explainer:
    """ETAs, positions and reasons for one pass's waiting jobs.

    ETAs come from list scheduling on the pooled GPUs: each GPU is a slot free at the
    end of what runs on it; each waiting job, in order, takes the earliest slots it
    needs (a fractional job one slot for ``walltime × share``, area-preserving).
    Reserved jobs start at their reservation; quota-held jobs not before their quota
    frees up. Node boundaries and GPU models are ignored beyond the reservations.
    """

    def __init__(
        self,
        state: ClusterState,
        now: float,
        caps: Mapping[str, NodeCapacity],
        preempted: Iterable[str],
        started: Sequence[Allocation],
    ) -> None:
        self.state = state
        self.now = now
        self.caps = caps
        self.preempted = preempted
        self.started = started
        self._fmt_cache: dict[int, str] = {}
        self._dates: dict[int, str] = {}  # UTC day number -> "YYYY-MM-DD "
        self._gpus_text: dict[tuple, str] = {}  # (GPUs, models) -> gpus_text
        self._shape_texts: dict[int, str] = {}  # shape id -> gpus_text (an int key: no tuple built)

    def gpu_slots(self) -> list[float]:
        """When each schedulable GPU is next free, for the pooled ETA sweep."""
        now = self.now
        ends: dict[tuple[str, int], list[float]] = {}
        for a in self.state.running:
            if a.job_id in self.preempted:
                continue
            for i in a.gpu_indices:
                ends.setdefault((a.node, i), []).append(max(a.expected_end, now))
        for a in self.started:
            for i in a.gpu_indices:
                ends.setdefault((a.node, i), []).append(a.expected_end)
        slots = []
        for node in self.state.nodes:
            if not node.schedulable:
                continue
            cap = self.caps[node.name]
            for g in node.gpus:
                e = ends.get((node.name, g.index))
                if not e:
                    slots.append(now)
                elif cap.gpu_free[g.index] > EPS:
                    slots.append(min(e))  # shared GPU with room: free enough at the first end
                else:
                    slots.append(max(e))
        heapq.heapify(slots)
        return slots

    def pooled_etas(self, waiting: Sequence[Waiting]) -> tuple[list[float | None], float | None]:
        """The coarse sweep's start for every waiting job (None = never / no time), and the next wake-up."""
        now = self.now
        slots = self.gpu_slots()
        n_slots = len(slots)
        etas: list[float | None] = []
        wake_at: float | None = None
        heappop, heappush, heapreplace = heapq.heappop, heapq.heappush, heapq.heapreplace
        for w in waiting:
            job = w.job
            eta: float | None = None
            kind = w.kind
            if kind != "never":
                t0: float | None = now
                if kind == "quota":
                    t0 = w.until
                    if t0 is not None and t0 > now and (wake_at is None or t0 < wake_at):
                        wake_at = t0
                gpus = job.gpus
                if t0 is not None and gpus <= n_slots:
                    if gpus <= 1:
                        start = slots[0]
                        if start < t0:
                            start = t0
                        if kind == "reserved":
                            start = w.until
                        heapreplace(slots, start + job.walltime * gpus)
                    else:
                        # The n earliest slots: n - 1 popped, the n-th is then the top and is
                        # replaced (the same values in the heap as n pops and n pushes).
                        n = int(round(gpus))
                        for _ in range(n - 1):
                            heappop(slots)
                        start = slots[0]
                        if start < t0:
                            start = t0
                        if kind == "reserved":
                            start = w.until
                        end = start + job.walltime
                        heapreplace(slots, end)
                        for _ in range(n - 1):
                            heappush(slots, end)
                    eta = start
            etas.append(eta)
        return etas, wake_at

    def explain(
        self,
        waiting: Sequence[Waiting],
        reserved_node: Mapping[str, str],
        eta_model: EtaModel | None = None,
    ) -> tuple[tuple[QueueEntry, ...], float | None]:
        """Queue entries in priority order, and when to plan again (a quota lifts).

        Each waiting job's priority and factors come from its ``row`` (its
        :class:`~.priority.Ranked`); ``reserved_node`` maps job id to the node it holds.
        With ``eta_model``, the head of the queue gets forward-simulated ETAs and everyone a
        range (:mod:`.eta`); without, the pooled sweep's point alone.
        """
        now = self.now
        only = self.state.explain_only
        pooled, wake_at = self.pooled_etas(waiting)
        ranges: dict[str, tuple[float, float, float]] = {}
        head_end = 0  # the head's jobs are among the first head_end waiting: none has a range below
        if eta_model is not None:
            head = []
            head_points: dict[str, float] = {}
            # Shape -> the head's last job of it waiting for resources (reserved or not): a coarse estimate of the
            # shape below the head carries on from it (EtaModel.carry_from)
            anchors: dict[int, int] = {}
            k = 0
            for k, (w, eta) in enumerate(zip(waiting, pooled, strict=True)):  # noqa: B007 (k: where the head ends)
                if eta is None:
                    continue
                t0 = now if w.kind != "quota" else (w.until or now)
                wanted = only is None or w.job.job_id in only
                if w.kind == "resources" or w.kind == "reserved":  # not held by its own quota
                    anchors[w.job.shape_id] = len(head)
                head.append((w.job, t0, w.row[0], wanted))
                head_points[w.job.job_id] = eta
                if len(head) >= self.state.config.eta_head:
                    break
            head_end = k + 1
            if only is not None and anchors:
                # A pass that explains only some jobs (the simulator's) simulates the head as
                # far as the anchor of each one's shape below it: shown as the full pass would
                for w in waiting[k + 1 :]:
                    if w.job.job_id in only:
                        a = anchors.get(w.job.shape_id)
                        if a is not None and not head[a][3]:
                            job, t0, prio, _ = head[a]
                            head[a] = (job, t0, prio, True)
            if any(wanted for *_, wanted in head):
                ranges = eta_model.head(head, head_points)
                for shape, a in anchors.items():
                    job, _, prio, _ = head[a]
                    got = ranges.get(job.job_id)
                    if got is not None:
                        eta_model.carry_from(got, head_points[job.job_id], prio, shape)
        calibration: Calibration | None | bool = False  # built on first use (False = not yet)
        cal_factors: list = []  # Calibration.factors, for calibrate() inlined below
        cal_bounds: list = []  # Calibration.bounds, the same
        cal_clamps: list = []  # Calibration.clamps, the same
        entries: list[QueueEntry] = []
        append = entries.append
        reason = self.reason
        waiting_text = self.waiting_text
        shape_texts = self._shape_texts
        fmt_cache_get = self._fmt_cache.get
        fmt = self.fmt
        new_entry, set_dict = _new, _set
        # EtaModel.coarse inlined (the same arithmetic, in the same order): one call per job
        # below the head, most of a long queue. After head(), which refines the spread.
        coarse = eta_model is not None
        if coarse:
            lo_f, hi_f = eta_model.spread
            widen = eta_model.config.eta_range_widen
            carry_get = eta_model.carry.get
            # not with eta_below_head_stretch off (EtaModel.coarse's default, carry_from's denominator)
            stretch = bool(
                eta_model.config.eta_below_head_stretch and eta_model.total_gpus and eta_model.inflow_rate > 0
            )
            total_gpus = eta_model.total_gpus
            if stretch:  # EtaModel.inflow_rate_above inlined: 1 - load for each place among the arrivals
                inflow_neg_prios, inflow_work = eta_model.inflow_table()
                load_max = eta_model.config.eta_below_head_load_max
                unloaded = []
                for k in range(len(inflow_neg_prios) + 1):
                    load = (inflow_work[k - 1] if k > 0 else 0.0) / total_gpus
                    if load > load_max:  # min(load_max, …) without the call
                        load = load_max
                    unloaded.append(1.0 - load)
        ranges_get = ranges.get
        reserved_get = reserved_node.get
        ahead = 0
        # How many of those ahead are each team's: a job's reason says how many of the jobs
        # ahead are another team's, which its own team cannot see in its queue (trial 14, F34).
        ahead_of_team: dict[str, int] = {}
        position = 0
        for w, eta in zip(waiting, pooled, strict=True):
            job = w.job
            kind = w.kind
            position += 1
            if only is None or job.job_id in only:
                job_id = job.job_id
                prio, _, _, (f_share, f_age, f_size, f_class) = w.row
                low = high = None
                if eta is not None:
                    got = ranges_get(job_id) if position <= head_end else None
                    if got is not None:
                        eta, low, high = got
                    elif coarse:
                        wait = eta - now  # max(0.0, eta - now) and min(0.9, …) below, without the calls
                        if wait < 0.0:
                            wait = 0.0
                        if wait > 0 and stretch:  # no inflow: load 0, no stretch
                            wait /= unloaded[bisect_left(inflow_neg_prios, -prio)]
                        carry = carry_get(job.shape_id)
                        if carry is None:
                            eta = now + wait
                        else:  # EtaModel.coarse's carry across the seam (the point's; low and high below)
                            r_mid, d_mid = carry[0]
                            eta = now + (wait * r_mid + d_mid)
                    if calibration is False:
                        config = self.state.config
                        calibration = calibration_for(
                            self.state.eta_history, config.eta_coverage, config.eta_calibration_min
                        )
                        cal_factors = calibration.factors if calibration else []
                        cal_bounds = calibration.bounds if calibration else []
                        cal_clamps = calibration.clamps if calibration else []
                    model = eta
                    # The track record sets the point and the range (Calibration.calibrate
                    # inlined, the same arithmetic); where it has nothing to say, the range
                    # is the head's or the coarse one (computed only then: it was thrown
                    # away for nearly every job).
                    factors = None
                    if cal_factors:
                        predicted = eta - now
                        if not predicted > 0.0:
                            predicted = 0.0
                        bucket = bisect_right(EDGES_S, predicted)
                        factors = cal_factors[bucket]
                    if factors is not None:
                        base = predicted + OFFSET_S
                        f_mid, f_lo, f_hi = factors
                        mid, lo, hi = base * f_mid - OFFSET_S, base * f_lo - OFFSET_S, base * f_hi - OFFSET_S
                        clamp = cal_clamps[bucket]  # a bucket on the pooled interval (Calibration.clamps)
                        if clamp is not None:
                            most_mid, least_lo, most_hi = clamp
                            if mid > most_mid:
                                mid = most_mid
                            if lo < least_lo:
                                lo = least_lo
                            if hi > most_hi:
                                hi = most_hi
                        # monotone across the buckets' edges (Calibration.bounds): their seams
                        # showed later positions earlier (trial25 F1)
                        least, most_lo, least_hi = cal_bounds[bucket]
                        if mid < least:
                            mid = least
                        if lo > most_lo:
                            lo = most_lo
                        if hi < least_hi:
                            hi = least_hi
                        # point in [low, high] with no clamp: see Calibration.calibrate
                        eta = now + (mid if mid > 0.0 else 0.0)
                        low = now + (lo if lo > 0.0 else 0.0)
                        high = now + (hi if hi > 0.0 else 0.0)
                    elif got is None and coarse:
                        if carry is None:
                            low, high = now + wait * lo_f / widen, now + wait * hi_f * widen
                        else:
                            _, (r_lo, d_lo), (r_hi, d_hi) = carry
                            low = now + (wait * lo_f / widen * r_lo + d_lo)
                            high = now + (wait * hi_f * widen * r_hi + d_hi)
                else:
                    model = None
                cls = w.cls
                if kind == "resources" and cls == job.priority_class and cls != "urgent":
                    # Most of a long queue: reason()'s first case without its dispatch (the
                    # urgent notes cannot apply: cls equals the class asked for, not urgent),
                    # and waiting_text()'s common case with its lookups inline.
                    others = ahead - ahead_of_team.get(job.team, 0)
                    what = shape_texts.get(job.shape_id)
                    if eta is not None:
                        when = fmt_cache_get(int(eta // 60))
                        if when is None:  # a minute not seen yet in this pass (~15 % of a long queue)
                            when = fmt(eta)
                    else:
                        when = None
                    if what is not None and when is not None and others > 1:  # then ahead > 1 too
                        text = (f"behind {ahead} higher-priority jobs ({others} of other teams); "
                                f"waiting for {what}; expected {when}")
                    else:
                        text = waiting_text(job, ahead, eta, others)
                else:
                    text = reason(w, cls, ahead, eta, ahead - ahead_of_team.get(job.team, 0))
                entry_dict = {
                    "job_id": job_id,
                    "position": position,
                    "priority": prio,
                    "factors": {"fairshare": f_share, "age": f_age, "size": f_size, "class": f_class},
                    "estimated_start": eta,
                    "reason": text,
                    "reserved_node": reserved_get(job_id),
                    "reserved_at": w.until if kind == "reserved" else None,
                    "estimated_start_low": low,
                    "estimated_start_high": high,
                    "estimated_start_model": model,
                }
                # _entry() inlined (the same dict, in the same key order): one per waiting job
                entry = new_entry(QueueEntry)
                set_dict(entry, "__dict__", entry_dict)
                append(entry)
            if kind == "resources" or kind == "reserved":
                ahead += 1
                team = job.team
                ahead_of_team[team] = ahead_of_team.get(team, 0) + 1
        return tuple(entries), wake_at

    def fmt(self, t: float) -> str:
        """:func:`fmt_time`, once per minute however many ETAs fall in it (a long queue's
        ETAs span thousands of minutes: the time of day by arithmetic, the date once a day)."""
        minute = int(t // 60)
        text = self._fmt_cache.get(minute)
        if text is None:
            day, m = divmod(minute, 1440)
            text = _CLOCK[m]
            if day != self.now // DAY_S:
                date = self._dates.get(day)
                if date is None:
                    date = self._dates[day] = time.strftime("%Y-%m-%d ", time.gmtime(day * 86400))
                text = date + text
            self._fmt_cache[minute] = text
        return text

    def gpus_text(self, job: JobRequest) -> str:
        key = (job.gpus, job.gpu_models)
        text = self._gpus_text.get(key)
        if text is None:
            text = self._gpus_text[key] = gpus_text(job)
        return text

    def waiting_text(self, job: JobRequest, ahead: int, eta: float | None, others: int = 0) -> str:
        """The reason of a job waiting for resources (most of a long queue: caches inlined).

        ``others``: how many of the ``ahead`` are other teams' jobs, which the job's own team
        does not see in its queue: counted, never named ("behind 2 higher-priority jobs (1 of
        another team)"). It changes only when ``ahead`` does, so the write-back stays a
        position-and-reason write."""
        what = self._shape_texts.get(job.shape_id)
        if what is None:
            what = self._shape_texts[job.shape_id] = self.gpus_text(job)
        theirs = "" if not others else " (1 of another team)" if others == 1 else f" ({others} of other teams)"
        if eta is None:
            if ahead:
                return f"behind {ahead} higher-priority job{'s' if ahead != 1 else ''}{theirs}; waiting for {what}"
            return f"waiting for {what}"
        when = self._fmt_cache.get(int(eta // 60))
        if when is None:
            when = self.fmt(eta)
        if ahead > 1:  # most of a long queue: one string built, not three joined
            return f"behind {ahead} higher-priority jobs{theirs}; waiting for {what}; expected {when}"
        if ahead:
            return f"behind 1 higher-priority job{theirs}; waiting for {what}; expected {when}"
        return f"waiting for {what}; expected {when}"

    def reason(self, w: Waiting, cls: str, ahead: int, eta: float | None, others: int = 0) -> str:
        job, fmt = w.job, self.fmt
        kind = w.kind
        if kind == "resources":
            text = self.waiting_text(job, ahead, eta, others)
        elif kind == "never":
            return w.note
        elif kind == "quota":
            if w.note[0] == "team":
                _, in_use, limit = w.note
                text = f"over team quota ({in_use:g} of {limit:g} GPUs in use)"
            elif w.note[0] == "user-np":
                _, used, quota = w.note
                text = (
                    f"may not be preempted, so its next 24 h must fit in the daily GPU-hour quota "
                    f"({hours(used)} of {hours(quota)} used in 24 h)"
                )
            else:
                _, used, quota = w.note
                text = f"over daily GPU-hour quota ({hours(used)} of {hours(quota)} used in 24 h)"
            text += f" until {fmt(w.until)}" if w.until is not None else ""
        elif kind == "overquota":
            used, quota = w.note
            text = (
                f"over quota: runs when GPUs are idle, may be preempted "
                f"({hours(used)} of {hours(quota)} GPU-hours used in 24 h"
            )
            text += f"; within quota again {fmt(w.until)})" if w.until is not None else ")"
        elif kind == "reserved":
            starving = " (waited well past its fair share)" if w.note == "starving" else ""
            text = (
                f"waiting for {self.gpus_text(job)}; reserved{starving}; "
                f"expected {fmt(eta if eta is not None else w.until)}"
            )
        else:
            raise ValueError(f"unknown waiting kind {kind!r}")
        if job.priority_class == "urgent" and cls != "urgent":
            text += " (team's urgent allowance used up: runs as high)"
        elif cls == "urgent" and kind in ("resources", "reserved") and self.state.config.preemption:
            # Why an urgent job still waits (a new user asked): victims must have run a while.
            text += (f" (urgent: preempts a lower-class job once it has run "
                     f"{self.state.config.preempt_min_runtime_s / 60:g} min and has a checkpoint)")
        return text
