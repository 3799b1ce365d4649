"""Plain inputs and outputs of the scheduling policy.

Nothing here imports Django or Redis: the live scheduler (``apps.scheduling.loop``)
and the trace simulator both build a :class:`ClusterState`, call
:func:`apps.scheduling.policy.plan`, and act on the :class:`Plan` it returns.
Times are float seconds since the epoch (or since trace start in the simulator);
the policy never reads the clock.

GPU-seconds are the unit of usage everywhere: a job holding 2 GPUs for an hour uses
7,200; a job holding half of one GPU for an hour uses 1,800.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

PRIORITY_CLASSES = ("low", "medium", "high", "urgent")
DAY_S = 86400.0
# The runtime the planner assumes for a job with no estimate at all (no history, no
# ``expected_duration``): a stated default, never the timeout (a 24 h timeout on a
# one-minute job made every ETA behind it a day late).
DEFAULT_RUNTIME_S = 3600.0

# Shape -> its number in this process (``JobRequest.shape_id``): a few hundred distinct
# shapes in a busy installation (GPUs, models, memory, CPU, RAM, image, features), but the
# image is free text, so the table is emptied when it gets large. A number is never reused
# for another shape (the counter only counts on); a shape numbered again after emptying has
# two numbers, which costs the planner's memos a miss, never a wrong answer.
_SHAPE_IDS: dict[tuple, int] = {}
_SHAPE_IDS_KEPT = 50_000
_next_shape_id = itertools.count()


def shape_id(shape: tuple) -> int:
    sid = _SHAPE_IDS.get(shape)
    if sid is None:
        if len(_SHAPE_IDS) >= _SHAPE_IDS_KEPT:
            _SHAPE_IDS.clear()
        # setdefault: two threads meeting a new shape at once get one number
        sid = _SHAPE_IDS.setdefault(shape, next(_next_shape_id))
    return sid


@dataclass(frozen=True)
class GpuInfo:
    index: int
    model: str = ""
    memory_mb: int = 0  # 0 = unknown (memory constraints are then not enforced)
    # Free memory as the node last measured it (pynvml), None = not measured (simulated).
    # A job asking for gpu_memory needs it free by both counts: what our allocations leave
    # and what the driver says (iso, issue 12: memory used outside the portal counts too).
    memory_free_mb: int | None = None


@dataclass(frozen=True)
class NodeInfo:
    name: str
    gpus: tuple[GpuInfo, ...]
    cpu_milli: int = 0  # 0 = not tracked
    memory_mb: int = 0  # 0 = not tracked
    schedulable: bool = True  # False while draining or lost
    # Why it is not schedulable, in words ("draining", "lost", "not reporting"): a job that only
    # such nodes could hold is told which, not that no node ever could (trial 14, F5).
    unschedulable_because: str = ""
    # Images (environments) the node can run; None = any (nodes of the simulator and older
    # tests). A job with an ``image`` is placed only where it is listed (iso, issue 12).
    images: frozenset[str] | None = None
    features: tuple[str, ...] = ()  # what the node advertises beyond GPUs, e.g. "tensorrt"
    # Whole GPUs only (a Slurm node: its GRES cannot be shared): no fractional job here.
    whole_gpus_only: bool = False


def runtime_limit(timeout_s: float, attained_s: float = 0.0) -> float:
    """The longest a job's next attempt can run: the worker stops it (timed out) once all its
    attempts together ran ``timeout_s`` (``worker.tasks``: the budget is the timeout less the
    earlier attempts' runtime, which is what the live inputs pass as ``attained_s``), at
    least a second; ``inf`` without a timeout (0)."""
    if not timeout_s:
        return math.inf
    return max(1.0, timeout_s - attained_s)


def assumed_walltime(walltime_s: float | None, limit_s: float) -> float:
    """The runtime the planner assumes: the estimate when known, else ``DEFAULT_RUNTIME_S``,
    never more than ``limit_s`` (:func:`runtime_limit`), at least a second."""
    w = min(walltime_s or DEFAULT_RUNTIME_S, limit_s)
    return max(1.0, float(w))


@dataclass(frozen=True)
class JobRequest:
    """A queued job as the policy sees it."""

    job_id: str
    team: str
    user: str
    submitted_at: float  # first submission; a requeued (preempted) job keeps it, so it keeps its age
    gpus: float = 1.0  # whole GPUs (1, 2, 8) or a fraction of one GPU (0.25, 0.5)
    priority_class: str = "medium"  # as requested by the user
    gpu_memory_mb: int = 0  # per GPU; 0 = no constraint beyond the fraction
    gpu_models: tuple[str, ...] = ()  # allowed GPU models, empty = any
    cpu_milli: int = 0
    memory_mb: int = 0
    image: str = ""  # the image it runs in; "" = any node's own environment
    requires: tuple[str, ...] = ()  # node features it needs, e.g. ("tensorrt",) for a TensorRT export
    timeout_s: float = 86400.0  # hard limit: the planner never assumes a job runs longer
    walltime_s: float | None = None  # remaining runtime estimate; None = no data (DEFAULT_RUNTIME_S is assumed)
    preemptible: bool = True  # the spec's ``preemptible: false`` makes it False
    attained_s: float = 0.0  # seconds of progress kept from earlier attempts (requeued jobs)
    preemptions: int = 0  # times this job has been preempted so far
    # The longest its next attempt can run (:func:`runtime_limit`: the timeout less the
    # earlier attempts' runtime; derived). Every runtime drawn for it is capped here too.
    limit: float = field(init=False, repr=False, compare=False, default=math.inf)
    # Runtime the planner assumes: the estimate when known, else DEFAULT_RUNTIME_S, never
    # more than ``limit`` (derived).
    walltime: float = field(init=False, repr=False, compare=False, default=0.0)
    # What placement looks at (``placement.shape_of``), derived once: a planning pass asks
    # for it several times per job (admission, the pass, placement, every ETA scenario).
    shape: tuple = field(init=False, repr=False, compare=False, default=())
    # ``shape`` as a number (:func:`shape_id`; this process only): the planner's sets and
    # memos are keyed by it, since a tuple's hash is computed again at every lookup (a pass
    # looks shapes up hundreds of thousands of times) and an int's is itself.
    shape_id: int = field(init=False, repr=False, compare=False, default=-1)

    def __post_init__(self) -> None:
        limit = runtime_limit(self.timeout_s, self.attained_s)
        object.__setattr__(self, "limit", limit)
        object.__setattr__(self, "walltime", assumed_walltime(self.walltime_s, limit))
        shape = (self.gpus, self.gpu_models, self.gpu_memory_mb, self.cpu_milli, self.memory_mb, self.image, self.requires)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "shape_id", shape_id(shape))

    def with_walltime(self, walltime_s: float | None) -> JobRequest:
        """``dataclasses.replace(self, walltime_s=walltime_s)``, at a fraction of the cost: a
        scheduler estimates every kept queued job again whenever the runtime model is fitted
        again (after each success), and 10,000 ``replace`` calls — every field passed to
        ``__init__`` again, the shape tuple built again — took ~70 ms of such a pass at
        10,000 queued. Only ``walltime`` derives from ``walltime_s``; the shape is the same
        tuple, numbered as ``__post_init__`` numbers it (the table may have been emptied
        since)."""
        new = object.__new__(JobRequest)
        fields = dict(self.__dict__)
        fields["walltime_s"] = walltime_s
        fields["walltime"] = assumed_walltime(walltime_s, self.limit)
        fields["shape_id"] = shape_id(self.shape)
        object.__setattr__(new, "__dict__", fields)
        return new

    def __setstate__(self, state: dict) -> None:
        """Unpickled (or copied): the number is this process's, not the one it was pickled in."""
        self.__dict__.update(state)
        object.__setattr__(self, "shape_id", shape_id(self.shape))

    @property
    def estimated(self) -> bool:
        """Whether ``walltime`` comes from an estimate (not the stated default)."""
        return self.walltime_s is not None


@dataclass(frozen=True)
class Allocation:
    """A job that holds resources now (running or starting)."""

    job_id: str
    team: str
    user: str
    node: str
    gpu_indices: tuple[int, ...]
    gpu_share: float = 1.0  # fraction of each listed GPU (1.0 = whole GPUs)
    gpu_memory_mb: int = 0  # per GPU, for shared GPUs
    cpu_milli: int = 0
    memory_mb: int = 0
    priority_class: str = "medium"  # the class it *runs as* (Start.priority_class), not the one asked for
    started_at: float = 0.0  # start of the current attempt
    expected_end: float = 0.0  # started_at + remaining-runtime estimate (DEFAULT_RUNTIME_S without one)
    preemptible: bool = False  # has a verified checkpoint, the spec allows it, and it may be requeued
    attained_s: float = 0.0  # seconds of progress kept from earlier attempts
    preemptions: int = 0  # times this job has been preempted so far
    estimated: bool = True  # False: ``expected_end`` rests on the stated default, not on an estimate
    # The latest it can end: the worker stops it at its timeout (``started_at`` +
    # ``runtime_limit``); a foreign job at its time limit. ``expected_end`` never passes it,
    # nor does any end an ETA scenario draws. ``inf`` = no bound.
    ends_by: float = math.inf

    def attained_gpu_s(self, now: float) -> float:
        """GPU-seconds of service this job has had (earlier attempts and this one)."""
        return self.gpus * (self.attained_s + max(0.0, now - self.started_at))

    @property
    def gpus(self) -> float:
        return len(self.gpu_indices) * self.gpu_share


@dataclass(frozen=True)
class TeamPolicy:
    """What managers set per team. Teams without an entry get ``PolicyConfig.default_team``."""

    shares: float = 1.0  # fair-share weight relative to sibling teams (> 0)
    max_gpus: float | None = None  # concurrent GPUs the team may hold; None = no limit
    urgent_gpu_hours_per_day: float = 8.0  # urgent GPU-hours per rolling 24 h
    urgent_max_gpus: float = 2.0  # GPUs the team may hold as urgent at once
    max_gpus_per_job: float | None = None  # overrides PolicyConfig.max_gpus_per_job
    user_gpu_hours_per_day: float | None = None  # overrides PolicyConfig.user_gpu_hours_per_day


@dataclass(frozen=True)
class PolicyConfig:
    """The scheduler configuration row (admin-editable). Defaults are the shipped values.

    Priority = Σ weight × factor, every factor in [0, 1]:

    - ``fairshare``: Fair Tree rank of (team, user) from decayed usage (1 = most under-served)
    - ``age``: time queued / ``age_cap_s``, capped at 1
    - ``size``: 1 for tiny jobs, falling with log(requested GPU-hours) to 0 at ``size_cap_gpu_hours``
    - ``class``: low 0, medium 1/3, high 2/3, urgent 1 (the class the job runs as)
    """

    policy: str = "fifo"  # "fifo" | "fair"
    # Tuned on the openb trace (docs/scheduling.md): size dominates because ordering short
    # jobs first is what cuts waiting; class and fair-share decide among similar sizes.
    weight_fairshare: int = 3000
    weight_age: int = 2000
    weight_size: int = 20000
    weight_class: int = 3000
    half_life_s: float = 7 * DAY_S  # usage decay half-life; must be > 0 (0 would silently disable fair-share)
    age_cap_s: float = 7 * DAY_S
    size_cap_gpu_hours: float = 1000.0
    user_gpu_hours_per_day: float | None = 20.0  # per user, rolling 24 h; None = no limit
    max_gpus_per_job: float | None = None  # None = no limit
    preempt_min_runtime_s: float = 600.0  # a victim must have run this long (this attempt)
    preemption: bool = True
    backfill: bool = True
    reservations: int = 2  # top blocked jobs that get a reservation (1 = EASY backfill)
    drain_aware: bool = True  # place jobs where they delay a node's emptying least, then best fit
    default_team: TeamPolicy = field(default_factory=TeamPolicy)
    # -- size-aware preemption (SRPT family; docs/scheduling.md) --
    # A job that cannot start may preempt jobs of the same or a lower class whose estimated
    # remaining GPU-seconds exceed ``preempt_work_ratio`` × (its own GPU-seconds + the
    # victim's restart cost); without estimates, by attained service (Tiresias bins).
    size_preemption: bool = False  # off until it beats the urgent-only rule (docs/scheduling.md)
    preempt_work_ratio: float = 16.0
    restart_cost_s: float = 120.0  # seconds a resumed attempt spends before making progress again
    max_preemptions_per_job: int = 1  # a job preempted this often is not preempted again...
    # ...except by a starving job (bounded waiting's test: ``priority.starving_jobs``), once the
    # job has run this long in its current attempt: the cap then holds per window, not for
    # life, so a job restarted onto a node that a whole-node job needs cannot hold it for
    # weeks. None = the cap holds for life (docs/scheduling.md, "2 December").
    starving_preempt_window_s: float | None = None
    max_preemptions_per_pass: int = 8  # victims one pass may requeue (the next pass may take more)
    preempt_grace_s: float = 900.0  # a victim stops at its next epoch end, killed after this long
    # Attained-service bins (GPU-hours) for jobs without estimates: a job may be preempted
    # by one at least two bins below it (Tiresias' discretised queues).
    attained_bins_gpu_hours: tuple[float, ...] = (1.0, 8.0, 64.0, 512.0)
    nonpreemptible_charge: float = 1.25  # usage multiplier for ``preemptible: false`` jobs
    # -- bounded waiting --
    # A job whose projected finish-time fairness (wait + runtime over its runtime on its fair
    # share of the cluster) passes ``starvation_rho`` gets a reservation (whole nodes included).
    bounded_wait: bool = False  # off until it pays for itself (docs/scheduling.md)
    starvation_rho: float = 1.5
    starvation_min_wait_s: float = 6 * 3600.0
    starvation_reservations: int = 4
    fragmentation_aware: bool = False  # placement keeps GPUs that waiting shapes need (FGD-style)
    # A requeued job (preempted before) goes, among the nodes it delays equally (drain_aware's
    # first key), to the node that drains last rather than by best fit: restarts pack onto the
    # node that already holds the longest work, so the others can drain for whole-node jobs.
    # Needs drain_aware. Off: did not move the maximum wait on 4x8 seed 3 (docs/scheduling.md,
    # "Restarts packed where the longest work runs; requeued whole-node jobs first").
    restart_packing: bool = False
    # A requeued whole-node job (preempted before; asks for at least the largest node's GPUs)
    # ranks first, behind urgent jobs: size preemption took its node for a shorter job, and the
    # node it left drains when that job ends — ranked as usual (size factor 0) it lost that
    # node to the smaller jobs ranked above it (traced on 4x8 seed 3). Off: measured on seed 3
    # only, maximum below shipped's there but not on seed 5 (docs/scheduling.md, as above).
    requeued_whole_node_first: bool = False
    # Past ``age_cap_s`` a job's size factor rises linearly towards 1 over this many seconds:
    # size' = size + (1 - size) * min(1, (waited - age_cap_s) / size_forgiveness_s), so a job
    # that asks many GPU-hours ranks, after age_cap_s + this, as if it were tiny (not a tier:
    # fair-share, class and age still order it among the small jobs). A small job (size ~ 1)
    # gains ~nothing. None = off (docs/scheduling.md, "Age past the cap forgives size"): with
    # size_preemption + the 6 h window and min_gpus 8 (7 days) it failed 4x8 seed 3 on
    # utilisation; past the stop its maximum wait was below shipped's on all eight setups.
    size_forgiveness_s: float | None = None
    # ...only for jobs asking at least this many GPUs (0 = every job: the forgiven long one-GPU
    # jobs then fill the nodes waiting whole-node jobs need; seed 3's mean 10 k -> 27 k s).
    size_forgiveness_min_gpus: float = 0.0
    # -- ETAs --
    eta_head: int = 128  # forward-simulate this many jobs at the head of the queue; below, coarse
    eta_scenarios: int = 3  # scenarios of runtime error and inflow (5 until 3 Dec.: docs); 0 = no forward simulation
    eta_runtime_sigma: float = 0.5  # lognormal sigma of runtime estimates' error
    eta_range_widen: float = 1.0  # the P10-P90 range is widened by this factor around now
    eta_max_steps: int = 400  # events one forward scenario may process
    # A head job some scenario did not start within eta_max_steps takes the coarse estimate from
    # now (EtaModel.coarse). True: its wait stretched by 1 / (1 - load) for the inflow that would
    # outrank it, as below the head; False: the pooled sweep's wait as it is (the scenarios'
    # floor still applies). The stretch gave 5-13 days for jobs starting after 1-6; off since
    # 5 December (docs/scheduling.md, eta28b: same starts, point error lower on all six replays,
    # range narrower on five, 2 % wider on tuning seed 3, coverage >= 0.80 on all).
    eta_after_budget_stretch: bool = False
    # Below the forward head the coarse wait (the pooled sweep's) is stretched by 1 / (1 - load)
    # for the inflow that would outrank the job (EtaModel.coarse, Explainer.explain inlined), and
    # the carry from the head's last job of each shape is taken against it. False: the sweep's
    # wait as it is (the carry still scales it up to the head's forward result). Off measured on
    # six replays (docs/scheduling.md, eta29): ranges narrower on all, the shown point's error up
    # on held-out seeds 11 and 47 (the calibration scales it by errors learned on the head), so on.
    eta_below_head_stretch: bool = True
    # The outranking load that stretch stops growing at: the stretch is at most 1 / (1 - this)
    # (0.9: x10; 0.5: x2). Only below the head (the after-budget stretch keeps 0.9). x3 (2/3)
    # measured narrower on all six replays but held-out seed 47's point error +3.3 % (the
    # calibration's top bucket scales the few capped points down with it): stays 0.9
    # (docs/scheduling.md, "A partial inflow stretch below the forward head", eta29b).
    eta_below_head_load_max: float = 0.9
    eta_inflow_horizon_s: float = 7 * DAY_S  # sampled arrivals stop here
    # The point and range are calibrated on the track record (``ClusterState.eta_history``,
    # policy/eta_calibration.py): the range holds this share of recent similar jobs' actual
    # starts. Above the 0.8 aimed at because waits drift (a burst is learned only as its jobs
    # start): 0.88 measured 0.80-0.85 on the tuning replays (docs/scheduling.md).
    # 0 = off (the forward simulation's point and P10-P90 as they come).
    eta_coverage: float = 0.88
    eta_calibration_min: int = 30  # records a predicted-wait bucket needs for its own interval

    def __post_init__(self) -> None:
        if not self.half_life_s or self.half_life_s <= 0:
            raise ValueError("half_life_s must be > 0: a zero half-life would switch fair-share off")
        if self.age_cap_s <= 0 or self.size_cap_gpu_hours <= 0:
            raise ValueError("age_cap_s and size_cap_gpu_hours must be > 0")
        for name in (
            "weight_fairshare",
            "weight_age",
            "weight_size",
            "weight_class",
            "reservations",
            "max_preemptions_per_job",
            "max_preemptions_per_pass",
            "starvation_reservations",
            "eta_head",
            "eta_scenarios",
            "eta_calibration_min",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer")
        if self.starving_preempt_window_s is not None and self.starving_preempt_window_s < 0:
            raise ValueError("starving_preempt_window_s must be >= 0 seconds, or None")
        if self.size_forgiveness_s is not None and not self.size_forgiveness_s > 0:
            raise ValueError("size_forgiveness_s must be > 0 seconds, or None")
        if not 0.0 <= self.eta_coverage < 1.0:
            raise ValueError("eta_coverage must be in [0, 1): the share of starts the ETA range should hold")

    def team(self, teams: Mapping[str, TeamPolicy], name: str) -> TeamPolicy:
        return teams.get(name, self.default_team)


@dataclass(frozen=True)
class ClusterState:
    """Everything one planning pass looks at. The live scheduler fills it from the database.

    - ``nodes``: every known node with its GPUs (unschedulable ones are kept but skipped).
    - ``running``: every allocation holding resources (starting or running), with
      ``priority_class`` = the class it runs as and ``expected_end`` = start + walltime.
    - ``queued``: every queued job (including preempted/requeued ones).
    - ``usage``: decayed GPU-seconds per ``(team, user)``, already decayed to ``now`` with
      ``config.half_life_s`` (see :class:`~.usage.DecayedUsage`); include the part of
      running jobs consumed so far. Missing pairs count as 0.
    - ``user_usage_24h``: GPU-seconds each user consumed in ``(now - 24 h, now]`` (finished
      and running jobs, all teams). See :class:`~.usage.RollingUsage`.
    - ``user_usage_expiry``: optional, per user, ``(time, gpu_seconds)`` pairs saying when
      each part of ``user_usage_24h`` leaves the window (``RollingUsage.expiries``); used
      only to say *until when* a user is over quota. Missing = no time in the reason.
    - ``team_urgent_usage_24h``: GPU-seconds each team ran *as urgent* in the last 24 h.
    - ``teams``: per-team policy (shares, limits, urgent allowance).
    - ``inflow``: jobs submitted in the last ``inflow_window_s`` (queued, running or
      finished), the sample of arrivals the ETA model expects to continue: a queued job's
      range accounts for higher-priority work still to come. Empty = no inflow assumed.
    - ``runtime_sigma``: the runtime estimates' measured error, for the ETA ranges.
    - ``eta_history``: ``(predicted wait, actual wait)`` seconds of recently started jobs
      that waited, oldest first: the first point ETA they were given against their first
      start. The ETA ranges are calibrated on it (policy/eta_calibration.py). Empty = the
      forward simulation's range as it comes.
    - ``explain_only``: leave it None in the live scheduler.
    """

    nodes: tuple[NodeInfo, ...]
    running: tuple[Allocation, ...] = ()
    queued: tuple[JobRequest, ...] = ()
    config: PolicyConfig = field(default_factory=PolicyConfig)
    usage: Mapping[tuple[str, str], float] = field(default_factory=dict)
    user_usage_24h: Mapping[str, float] = field(default_factory=dict)
    user_usage_expiry: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    team_urgent_usage_24h: Mapping[str, float] = field(default_factory=dict)
    teams: Mapping[str, TeamPolicy] = field(default_factory=dict)
    # None = explain every queued job (the live scheduler). A set of job ids = ``Plan.queue``
    # holds entries for those jobs only (positions and ETAs still account for the whole
    # queue); the simulator passes the jobs that just arrived, to skip formatting the rest.
    explain_only: frozenset[str] | None = None
    inflow: tuple[JobRequest, ...] = ()
    inflow_window_s: float = DAY_S
    runtime_sigma: float | None = None  # error of the runtime estimates (lognormal); None = config.eta_runtime_sigma
    eta_history: tuple[tuple[float, float], ...] = ()  # (predicted wait, actual wait) of started jobs, oldest first


@dataclass(frozen=True)
class Start:
    job_id: str
    node: str
    gpu_indices: tuple[int, ...]
    gpu_share: float = 1.0
    priority_class: str = ""  # the class it runs as (urgent may be demoted to high); store on the allocation


@dataclass(frozen=True)
class Preemption:
    """Requeue this running job (resume from its checkpoint; not charged a retry).

    Graceful: the victim is asked to stop at its next epoch end (so no completed epoch is
    lost) and is killed if it has not stopped ``grace_s`` seconds after being asked; the
    job that needs its GPUs starts once it has stopped.
    """

    job_id: str
    reason: str
    by_job_id: str = ""  # the job that needs its resources
    grace_s: float = 0.0


@dataclass(frozen=True)
class QueueEntry:
    job_id: str
    position: int  # 1-based, in the order the policy considers jobs
    priority: float = 0.0
    factors: Mapping[str, float] = field(default_factory=dict)
    estimated_start: float | None = None  # None = cannot say (never fits, or no end in sight)
    reason: str = ""
    reserved_node: str | None = None  # set when this job holds a backfill reservation
    reserved_at: float | None = None  # the reservation's start time (the ETA may be later: inflow)
    # A range around ``estimated_start``: from the track record where there is one (holding
    # ``config.eta_coverage`` of recent similar starts, policy/eta_calibration.py), else P10-P90
    # of forward-simulated scenarios or the coarse estimate's spread; None where there is no ETA.
    estimated_start_low: float | None = None
    estimated_start_high: float | None = None
    # The model's own point before calibration on the track record (policy/eta_calibration.py):
    # what the record compares with the actual start. Equal to ``estimated_start`` when uncalibrated.
    estimated_start_model: float | None = None


@dataclass(frozen=True)
class Plan:
    starts: tuple[Start, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    # Every job not started by this plan; with ``ClusterState.explain_only`` (the simulator's) only
    # those jobs — a bench that wants every waiting job's rank reads the pass's order elsewhere
    # (bench/why_waited.py wraps ``Explainer.explain``).
    queue: tuple[QueueEntry, ...] = ()
    wake_at: float | None = None  # plan again by then even without events (a quota frees up)
    # The pass's backfill reservations: (job id, node, GPUs it holds there). The queue entries
    # say the same for the jobs they explain; this covers every one (the simulator's
    # work-conservation figure counts GPUs held free for them).
    reservations: tuple[tuple[str, str, float], ...] = ()
