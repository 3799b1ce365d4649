"""A val job's dataloader workers have the training's one limit, TRAIN_MAX_WORKERS (the parser
allowed 0–64 and only training jobs were checked against the setting)."""

from __future__ import annotations

import pytest

from tests.portal.test_job_modes import pcb, stores  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db


def test_a_val_jobs_workers_has_the_same_limit(bob, pcb, settings):  # noqa: F811
    """A val job's workers were only the parser's 0–64: 64 dataloader processes passed."""
    from apps.jobs.services import job_submit
    from apps.jobs.spec import SpecError, parse_spec

    document = {
        "task_name": "v",
        "command": f"yolo val model={pcb.reference} data=demo workers=9",
        "user": "vision",
        "resources": {"gpu": 1},
    }
    with pytest.raises(SpecError) as refused:
        job_submit(user=bob, spec=parse_spec(document))
    assert refused.value.errors == {
        "command.workers": "is 9; the limit is 8 dataloader workers per job (TRAIN_MAX_WORKERS)"
    }
    settings.TRAIN_MAX_WORKERS = 9
    assert job_submit(user=bob, spec=parse_spec(document))[0].pk
