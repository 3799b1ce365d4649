"""Every list with a fixed order pages as jobs/ does (trial 32, P1): its ``next`` link carries on
after the last item shown (``?before=<id>``), so items added between two pages neither repeat
one already read nor hide one (page 32). With ``?offset=`` links, models/, datasets/, audit/,
notifications/deliveries/ and tokens/ repeated the items an arrival pushed down."""

from __future__ import annotations

import pytest

from apps.accounts.models import AuditEntry
from apps.accounts.services import token_create
from apps.datasets.models import Dataset
from apps.notifications.models import Channel, Delivery
from apps.registry.models import ModelVersion
from tests.conftest import api_client

pytestmark = pytest.mark.django_db


def add_model(team, n: int):
    return ModelVersion.objects.create(team=team, name="pcb", version=n, weights_key=f"models/pcb-{n}.pt")


def add_dataset(team, n: int):
    return Dataset.objects.create(team=team, name="rects", version=n, key=f"datasets/rects-{n}")


def add_audit(team, n: int):
    return AuditEntry.objects.create(team=team, action=AuditEntry.Action.CHANNEL_TEST, message=f"entry {n}")


def add_delivery(user, n: int):
    channel, _ = Channel.objects.get_or_create(
        user=user, name="hook", kind="webhook", defaults={"target": "https://hooks.example.com/x"}
    )
    return Delivery.objects.create(channel=channel, event="test", cause=f"test:{n}")


def add_token(user, n: int):
    return token_create(user=user, name=f"ci-{n}")[0]


# list → (its URL, who reads it, how to add the n-th item for them / for another team, the id's word)
LISTS = {
    "models": ("/api/v1/models/", "bob", lambda t, u, n: add_model(t, n), "model version"),
    "datasets": ("/api/v1/datasets/", "bob", lambda t, u, n: add_dataset(t, n), "dataset"),
    "audit": ("/api/v1/audit/", "alice", lambda t, u, n: add_audit(t, n), "audit entry"),
    "deliveries": ("/api/v1/notifications/deliveries/", "bob", lambda t, u, n: add_delivery(u, n), "delivery"),
    "tokens": ("/api/v1/tokens/", "bob", lambda t, u, n: add_token(u, n), "token"),
}


def ids_of(client, url: str, **params) -> tuple[list, str | None]:
    response = client.get(url, params)
    assert response.status_code == 200, response.content
    body = response.json()
    return [item["id"] for item in body["results"]], body["next"]


@pytest.mark.parametrize("name", list(LISTS))
def test_items_added_between_two_pages_neither_repeat_nor_hide_one(name, teams, request):
    url, reader, add, _ = LISTS[name]
    user = request.getfixturevalue(reader)
    client = api_client(user)  # tokens/: the client's own token is the list's oldest item
    before = [add(teams["vision"], user, n) for n in range(1, 6)]
    expected, _ = ids_of(client, url, limit=1000)
    seen, link = ids_of(client, url, limit=2)
    for n in range(6, 9):  # a newer item, or a model's / dataset's newer version: listed first
        add(teams["vision"], user, n)
    while link:
        page, link = ids_of(client, link)
        seen += page
    assert len(expected) >= len(before)
    assert seen == expected  # each item of the list as it was, once, in order


@pytest.mark.parametrize("name", list(LISTS))
def test_a_before_id_of_another_team_s_item_is_no_such_item(name, teams, request, carol):
    url, reader, add, item = LISTS[name]
    user = request.getfixturevalue(reader)
    client = api_client(user)
    add(teams["vision"], user, 1)
    theirs = add(teams["robotics"], carol, 2)
    response = client.get(url, {"before": str(theirs.pk)})
    assert response.status_code == 400, response.content
    [problem] = response.json()["before"]
    assert problem.startswith(f"no {item}"), problem
    unknown = client.get(url, {"before": "987654321"})
    assert unknown.json() == response.json()  # the same words as an id that does not exist
    for bad in ("abc", "9" * 30, "１２"):  # a word, past 64 bits (was an OverflowError on SQLite), fullwidth
        response = client.get(url, {"before": bad})
        assert response.status_code == 400, (bad, response.content)
        assert response.json()["before"][0].startswith(f"must be {'an' if item[0] in 'aeiou' else 'a'} {item} id")


def test_audit_s_after_and_before_are_not_given_together(alice):
    response = api_client(alice).get("/api/v1/audit/", {"after": "1", "before": "2"})
    assert response.status_code == 400
    assert list(response.json()) == ["before"]


@pytest.mark.parametrize(
    "path",
    ["/api/v1/models/", "/api/v1/datasets/", "/api/v1/audit/", "/api/v1/notifications/deliveries/", "/api/v1/tokens/"],
)
def test_the_schema_documents_the_cursor(bob, path):
    paths = api_client(bob).get("/api/v1/schema/", {"format": "json"}).json()["paths"]
    names = {p["name"] for p in paths[path]["get"]["parameters"]}
    assert {"before", "limit", "offset"} <= names
