"""A job's output, events and error are stored text: a NUL in them is kept visible as U+FFFD."""

from __future__ import annotations

import pytest

from apps.jobs.models import JobEvent, LogChunk
from apps.jobs.services import job_event, log_append

from .factories import make_job

pytestmark = pytest.mark.django_db


def test_a_nul_in_a_jobs_output_and_events_is_stored_as_a_replacement_character(teams, bob):
    """The child's output is decoded as UTF-8, where NUL is a character: on PostgreSQL, which stores
    none in text, a line holding one (a class name Ultralytics printed from uploaded weights) failed
    the worker's write (trial28 F8)."""
    job = make_job(team=teams["vision"], user=bob, state="running")
    log_append(job, "all  wid\x00get  0.5\n")
    job_event(job, "note", "class wid\x00get", {"names": ["wid\x00get"]})
    assert LogChunk.objects.get(job=job).text == "all  wid\ufffdget  0.5\n"
    event = JobEvent.objects.get(job=job, kind="note")
    assert (event.message, event.data["names"]) == ("class wid\ufffdget", ["wid\ufffdget"])
