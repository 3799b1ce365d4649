"""A job page hides "Continue from epoch N" once the job's model version is deleted, and names the
deleted input as it names a deleted dataset: "(deleted)", not a link to a 404 (review28)."""

from __future__ import annotations

import re

import pytest

from tests.jobs.test_continue import from_registered_model, submit  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


def test_a_deleted_model_version_is_named_not_linked_on_the_job_page(from_registered_model, alice, client):  # noqa: F811
    from apps.registry.models import ModelVersion
    from apps.registry.services import model_version_delete

    cancelled, _ = from_registered_model
    version = ModelVersion.objects.get(name="base", version=1)
    pk = version.pk
    model_version_delete(version=version, by=alice)
    client.force_login(alice)
    page = client.get(f"/jobs/{cancelled.pk}/").content.decode()
    assert 'id="continue-button"' not in page
    assert client.get(f"/models/{pk}/").status_code == 404  # where the Inputs' link goes
    model_row = re.search(r"<dt>Model</dt><dd>(.*?)</dd>", page).group(1)
    assert f"/models/{pk}/" not in model_row and "deleted" in model_row, model_row
