"""Small builders for portal tests: jobs in a given state, without the scheduler."""

from __future__ import annotations

from apps.core.strict_yaml import load_yaml
from apps.jobs.services import job_submit
from apps.jobs.spec import parse_spec
from tests.conftest import SEED_SPEC


def submit(user, *, task_name: str = "seed", epochs: int = 2, team: str = "vision", **fields):
    spec = SEED_SPEC.replace("yolo-v8s-industrial-inspection", task_name).replace("epochs=2", f"epochs={epochs}")
    spec = spec.replace("user: vision", f"user: {team}")
    document = load_yaml(spec, max_bytes=1 << 16)
    document.setdefault("allow_duplicate", True)  # the task name is not part of the duplicate check
    document.update(fields)
    job, _ = job_submit(user=user, spec=parse_spec(document), raw_spec=spec)
    return job
