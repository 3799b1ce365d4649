from __future__ import annotations

from django.db import models


class UtilisationHour(models.Model):
    """The cluster over one hour, summed over the samples the scheduler took in it (about one a
    minute): allocation = allocated_gpu_sum / gpu_sum, utilisation = utilisation_sum / gpu_sum.
    Sums (not means) so that a sample is one conditional UPDATE and hours roll up into days."""

    hour = models.DateTimeField(unique=True)
    samples = models.PositiveIntegerField(default=0)
    gpu_sum = models.FloatField(default=0.0, help_text="GPUs on live nodes, summed over samples")
    allocated_gpu_sum = models.FloatField(default=0.0, help_text="GPU shares held by jobs, summed")
    utilisation_sum = models.FloatField(default=0.0, help_text="pynvml utilisation (0..1) of live GPUs, summed")
    running_jobs_sum = models.FloatField(default=0.0)
    queued_jobs_sum = models.FloatField(default=0.0)

    class Meta:
        ordering = ["-hour"]

    def __str__(self) -> str:
        return f"cluster at {self.hour:%Y-%m-%d %H}:00"

    def mean(self, field: str) -> float:
        return getattr(self, field) / self.samples if self.samples else 0.0

    @property
    def allocation(self) -> float:
        return self.allocated_gpu_sum / self.gpu_sum if self.gpu_sum else 0.0

    @property
    def utilisation(self) -> float:
        return self.utilisation_sum / self.gpu_sum if self.gpu_sum else 0.0
