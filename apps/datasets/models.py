from __future__ import annotations

from django.db import models


class Dataset(models.Model):
    """A YOLO dataset (data.yaml + files) a team may train on, referenced by name in specs."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="datasets")
    name = models.SlugField(max_length=100)
    yaml_path = models.CharField(max_length=500, help_text="absolute path of data.yaml")
    num_images = models.PositiveIntegerField(default=0)
    num_classes = models.PositiveIntegerField(default=0)
    description = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__slug", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="one_dataset_name_per_team")]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.name}"
