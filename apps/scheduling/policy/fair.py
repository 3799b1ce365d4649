"""The ``fair`` policy: one planning pass that ties the pieces together.

The pieces, each in its own module: :mod:`.priority` (multifactor order),
:mod:`.quota` (quotas and the urgent allowance), :mod:`.admission` (jobs that can never
start), :mod:`.placement` (where a job fits), :mod:`.preemption` (victims for a job
that does not fit), :mod:`.reservations` (backfill without delaying the top blocked
jobs) and :mod:`.explain` (position, ETA and reason of every waiting job).
"""

from __future__ import annotations

from .admission import NeverStarts
from .explain import Explainer, Waiting
from .placement import Placer, capacities, shape_of
from .preemption import choose_victims
from .priority import rank_queue
from .quota import QuotaLedger
from .reservations import Reservations
from .types import Allocation, ClusterState, JobRequest, Plan, PolicyConfig, Preemption, Start, TeamPolicy


class FairPlanner:
    """One planning pass. Use :func:`plan_fair`; the class only keeps the state of the pass.

    1. Free capacity per node from running allocations; team/user totals for quotas.
    2. Every queued job's class, factors and priority (:func:`.priority.rank_queue`).
    3. For each job in order: reject what can never start (per-job limit, no node large
       enough); hold what is over a quota; otherwise place it now if that delays no
       reservation; an urgent job that does not fit may preempt low/medium jobs; the
       first ``config.reservations`` jobs that still cannot start get a reservation
       (node and time) from running jobs' expected ends.
    4. One sweep over the waiting jobs in order gives every one an ETA and a reason.
    """

    def __init__(self, state: ClusterState, now: float) -> None:
        self.state = state
        self.now = now
        self.config: PolicyConfig = state.config
        self.caps = capacities(state.nodes, state.running)
        drain: dict[str, float] = {}
        for a in state.running:
            end = max(a.expected_end, now)
            if end > drain.get(a.node, now):
                drain[a.node] = end
        self.placer = Placer(self.caps, drain if self.config.drain_aware else None, now)
        self.quota = QuotaLedger(state, now)
        self.never = NeverStarts(state)
        self.starts: list[Start] = []
        self.started_allocs: list[Allocation] = []
        self.preempted: dict[str, Preemption] = {}
        self.reservations = Reservations(self.caps, now, state.running, self.started_allocs, self.quota.preempted)
        self.waiting: list[Waiting] = []
        self.blocked = False  # without backfill nothing passes a blocked job

    def start(self, job: JobRequest, cls: str, node: str, indices: tuple[int, ...], share: float) -> None:
        self.starts.append(Start(job.job_id, node, indices, share, cls))
        alloc = Allocation(
            job.job_id,
            job.team,
            job.user,
            node,
            indices,
            share,
            job.gpu_memory_mb,
            job.cpu_milli,
            job.memory_mb,
            cls,
            self.now,
            self.now + job.walltime,
            False,
        )
        self.started_allocs.append(alloc)
        self.quota.started(alloc)
        self.reservations.on_start(alloc)

    def try_preempt(self, job: JobRequest, cls: str) -> bool:
        """Free room for an urgent job by requeueing the fewest, lowest, most recent jobs."""
        chosen = choose_victims(
            job, self.state.running, self.caps, self.quota.preempted, self.now, self.config.preempt_min_runtime_s
        )
        if chosen is None:
            return False
        node, victims = chosen
        for victim in victims:
            self.placer.release(victim)
            self.quota.preempted_alloc(victim)
            self.preempted[victim.job_id] = Preemption(
                victim.job_id, f"preempted by urgent job {job.job_id}; resumes from its checkpoint", job.job_id
            )
        self.reservations.forget_events()
        placed = self.placer.place(job, lambda n, i, s: n == node)
        if placed is None:  # cannot happen: the trial fitted
            return False
        self.start(job, cls, *placed)
        return True

    def run(self) -> Plan:
        config = self.config
        quota = self.quota
        rows = rank_queue(self.state, self.now, quota.urgent_ok)
        failed = self.placer.failed  # the same set object all pass (cleared in place)
        waiting = self.waiting
        never_reason = self.never.reason
        reservations = self.reservations
        team_info: dict[str, tuple[TeamPolicy, bool]] = {}
        for _prio, job, cls, _factors in rows:
            info = team_info.get(job.team)
            if info is None:
                tp = quota.team_policy(job.team)
                info = team_info[job.team] = (tp, quota.limited(tp))
            tp, limited = info
            never = never_reason(job)
            if never is not None:
                waiting.append(Waiting(job, "never", never, None, cls))
                continue
            if limited:
                blocked = quota.block(job, tp)
                if blocked is not None:
                    blocked.cls = cls
                    waiting.append(blocked)
                    continue
            shape = shape_of(job)
            if self.blocked or shape in failed:  # on a full cluster: nothing of this shape fits
                waiting.append(Waiting(job, "resources", "", None, cls))
                continue
            if cls == "urgent" and not quota.urgent_ok(job):
                cls = "high"  # an earlier urgent job in this pass used the allowance
            placed = self.placer.place(job, reservations.allowed_for(job, self.now))
            if placed is not None:
                self.start(job, cls, *placed)
                continue
            if cls == "urgent" and config.preemption and self.try_preempt(job, cls):
                continue
            if not config.backfill:
                self.blocked = True
            if len(reservations) < config.reservations:
                res = reservations.reserve(job)
                if res is not None:
                    waiting.append(Waiting(job, "reserved", "", res.at, cls))
                    continue
            waiting.append(Waiting(job, "resources", "", None, cls))
        explainer = Explainer(self.state, self.now, self.caps, self.quota.preempted, self.started_allocs)
        queue, wake_at = explainer.explain(
            waiting,
            {r.job.job_id: (r.priority, r.factors) for r in rows},
            {r.job.job_id: r.node for r in reservations.items},
        )
        return Plan(
            starts=tuple(self.starts),
            preemptions=tuple(self.preempted[k] for k in sorted(self.preempted)),
            queue=queue,
            wake_at=wake_at,
        )


def plan_fair(state: ClusterState, now: float) -> Plan:
    return FairPlanner(state, now).run()
