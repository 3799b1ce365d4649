"""The scheduler configuration refuses what makes no sense and warns about what stops everyone
(leftover: all-zero priority weights and a zero site GPU limit saved without a word)."""

from __future__ import annotations

import pytest

from apps.scheduling.models import SchedulerConfig
from tests.conftest import admin_client
from tests.security.test_admin_audit import form_data

pytestmark = pytest.mark.django_db

WEIGHTS = ["weight_fairshare", "weight_age", "weight_size", "weight_class"]


def post_config(superuser, **values):
    config = SchedulerConfig.current()
    client = admin_client(superuser)
    url = f"/admin/scheduling/schedulerconfig/{config.pk}/change/"
    return client.post(url, form_data(client, url) | {name: str(value) for name, value in values.items()}, follow=True)


def test_all_zero_weights_under_the_fair_policy_are_refused_at_the_weight_fields(superuser):
    response = post_config(superuser, policy="fair", **dict.fromkeys(WEIGHTS, 0))
    form = response.context["adminform"].form
    assert sorted(form.errors) == sorted(WEIGHTS), form.errors
    assert "all four priority weights are 0" in form.errors["weight_size"][0]
    assert SchedulerConfig.current().weight_size != 0
    # One weight above 0 is an order; fifo does not read the weights (both kept in this test so
    # that each test here fails on the code before the refusal).
    post_config(superuser, policy="fair", **dict.fromkeys(WEIGHTS, 0) | {"weight_age": 1})
    assert SchedulerConfig.current().weight_age == 1
    post_config(superuser, policy="fifo", **dict.fromkeys(WEIGHTS, 0))
    assert SchedulerConfig.current().weight_age == 0


@pytest.mark.parametrize("field, value", [("max_gpus_per_job", 0), ("max_gpus_per_job", -1),
                                          ("user_gpu_hours_per_day", -1), ("default_urgent_max_gpus", -2),
                                          ("default_urgent_gpu_hours_per_day", -0.5)])
def test_a_zero_or_negative_site_limit_is_refused_at_its_field(superuser, field, value):
    response = post_config(superuser, **{field: value})
    form = response.context["adminform"].form
    assert list(form.errors) == [field], form.errors
    assert getattr(SchedulerConfig.current(), field) != value


def test_zero_user_gpu_hours_per_day_is_saved_with_a_warning_that_it_stops_everyone(superuser):
    response = post_config(superuser, user_gpu_hours_per_day=0)
    assert SchedulerConfig.current().user_gpu_hours_per_day == 0
    said = [str(m) for m in response.context["messages"]]
    assert any(m.startswith("user GPU-hours per day 0: no user may start a job") for m in said), said
    response = post_config(superuser, user_gpu_hours_per_day=20)
    assert not [m for m in response.context["messages"] if "GPU-hours per day" in str(m)]


def test_the_sfwrq_settings_are_saved_from_the_admin_change_page_and_reach_the_policy(superuser):
    """Issue 14's candidate sfwrq can be turned on by an operator (ChangedFieldsSaveAdmin writes
    the changed fields: each must be on the form); a zero forgiveness is refused at its field."""
    response = post_config(superuser, size_forgiveness_hours=0)
    form = response.context["adminform"].form
    assert list(form.errors) == ["size_forgiveness_hours"], form.errors
    assert SchedulerConfig.current().size_forgiveness_hours is None
    response = post_config(superuser, size_preemption="on", starving_preempt_window_hours=6,
                           size_forgiveness_hours=168, size_forgiveness_min_gpus=8, requeued_whole_node_first="on")
    assert "adminform" not in response.context or not response.context["adminform"].form.errors
    config = SchedulerConfig.current()
    assert (config.size_forgiveness_hours, config.size_forgiveness_min_gpus, config.requeued_whole_node_first) == (
        168, 8, True)
    policy = config.to_policy()
    assert policy.size_forgiveness_s == 168 * 3600 and policy.size_forgiveness_min_gpus == 8
    assert policy.requeued_whole_node_first and policy.size_preemption
