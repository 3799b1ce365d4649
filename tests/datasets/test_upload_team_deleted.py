"""A dataset upload in progress while a superuser deletes its team leaves nothing behind (left31 left).

The upload reserves its storage (the team's row locked), then extracts and checks the archive
unlocked, then registers the version. A team deleted in between (it owned no version yet, so the
deletion was allowed) made the registration fail at its commit (the foreign keys are checked
then), after the extracted folder had been renamed to ``<name>/v<N>``: the cleanup removed only
the staging folder, and the version's files stayed with no row pointing at them. Real parts:
the upload service, Django's deletion of the team (as the admin's delete does), both databases'
commit-time foreign-key checks; the deletion happens while the archive is being extracted (the
upload's own file object, read by the extraction, runs it once the storage is reserved)."""

from __future__ import annotations

import io

import pytest

from apps.accounts.models import StorageCharge, Team
from apps.datasets.archive import ArchiveRejected
from apps.datasets.models import Dataset
from apps.datasets.services import dataset_upload

from .archives import make_zip, valid_files

pytestmark = pytest.mark.django_db(transaction=True)


class TeamDeletedMeanwhile(io.BytesIO):
    """The uploaded zip; its first read (``extracting``: the first after the upload reserved its
    storage, else the inspection's first) deletes the team."""

    def __init__(self, content: bytes, team: Team, when: str):
        super().__init__(content)
        self.team, self.when, self.deleted = team, when, False

    def read(self, *args):
        reserved = (
            self.when != "extracting"
            or StorageCharge.objects.filter(key__startswith=f"upload:{self.team.slug}:").exists()
        )
        if not self.deleted and reserved:
            self.deleted = True
            Team.objects.get(pk=self.team.pk).delete()
        return super().read(*args)


@pytest.mark.parametrize("when", ["extracting", "inspecting"])
def test_an_upload_whose_team_was_deleted_meanwhile_is_refused_and_leaves_no_files(
    when, bob, teams, settings, tmp_path
):
    settings.DATASETS_DIR = tmp_path / "datasets"
    team = teams["vision"]
    content = make_zip(valid_files())
    upload = TeamDeletedMeanwhile(content, team, when)

    with pytest.raises(ArchiveRejected) as refused:
        dataset_upload(user=bob, team=team, name="pcb", upload=upload, size=len(content))

    assert upload.deleted and not Team.objects.filter(pk=team.pk).exists()
    assert refused.value.report()["team"] == [
        "team vision was deleted while this upload was being checked: nothing was stored"
    ]
    assert not Dataset.objects.exists() and not StorageCharge.objects.exists()
    left = sorted(str(p.relative_to(settings.DATASETS_DIR)) for p in settings.DATASETS_DIR.rglob("*"))
    assert left == []
