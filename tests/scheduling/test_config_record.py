"""The record of a lowered preemption grace (SchedulerConfig.save, read by the GPU-lock lookback:
jobs.services.gpus_stopping_left_s) is kept whoever saves when: a save that read the row while
another save was in flight, and the bulk paths that would write the grace past it (left31).

Real parts: two database connections (a thread), the row lock SchedulerConfig.save takes."""

from __future__ import annotations

import threading

import pytest
from django.db import NotSupportedError, connection, transaction

from apps.scheduling.models import SchedulerConfig

pytestmark = pytest.mark.timeout(60)


@pytest.mark.django_db(transaction=True)
def test_a_save_that_read_the_row_while_a_raise_was_being_saved_records_that_raise_when_it_lowers_it():
    """review30: save() read the row, then wrote it, unlocked. An admin raised the grace 600 s to
    3600 s; another admin's save of something else (their form still says 600 s) read the row
    before that raise committed and wrote after it: the grace went back to 600 s with no record of
    the 3600 s that victims preempted in between may still run (their worker gives them that). A
    save now reads the row locked, after the raise: its 600 s is a lowering from 3600 s, recorded."""
    config = SchedulerConfig.current()
    config.preempt_grace_s = 600
    config.save()
    raising, stale = SchedulerConfig.objects.get(pk=config.pk), SchedulerConfig.objects.get(pk=config.pk)
    raising.preempt_grace_s = 3600
    stale.weight_age = 7
    failed = []

    def other_admin():
        try:
            stale.save()
        except Exception as exc:  # noqa: BLE001 (the assertion below says what)
            failed.append(exc)
        finally:
            connection.close()

    other = threading.Thread(target=other_admin)
    with transaction.atomic():
        raising.save()
        other.start()
        other.join(1.0)  # it reads the row now (unlocked) or waits for this transaction (locked)
    other.join(30)

    assert not other.is_alive() and failed == []
    config.refresh_from_db()
    assert (config.preempt_grace_s, config.weight_age) == (600, 7)
    assert config.preempt_grace_lowered_from_s == 3600 and config.preempt_grace_lowered_at is not None


@pytest.mark.django_db
def test_a_bulk_write_of_the_grace_is_refused_naming_save_and_other_fields_still_update():
    """QuerySet.update() and bulk_update() write the row without save(): a lowering went unrecorded."""
    config = SchedulerConfig.current()
    config.preempt_grace_s = 60
    with pytest.raises(NotSupportedError, match=r"preempt_grace_s is changed with SchedulerConfig\.save\(\)"):
        SchedulerConfig.objects.update(preempt_grace_s=60)
    with pytest.raises(NotSupportedError, match=r"preempt_grace_s is changed with SchedulerConfig\.save\(\)"):
        SchedulerConfig.objects.bulk_update([config], ["preempt_grace_s", "weight_age"])
    config.refresh_from_db()
    assert config.preempt_grace_s == SchedulerConfig._meta.get_field("preempt_grace_s").default

    assert SchedulerConfig.objects.update(user_gpu_hours_per_day=12) == 1
    assert SchedulerConfig.objects.get().user_gpu_hours_per_day == 12
