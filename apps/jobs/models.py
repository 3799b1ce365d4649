from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class JobState(models.TextChoices):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


ACTIVE_STATES = (JobState.QUEUED, JobState.STARTING, JobState.RUNNING)
HOLDING_STATES = (JobState.STARTING, JobState.RUNNING)  # states that hold GPUs
TERMINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT)
# The job lists' state filters beside the states themselves: the portal's /jobs/, the API's
# jobs/?state= and yoloq queue --state all take these.
STATE_GROUPS = {"active": ACTIVE_STATES, "finished": TERMINAL_STATES}
STATE_FILTERS = (*STATE_GROUPS, *JobState.values)

# What the planner stores on a waiting job (``services.job_queue_info_set``).
QUEUE_INFO_FIELDS = ("queue_position", "estimated_start_at", "estimated_start_low_at", "estimated_start_high_at",
                     "reason", "priority_score", "priority_factors", "predicted_start_at", "predicted_model_start_at")


class PriorityClass(models.TextChoices):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    URGENT = "urgent"


class Job(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    task_name = models.CharField(max_length=200)
    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="jobs")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    state = models.CharField(max_length=10, choices=JobState.choices, default=JobState.QUEUED, db_index=True)
    priority_class = models.CharField(max_length=10, choices=PriorityClass.choices, default=PriorityClass.MEDIUM)
    # The class the current attempt runs as: urgent beyond the team's allowance runs as high.
    run_class = models.CharField(max_length=10, choices=PriorityClass.choices, blank=True)

    # What was asked: the user's text, and the validated spec (apps.jobs.spec.JobSpec.as_dict()).
    raw_spec = models.TextField(blank=True)
    spec = models.JSONField(default=dict)
    spec_hash = models.CharField(max_length=64, db_index=True)
    # Jobs with the same signature (model, data, imgsz, epochs, batch, GPUs) take about as
    # long: finished ones estimate the runtime of queued ones.
    runtime_signature = models.CharField(max_length=64, blank=True, db_index=True)
    idempotency_key = models.CharField(max_length=200, blank=True, default="")

    gpus = models.FloatField(verbose_name="GPUs", default=1.0, help_text="GPUs requested; < 1 is a share of one GPU")
    gpu_memory_mb = models.PositiveIntegerField(verbose_name="GPU memory (MB)", default=0)
    cpu_milli = models.PositiveIntegerField(default=0)
    memory_mb = models.PositiveIntegerField(default=0)
    timeout_s = models.PositiveIntegerField()
    retries_left = models.PositiveSmallIntegerField(default=0)

    # The current attempt. A new attempt_id is minted each time the job is (re)queued;
    # a worker refuses an attempt that is no longer current (fencing).
    attempt = models.PositiveIntegerField(default=1)
    attempt_id = models.UUIDField(default=uuid.uuid4)
    node = models.ForeignKey("cluster.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs")
    gpu_indices = models.JSONField(verbose_name="GPU indices", default=list, blank=True)
    gpu_share = models.FloatField(verbose_name="GPU share", default=1.0)

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    first_started_at = models.DateTimeField(null=True, blank=True, help_text="start of the first attempt")
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The latest attempt that chose the checkpoint it resumes from (or to start over; 0: none yet).
    # Until a later one chooses, it may still record its epoch end (jobs.services.attempt_may_record):
    # an attempt preempted before it chose hands that on to the next (review23, 12).
    # A database default too: the previous release's processes, still running during ``migrate``
    # (docs/deploy.md, Upgrades), insert jobs without naming it (review24, 2).
    resume_chosen_attempt = models.PositiveIntegerField(default=0, db_default=0)
    # The previous release's mark (the running attempt has chosen; cleared when an attempt starts),
    # kept written and read for one release, for its workers still running during ``migrate``
    # (review24, 1 and 3). Drop it in the release after this one.
    resume_chosen_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)

    error = models.TextField(blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    weights_path = models.CharField(max_length=500, blank=True)
    # Cold logs (apps/jobs/log_archive.py): the artifact key of the archive its LogChunks were moved to.
    logs_key = models.CharField(max_length=500, blank=True, default="")
    epochs_done = models.PositiveIntegerField(default=0)

    # Written by the scheduler on every planning pass.
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start_at = models.DateTimeField(null=True, blank=True)
    # The range around it (calibrated on the scheduler's track record to hold ~80 % of starts,
    # else P10-P90 of its forward simulation; docs/scheduling.md "Position, ETA, range").
    estimated_start_low_at = models.DateTimeField(null=True, blank=True)
    estimated_start_high_at = models.DateTimeField(null=True, blank=True)
    predicted_start_at = models.DateTimeField(null=True, blank=True, help_text="first ETA given; kept for accuracy")
    # The scheduler's model point behind that first ETA, before calibration on the track record
    # (apps/scheduling/policy/eta_calibration.py): what the record compares with first_started_at.
    predicted_model_start_at = models.DateTimeField(null=True, blank=True,
                                                    help_text="first ETA before calibration; kept for calibration")
    reason = models.CharField(max_length=300, blank=True)
    # The planner's score (higher starts first), not the class the user asked for (priority_class).
    # The API and admin still call it "priority".
    priority_score = models.FloatField(default=0.0, verbose_name="priority")
    priority_factors = models.JSONField(default=dict, blank=True)

    # A hyperparameter sweep (docs/sweeps.md): its parent is a job that never holds a GPU
    # (created running, no node, gpus 0: the scheduler never sees it queued) and its trials
    # are ordinary train jobs with ``parent`` set, queued like any other.
    is_sweep = models.BooleanField(default=False, help_text="a sweep parent: it runs no attempt itself")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="children",
                               db_index=False, help_text="the sweep this job is a trial of")

    # Per-job message counter shared by metrics, logs and events (WebSocket `seq`).
    seq = models.BigIntegerField(default=0)
    # Log text stored so far (all attempts); capped at JOB_LOG_MAX_BYTES (jobs.services.log_append).
    log_bytes = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["-created_at"]
        # The hot reads (tests/jobs/test_indexes.py checks their plans at 100k jobs): the queue in
        # the order the scheduler considers it, a team's or a user's jobs newest first (in
        # one state or all), and the scheduler's queued/holding jobs (``state``'s own index).
        indexes = [
            models.Index(fields=["team", "state", "-created_at"], name="job_team_state_recent"),
            models.Index(fields=["team", "-created_at"], name="job_team_recent"),
            models.Index(fields=["user", "-created_at"], name="job_user_recent"),
            # Submit counts the user's active jobs (MAX_ACTIVE_JOBS_PER_USER) on every request: one
            # seek per active state. (Not a partial index on the active states: SQLite cannot match
            # the query's bound ``state IN (?, ?, ?)`` to one and walked all the user's jobs.)
            # With the team last it also counts "my jobs" of a team (the list's page count)
            # from the index alone, where (user, state) read every one of the user's rows.
            models.Index(fields=["user", "state", "team"], name="job_user_state_team"),
            models.Index(fields=["team", "queue_position", "created_at"], condition=models.Q(state="queued"),
                         name="job_queue_order"),
            models.Index(fields=["state", "node"]),
            # Every scheduler pass reads the newest 500 succeeded jobs (the runtime model's samples;
            # through ``state``'s index alone it sorted every succeeded job).
            models.Index(fields=["state", "-finished_at"], name="job_state_finished"),
            # The scheduler's sweep step reads running sweeps on every pass; a sweep's trials.
            models.Index(fields=["state"], condition=models.Q(is_sweep=True), name="job_sweep_state"),
            models.Index(fields=["parent", "state"], condition=models.Q(parent__isnull=False), name="job_trials"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="one_job_per_idempotency_key",
            )
        ]

    def __str__(self) -> str:
        return f"{self.task_name} ({self.id})"

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def public_spec(self) -> dict:
        """The validated spec without what was resolved for the worker (absolute server paths)."""
        return {key: value for key, value in self.spec.items() if key != "resolved"}

    @property
    def public_error(self) -> str:
        """The error with team-relative names only (also for rows stored before errors were cleaned)."""
        from .paths import public_text

        return public_text(self.error, job=self)

    @property
    def rq_job_id(self) -> str:
        """Unique per placement: a placement requeued before it started keeps its attempt number
        but not its ``attempt_id``, and the same RQ id for the next one overwrote the first's RQ
        job (with the new arguments) while its queue entry stayed (chaos21: refused deliveries)."""
        return f"{self.id}-a{self.attempt}-{str(self.attempt_id)[:8]}"

    @property
    def run_dir(self):
        return settings.JOBS_DIR / str(self.id)


class JobEvent(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    seq = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    kind = models.CharField(max_length=40)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    # ``data[SAID]``: the parts of ``message`` a person typed for the team (an operator's drain
    # reason), kept as written by every reader that scrubs server paths (apps.jobs.paths).
    SAID = "said"

    class Meta:
        ordering = ["seq"]
        indexes = [models.Index(fields=["job", "seq"]),
                   # Recent events of one kind across jobs: the preemptions whose victims may still hold
                   # a node's GPUs (jobs.services.gpus_stopping_left_s, asked whenever a GPU lock is busy).
                   models.Index(fields=["kind", "created_at"], name="jobevent_kind_recent")]

    def said(self) -> list[str]:
        """What a person typed into :attr:`message` (``data["said"]``; none for most events)."""
        said = (self.data or {}).get(self.SAID)
        return [part for part in said if isinstance(part, str)] if isinstance(said, list) else []

    def public_message(self, *, job: Job | None = None) -> str:
        """The message with team-relative names only (also for rows stored before job_event
        scrubbed), what a person typed kept as typed."""
        from .paths import public_text

        return public_text(self.message, job=job, said=self.said())

    def public_data(self, *, job: Job | None = None) -> dict:
        """The data with team-relative names only; ``said`` as typed."""
        from .paths import public_value

        data = public_value({key: value for key, value in (self.data or {}).items() if key != self.SAID}, job=job)
        return {**data, self.SAID: self.said()} if self.said() else data


class MetricPoint(models.Model):
    """One epoch's metrics; upserted by (job, epoch) so a retried epoch replaces, not duplicates."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metrics")
    epoch = models.PositiveIntegerField()
    # 0: an epoch of the job this one continues, copied when it was made (apps.jobs.continuation).
    attempt = models.PositiveIntegerField()
    seq = models.BigIntegerField()
    values = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["epoch"]
        constraints = [models.UniqueConstraint(fields=["job", "epoch"], name="one_metric_point_per_epoch")]
        indexes = [models.Index(fields=["job", "seq"], name="metric_job_seq")]


class LogChunk(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_chunks")
    seq = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["seq"]
        indexes = [models.Index(fields=["job", "seq"])]


class Checkpoint(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.PositiveIntegerField()
    epoch = models.PositiveIntegerField()
    path = models.CharField(max_length=500)  # where the attempt's node wrote it (its own DATA_DIR)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    # Where the artifact store holds these bytes, so an attempt on any node can resume from it
    # (worker/checkpoint_store.py); "" while they are only on the node that wrote them.
    key = models.CharField(max_length=500, blank=True, default="")
    # Ultralytics wrote these bytes as weights/best.pt too: a resume on another node restores
    # best.pt from the newest such checkpoint (kept in the store beyond the newest three).
    best = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-epoch", "-created_at"]
        constraints = [models.UniqueConstraint(fields=["job", "epoch"], name="one_checkpoint_per_epoch")]


# The finest GPU share a job may ask for is 1/8 (apps.jobs.spec.FRACTIONS): each GPU has 8
# slots; a whole-GPU attempt holds all 8 of each of its GPUs, a 1/4 attempt 2 of one.
SLOTS_PER_GPU = 8


class GpuSlot(models.Model):
    """One share slot of one GPU held by a starting or running attempt.

    Written in the same transaction as the claim (queued → starting) and deleted in the
    one that ends the attempt (requeue, or a final state). The unique constraint is what
    makes double allocation impossible: a GPU has only ``SLOTS_PER_GPU`` slots, so two
    attempts whose shares add up to more than one GPU would need the same slot, and the
    second claim fails however many schedulers race.
    """

    node = models.ForeignKey("cluster.Node", on_delete=models.CASCADE, related_name="gpu_slots")
    gpu_index = models.PositiveSmallIntegerField(verbose_name="GPU index", )
    slot = models.PositiveSmallIntegerField()
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="gpu_slots")
    attempt_id = models.UUIDField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "GPU slot"
        ordering = ["node", "gpu_index", "slot"]
        constraints = [
            models.UniqueConstraint(fields=["node", "gpu_index", "slot"], name="one_attempt_per_gpu_slot"),
            models.CheckConstraint(condition=models.Q(slot__lt=SLOTS_PER_GPU), name="gpu_slot_in_range"),
        ]
        indexes = [models.Index(fields=["job", "attempt_id"], name="gpu_slot_attempt")]

    def __str__(self) -> str:
        return f"{self.node_id}:{self.gpu_index}/{self.slot} ← {self.job_id}"


class ExecutorAttempt(models.Model):
    """An attempt handed to an outside executor (a Slurm batch job), as that executor sees it.

    Written by the executor's agent (submit, state changes, finalize) and by the attempt's
    relay through the API (its final report). The job's own state still changes only
    through ``jobs.services``; this row is the agent's memory of the outside job.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="executor_attempts")
    attempt = models.PositiveIntegerField()
    attempt_id = models.UUIDField(unique=True)
    executor = models.CharField(max_length=20, default="slurm")
    external_id = models.CharField(max_length=100, blank=True, help_text="the Slurm job id")
    external_state = models.CharField(max_length=40, blank=True, help_text="e.g. PENDING, RUNNING, NODE_FAIL")
    external_reason = models.CharField(max_length=200, blank=True)  # Slurm's reason for its state
    submitted_at = models.DateTimeField(null=True, blank=True)
    # When the agent last asked Slurm to end it (scancel), and why: asked once, not at every look.
    scancel_sent_at = models.DateTimeField(null=True, blank=True)
    scancel_reason = models.CharField(max_length=200, blank=True, db_default="")  # the old agent's inserts (review24, 2)
    running_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # The relay's final report (exit code, outcome, finished/error events, log tail).
    report = models.JSONField(default=dict, blank=True)
    finalized_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["executor", "finalized_at"])]

    def __str__(self) -> str:
        return f"{self.executor} {self.external_id or '(not submitted)'} for {self.job_id} attempt {self.attempt}"
