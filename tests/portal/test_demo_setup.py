"""`make run` runs `manage.py demo_setup` on every start: it must not undo what people changed since."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from apps.accounts.models import Membership
from apps.accounts.services import membership_remove, membership_set

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def stores(settings, tmp_path):
    settings.DATASETS_DIR = tmp_path / "datasets"


def setup() -> str:
    out = io.StringIO()
    call_command("demo_setup", stdout=out)
    return out.getvalue()


def test_a_restart_keeps_changed_passwords_roles_and_removed_members(monkeypatch):
    monkeypatch.delenv("DEMO_PASSWORD", raising=False)
    first = setup()
    User = get_user_model()
    admin, alice, bob, carol = (User.objects.get(username=u) for u in ("admin", "alice", "bob", "carol"))
    assert admin.check_password("yolo-demo") and admin.is_superuser and alice.is_staff
    assert "password of admin, alice, bob, carol: yolo-demo" in first
    admin.set_password("a-real-Secret-1")
    admin.save()
    membership_set(user=bob, team=Membership.objects.get(user=bob).team, role=Membership.Role.MANAGER)
    membership_remove(membership=Membership.objects.get(user=carol), by=None)

    again = setup()  # the next `make run`
    admin.refresh_from_db()
    assert admin.check_password("a-real-Secret-1") and not admin.check_password("yolo-demo")
    assert Membership.objects.get(user=bob).role == Membership.Role.MANAGER  # was set back to member
    assert not Membership.objects.filter(user=carol).exists()  # was added back
    assert "yolo-demo" not in again and "already there, password and teams left as they are" in again


def test_a_deleted_demo_user_comes_back_with_the_demo_password(monkeypatch):
    monkeypatch.setenv("DEMO_PASSWORD", "chosen-pw")
    setup()
    get_user_model().objects.filter(username="carol").delete()
    out = setup()
    carol = get_user_model().objects.get(username="carol")
    assert carol.check_password("chosen-pw") and Membership.objects.get(user=carol).team.slug == "robotics"
    assert "password of carol: chosen-pw" in out


def test_a_missing_bucket_is_named_as_one_not_an_outage(moto):
    """Multi-node trial M3: demo_setup against a store whose bucket was never created ended in a
    traceback calling the store "unreachable"; it says the bucket does not exist and how to make it."""
    from django.core.management.base import CommandError
    from django.test import override_settings

    from tests.s3 import s3_storages

    storages = s3_storages(moto)
    storages["artifacts"]["OPTIONS"]["bucket_name"] = "never-made"
    with override_settings(STORAGES=storages), pytest.raises(CommandError) as refused:
        setup()
    said = str(refused.value)
    assert "the bucket 'never-made' does not exist" in said and "create it first" in said, said


def test_a_team_whose_demo_name_is_another_kind_keeps_it_and_the_setup_goes_on(teams):
    """dataset_register refuses a YOLO version of a classification name, as an upload is refused: demo_setup
    (every `make run`) says so for that team and registers the others."""
    from apps.datasets.models import Dataset

    Dataset.objects.create(team=teams["robotics"], name="demo", kind=Dataset.Kind.CLASSIFY,
                           key="datasets/robotics/demo/v1", yaml_key="datasets/robotics/demo/v1/data.yaml")
    out = setup()
    assert "dataset 'demo' registered for vision:" in out
    assert "dataset 'demo' not registered for robotics: demo's versions (newest demo:v1) are classification" in out
    assert list(Dataset.objects.filter(name="demo").order_by("team__slug").values_list("team__slug", "kind")) == [
        ("robotics", "classify"), ("vision", "yolo")]
