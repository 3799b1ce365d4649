from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError

from .models import UsageRecord


def usage_charge(job, *, ended_at: datetime) -> UsageRecord | None:
    """Charge the job's current attempt for the GPU time it held (once per attempt), under the
    class it ran as: an urgent job demoted to high beyond its team's allowance is not charged
    to the urgent allowance."""
    if job.started_at is None:
        return None
    seconds = max(0.0, (ended_at - job.started_at).total_seconds()) * job.gpus
    try:
        record, _ = UsageRecord.objects.get_or_create(
            job=job, attempt=job.attempt,
            defaults={"team_id": job.team_id, "user_id": job.user_id, "priority_class": job.run_class or job.priority_class,
                      "gpu_seconds": seconds, "started_at": job.started_at, "ended_at": ended_at},
        )
    except IntegrityError:
        return UsageRecord.objects.filter(job=job, attempt=job.attempt).first()
    return record
