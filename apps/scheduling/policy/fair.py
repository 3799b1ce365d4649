"""The ``fair`` policy: one planning pass that ties the pieces together.

The pieces, each in its own module: :mod:`.priority` (multifactor order),
:mod:`.quota` (quotas and the urgent allowance), :mod:`.admission` (jobs that can never
start), :mod:`.placement` (where a job fits), :mod:`.preemption` (victims for a job
that does not fit), :mod:`.reservations` (backfill without delaying the top blocked
jobs) and :mod:`.explain` (position, ETA and reason of every waiting job).
"""

from __future__ import annotations

from collections import Counter

from .admission import NeverStarts
from .eta import EtaModel
from .explain import Explainer, Waiting
from .placement import EPS, Fit, Placer, Target, capacities, gpu_serves
from .preemption import URGENT_VICTIM_CLASSES, VictimFinder, choose_victims_legacy
from .priority import Ranked, fairshare_factors, promote_starving, rank_queue, starving_jobs
from .quota import QuotaLedger
from .reservations import Reservations
from .types import Allocation, ClusterState, JobRequest, NodeInfo, Plan, PolicyConfig, Preemption, Start, TeamPolicy


class FairPlanner:
    """One planning pass. Use :func:`plan_fair`; the class only keeps the state of the pass.

    1. Free capacity per node from running allocations; team/user totals for quotas.
    2. Every queued job's class, factors and priority (:func:`.priority.rank_queue`);
       urgent jobs within their allowance first, then the most starved jobs
       (:func:`.priority.promote_starving`), then the rest by priority.
    3. For each job in order: reject what can never start (per-job limit, no node large
       enough); hold what is over a quota (a preemptible job of a user past the daily
       quota waits for step 5 instead); otherwise place it now if that delays no
       reservation; the first ``config.reservations`` jobs that still cannot start get a
       reservation, and the starving ones one of their own.
    4. Blocked jobs, in order, may preempt (:mod:`.preemption`) where that delays no
       reservation (:meth:`preempt_for_blocked`).
    5. Over-quota jobs, last: they start only on GPUs nobody else could use.
    6. One sweep over the waiting jobs in order gives every one an ETA and a reason.
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
        targets = waiting_shapes(state.queued, state.nodes) if self.config.fragmentation_aware else None
        self.placer = Placer(
            self.caps, drain if self.config.drain_aware else None, now, targets, self.config.restart_packing
        )
        self.quota = QuotaLedger(state, now)
        self.never = NeverStarts(state)
        self.starts: list[Start] = []
        self.started_allocs: list[Allocation] = []
        self.preempted: dict[str, Preemption] = {}
        self.reservations = Reservations(self.caps, now, state.running, self.started_allocs, self.quota.preempted)
        self.waiting: list[Waiting] = []
        self.blocked = False  # without backfill nothing passes a blocked job
        self.over_quota_jobs: set[str] = set()
        self._victims: VictimFinder | None = None
        self.starving_all: set[str] = set()  # every starving job (not only those promoted)

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
            job.attained_s,
            job.preemptions,
            job.estimated,
            self.now + job.limit,
        )
        self.started_allocs.append(alloc)
        self.quota.started(alloc)
        self.reservations.on_start(alloc)

    def victims(self) -> VictimFinder:
        if self._victims is None:
            self._victims = VictimFinder(
                self.state.running, self.config, self.now, self.over_quota_jobs, self.starving_all
            )
        return self._victims

    def place_in_room(self, job: JobRequest, node: str, victims: list[Allocation]) -> Fit | None:
        """Place ``job`` on ``node`` in the room of ``victims`` (released for it) where that
        delays no reservation; if it would, the victims are put back and None returned."""
        for victim in victims:
            self.placer.release(victim)
            self.reservations.on_preempt(victim, sign=-1)
        allowed = self.reservations.allowed_for(job, self.now)
        placed = self.placer.place(job, lambda n, i, s: n == node and (allowed is None or allowed(n, i, s)))
        if placed is None:
            for victim in victims:
                self.placer.restore(victim)
                self.reservations.on_preempt(victim, sign=1)
        return placed

    def try_preempt(self, job: JobRequest, cls: str, drop_reservation: bool = False) -> bool:
        """Start ``job`` in the room of running jobs it may preempt (:mod:`.preemption`)."""
        config = self.config
        finder = self.victims()
        if not finder.candidates:
            return False
        found = finder.find(job, cls, self.caps, self.quota.preempted)
        if found is None:
            return False
        node, victims = found
        if drop_reservation:
            self.reservations.cancel(job.job_id)
        placed = self.place_in_room(job, node, victims)
        if placed is None:
            if drop_reservation:
                self.reservations.restore_cancelled()
            return False
        for victim in victims:
            self.quota.preempted_alloc(victim)
            if victim.job_id in self.over_quota_jobs:
                why = f"its user is over the daily GPU-hour quota and {preemptor(job, victim)} needs the GPUs"
            elif cls == "urgent" and victim.priority_class in URGENT_VICTIM_CLASSES:
                why = f"preempted by {preemptor(job, victim, urgent=True)}"
            else:
                why = f"preempted by {preemptor(job, victim)}, which needs far less GPU time than this one has left"
            self.preempted[victim.job_id] = Preemption(
                victim.job_id, f"{why}; resumes from its checkpoint", job.job_id, config.preempt_grace_s
            )
        self.reservations.forget_events()
        finder.forget_refusals()
        self.start(job, cls, *placed)
        return True

    def preempt_for_blocked(self) -> None:
        """Step 4: blocked jobs, in order, may start in the room of jobs they may preempt.

        After the reservations of step 3 are made, so a preemption never delays one: a
        stream of short jobs preempting wherever they like would keep a node from ever
        draining for a whole-node job.
        """
        kept: list[Waiting] = []
        budget = self.config.max_preemptions_per_pass
        finder = self.victims()
        quota = self.quota
        waiting = self.waiting
        for k, w in enumerate(waiting):
            if len(self.preempted) >= budget or not finder.candidates:
                # Nothing more can preempt in this pass: the rest keep their places (a long
                # queue used to be walked to its end here, job by job).
                kept.extend(waiting[k:])
                break
            if w.kind in ("resources", "reserved"):
                cls = w.cls
                if cls == "urgent" and not quota.urgent_ok(w.job):
                    cls = "high"
                # A victim search already refused for this shape and class (and no larger
                # work) would refuse again: skip it, and the quota check before it (neither
                # changes anything; a long queue of similar blocked jobs was checked job by job).
                if finder.refuses(w.job, cls):
                    kept.append(w)
                    continue
                # Quotas again: jobs started after this one's turn in step 3 may have filled the
                # team's GPUs or, for a job that may not be preempted, the user's daily quota.
                tp = quota.team_policy(w.job.team)
                if quota.limited(tp) and quota.block(w.job, tp) is not None:
                    kept.append(w)
                    continue
                if self.try_preempt(w.job, cls, drop_reservation=w.kind == "reserved"):
                    continue
            kept.append(w)
        self.waiting[:] = kept

    def _try_preempt_legacy(self, job: JobRequest, cls: str) -> bool:
        """Urgent-only preemption as before size-aware preemption existed (``size_preemption=False``)."""
        chosen = choose_victims_legacy(
            job, self.state.running, self.caps, self.quota.preempted, self.now, self.config.preempt_min_runtime_s
        )
        if chosen is None:
            return False
        node, victims = chosen
        # Through the reservation check, as every start: an urgent job placed beside it took
        # GPUs a starving job was reserved at now, and the check did not count it for later
        # starts either (counterexample ``urgent_preemption_beside_a_reservation``).
        placed = self.place_in_room(job, node, victims)
        if placed is None:
            return False
        for victim in victims:
            self.quota.preempted_alloc(victim)
            self.preempted[victim.job_id] = Preemption(
                victim.job_id,
                f"preempted by {preemptor(job, victim, urgent=True)}; resumes from its checkpoint",
                job.job_id,
                self.config.preempt_grace_s,
            )
        self.reservations.forget_events()
        self.start(job, cls, *placed)
        return True

    def run(self) -> Plan:
        config = self.config
        quota = self.quota
        now = self.now
        fairshare = fairshare_factors(self.state)
        rows = rank_queue(self.state, now, quota.urgent_ok, fairshare)
        if config.requeued_whole_node_first:
            rows = requeued_whole_node_first(rows, self.state.nodes)
        starving: set[str] = set()
        if config.bounded_wait:
            rows, starving = promote_starving(rows, self.state, now)
        if config.starving_preempt_window_s is not None and config.size_preemption and config.preemption:
            self.starving_all = {r.job.job_id for r in starving_jobs(rows, self.state, now)}
        if config.user_gpu_hours_per_day is not None or any(
            t.user_gpu_hours_per_day is not None for t in self.state.teams.values()
        ):
            self.over_quota_jobs = quota.over_quota_jobs()
        new_preemption = config.size_preemption or bool(self.over_quota_jobs)
        failed = self.placer.failed  # the same set object all pass (cleared in place)
        refused = self.placer.refused  # likewise
        waiting = self.waiting
        add_waiting = waiting.append
        never_reason = self.never.reason
        never_known = self.never.known  # (shape id, team) -> answer, for the common case
        reservations = self.reservations
        # team -> (its policy, whether any quota applies, the users of that team whom the
        # daily quota cannot hold in this pass, its GPU cap: see below; the never-starts
        # answers by shape id, a pass-local view of ``never_known``: an int key, no tuple)
        team_info: dict[str, tuple[TeamPolicy, bool, dict[str, bool] | None, float | None, dict]] = {}
        usage_24h = self.state.user_usage_24h
        team_gpus = quota.team_gpus  # GPUs each team holds, as this pass starts jobs
        deferred: list[Ranked] = []
        starving_reserved = 0
        unknown = NeverStarts.UNKNOWN
        for row in rows:
            _, job, cls, _ = row
            team = job.team
            info = team_info.get(team)
            if info is None:
                tp = quota.team_policy(team)
                user_quota = quota.user_quota_s(tp)
                # QuotaLedger.block holds a preemptible job only when its team's GPUs leave
                # no room for it under the team's cap, or its user's past 24 h usage (fixed
                # for the pass) reaches the daily quota: that answer is kept per user here,
                # the cap checked inline, and block() asked only when one of them may hold.
                free_users = {} if user_quota is not None else None
                info = team_info[team] = (tp, quota.limited(tp), free_users, tp.max_gpus, {})
            tp, limited, free_users, cap, never_for = info
            shape = job.shape_id
            never = never_for.get(shape, unknown)
            if never is unknown:
                never = never_known.get((shape, team), unknown)
                if never is unknown:
                    never = never_reason(job)
                never_for[shape] = never
            if never is not None:
                add_waiting(Waiting(job, "never", never, None, cls, row))
                continue
            if limited:
                if free_users is not None and job.preemptible:
                    free = free_users.get(job.user)
                    if free is None:
                        free = free_users[job.user] = usage_24h.get(job.user, 0.0) + EPS < quota.user_quota_s(tp)
                    if free and (cap is None or team_gpus.get(team, 0.0) + job.gpus <= cap + EPS):
                        blocked = None
                    else:
                        blocked = quota.block(job, tp)
                else:
                    blocked = quota.block(job, tp)
                if blocked is not None:
                    if blocked.note[0] == "user" and job.preemptible:
                        deferred.append(row)  # runs as "over quota" work on idle GPUs, step 4
                        continue
                    blocked.cls, blocked.row = cls, row
                    add_waiting(blocked)
                    continue
            is_starving = job.job_id in starving if starving else False
            shape_failed = shape in failed
            if self.blocked or (shape_failed and not is_starving):
                # On a full cluster nothing of this shape fits; step 4 may still preempt for it.
                add_waiting(Waiting(job, "resources", "", None, cls, row))
                continue
            if cls == "urgent" and not quota.urgent_ok(job):
                cls = "high"  # an earlier urgent job in this pass used the allowance
            if not shape_failed:
                # The reservation check refused this shape for jobs ending this late or later
                # (``Placer.refused``; only ever set while reservations exist): place() would
                # say no at once, so skip building the check.
                refused_end = refused.get(shape)
                if refused_end is None or now + job.walltime < refused_end:
                    placed = self.placer.place(job, reservations.allowed_for(job, now), memo=True)
                    if placed is not None:
                        self.start(job, cls, *placed)
                        continue
            if config.preemption and not new_preemption and cls == "urgent" and self._try_preempt_legacy(job, cls):
                continue
            if not config.backfill:
                self.blocked = True
            drainable = (
                self.victims().releasable(job, cls, quota.preempted)
                if new_preemption and config.preemption and job.gpus > 1
                else {}
            )
            if is_starving and starving_reserved < config.starvation_reservations:
                res = reservations.reserve(job, drainable)
                if res is not None:
                    starving_reserved += 1
                    waiting.append(Waiting(job, "reserved", "starving", res.at, cls, row))
                    continue
            elif not shape_failed and len(reservations.items) - starving_reserved < config.reservations:
                res = reservations.reserve(job, drainable)
                if res is not None:
                    waiting.append(Waiting(job, "reserved", "", res.at, cls, row))
                    continue
            waiting.append(Waiting(job, "resources", "", None, cls, row))
        if config.preemption and new_preemption:
            self.preempt_for_blocked()
        for row in deferred:
            job, cls = row.job, row.cls
            team_hold = quota.block(job, quota.team_policy(job.team))
            if team_hold is not None and team_hold.note[0] == "team":  # the team filled up meanwhile
                team_hold.cls, team_hold.row = cls, row
                waiting.append(team_hold)
                continue
            if not self.blocked and job.shape_id not in failed:
                placed = self.placer.place(job, reservations.allowed_for(job, now))
                if placed is not None:
                    self.start(job, cls if cls != "urgent" else "high", *placed)
                    continue
            used = self.state.user_usage_24h.get(job.user, 0.0)
            limit = quota.user_quota_s(quota.team_policy(job.team)) or 0.0
            until = quota.user_free_at(job.user, used - limit + 2e-9)
            waiting.append(Waiting(job, "overquota", (used, limit), until, cls, row))
        eta_model = None
        if config.eta_scenarios > 0:
            holding = [a for a in self.state.running if a.job_id not in quota.preempted] + self.started_allocs
            eta_model = EtaModel(self.state, now, self.caps, holding, self.placer.drain, self.placer.targets, fairshare)
        explainer = Explainer(self.state, now, self.caps, self.quota.preempted, self.started_allocs)
        queue, wake_at = explainer.explain(
            waiting,
            {r.job.job_id: r.node for r in reservations.items},
            eta_model,
        )
        return Plan(
            starts=tuple(self.starts),
            preemptions=tuple(self.preempted[k] for k in sorted(self.preempted)),
            queue=queue,
            wake_at=wake_at,
            reservations=tuple((r.job.job_id, r.node, len(r.indices) * r.share) for r in reservations.items),
        )


def waiting_shapes(queued: tuple[JobRequest, ...], nodes: tuple[NodeInfo, ...]) -> list[Target]:
    """Whole-GPU shapes the queue asks for (GPUs, models, GPU memory), weighted by share of GPUs asked.

    Only shapes some schedulable node has enough GPUs of the allowed models and memory for: a
    shape no node can ever host (the job waits with "never") would count every node's free
    GPUs as fragmented for it, and filling a node then looks like *less* fragmentation, so
    small jobs were packed onto the nodes other waiting shapes need while a node they could
    use stayed idle (found through ``fragmentation_aware_reservation_on_shared_gpus``; GPU
    memory counts as the placer's ``fit`` counts it: a GPU of unknown memory qualifies).
    """
    demand: dict[tuple[int, tuple[str, ...], int], float] = {}
    for job in queued:
        if job.gpus >= 1:
            key = (int(round(job.gpus)), job.gpu_models, job.gpu_memory_mb)
            demand[key] = demand.get(key, 0.0) + job.gpus
    if not demand:
        return []
    hosts = [Counter((g.model, g.memory_mb) for g in n.gpus) for n in nodes if n.schedulable]
    demand = {
        (need, models, gmem): weight
        for (need, models, gmem), weight in demand.items()
        if any(sum(c for (m, mb), c in h.items() if gpu_serves(m, mb, models, gmem)) >= need for h in hosts)
    }
    total = sum(demand.values())
    if not total:
        return []
    return [(need, models, gmem, weight / total) for (need, models, gmem), weight in sorted(demand.items())]


def requeued_whole_node_first(rows: list[Ranked], nodes: tuple[NodeInfo, ...]) -> list[Ranked]:
    """``PolicyConfig.requeued_whole_node_first``: requeued jobs asking for at least the largest
    node's GPUs move to the front, behind urgent jobs, in their rank order."""
    widest = max((len(n.gpus) for n in nodes if n.schedulable), default=0)
    if not widest:
        return rows
    ids = {r.job.job_id for r in rows if r.job.preemptions and r.job.gpus >= widest - EPS and r.cls != "urgent"}
    if not ids:
        return rows
    urgent = [r for r in rows if r.cls == "urgent"]
    first = [r for r in rows if r.job.job_id in ids]
    rest = [r for r in rows if r.cls != "urgent" and r.job.job_id not in ids]
    return urgent + first + rest


def preemptor(job: JobRequest, victim: Allocation, urgent: bool = False) -> str:
    """The job that takes a victim's GPUs, as the victim's reason names it: by id within the
    victim's team, else only as another team's (the reason is the victim team's to read; an id
    of another team's job is not theirs to see)."""
    if job.team == victim.team:
        return f"{'urgent ' if urgent else ''}job {job.job_id}"
    return f"{'an urgent' if urgent else 'a'} job of another team"


def plan_fair(state: ClusterState, now: float) -> Plan:
    return FairPlanner(state, now).run()
