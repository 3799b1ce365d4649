from __future__ import annotations

from django.db import models


class Trial(models.Model):
    """One trial of a sweep: the parameters it was given and what the search knows of it.

    The sweep is its parent job (``Job.is_sweep``); the trial's own job is an ordinary train
    job with ``parent`` = the sweep. ``(sweep, number)`` is unique and is inserted in the
    same transaction as the trial's job, so a sweep step that dies half-way, or two that
    race, can neither lose a trial nor create one twice (docs/sweeps.md).
    """

    sweep = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="sweep_trials")
    number = models.PositiveIntegerField(help_text="0-based, in the order the trials were proposed")
    job = models.OneToOneField("jobs.Job", null=True, blank=True, on_delete=models.CASCADE, related_name="trial",
                               help_text="empty when the trial could not be submitted (see note)")
    params = models.JSONField(default=dict)
    # The metric (maximised) of a finished trial: the final validation of its best weights,
    # else its best epoch. Null while it runs, and for a trial that failed or was pruned.
    value = models.FloatField(null=True, blank=True)
    # The metric per epoch as the pruner saw it ({"1": 0.12, …}), and Optuna's per-trial
    # memory (ASHA's rung values), so a restarted scheduler judges as the last one did.
    intermediate = models.JSONField(default=dict, blank=True)
    system_attrs = models.JSONField(default=dict, blank=True)
    checked_epoch = models.PositiveIntegerField(default=0, help_text="the pruner has judged the epochs up to this")
    pruned_epoch = models.PositiveIntegerField(null=True, blank=True)
    note = models.CharField(max_length=500, blank=True, help_text="why it was pruned, or could not be submitted")
    recorded = models.BooleanField(default=False, help_text="the sweep has recorded how this trial ended")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["sweep", "number"]
        constraints = [models.UniqueConstraint(fields=["sweep", "number"], name="one_trial_per_number")]

    def __str__(self) -> str:
        return f"trial {self.number} of {self.sweep_id}"

    @property
    def pruned(self) -> bool:
        return self.pruned_epoch is not None
