"""The jobs API: every read scoped to the caller's teams; roles decide who may act."""

from __future__ import annotations

import pytest

from apps.jobs.models import Job, JobState
from tests.conftest import SEED_SPEC, api_client, make_user

from .factories import make_job

pytestmark = pytest.mark.django_db

JOB_ENDPOINTS = [
    ("get", "/api/v1/jobs/{id}/"),
    ("get", "/api/v1/jobs/{id}/metrics/"),
    ("get", "/api/v1/jobs/{id}/logs/"),
    ("get", "/api/v1/jobs/{id}/events/"),
    ("get", "/api/v1/jobs/{id}/weights/"),
    ("post", "/api/v1/jobs/{id}/cancel/"),
    ("post", "/api/v1/jobs/{id}/requeue/"),
    ("post", "/api/v1/jobs/{id}/class/"),
]


@pytest.fixture
def bobs_job(bob, teams):
    return make_job(team=teams["vision"], user=bob, state=JobState.RUNNING)


def test_a_member_submits_the_seed_spec(bob, demo_registered):
    response = api_client(bob).post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["state"], body["team"], body["user"]) == ("queued", "vision", "bob")


def test_the_same_spec_as_json_is_accepted(bob, demo_registered):
    import yaml

    response = api_client(bob).post("/api/v1/jobs/", yaml.safe_load(SEED_SPEC), format="json")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("body", [{"__doc__": 1}, {"__doc__": {}, "__raw__": "x"}])
def test_a_json_body_with_the_yaml_parsers_keys_is_a_spec_like_any_other(bob, demo_registered, body):
    """``{"__doc__": 1}`` was taken for the YAML parsers' wrapper (a dict with that key) and its
    missing ``__raw__`` was a KeyError: a 500 (fast29). Now its keys are a spec's unknown fields."""
    response = api_client(bob).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    assert "__doc__" in response.json(), response.json()


def test_a_training_timeout_under_the_minimum_is_refused_naming_it_and_the_minimum(bob, demo_registered):
    """A 1-second training only ever timed out while it started (trial23: 0.0001 hours on the form)."""
    response = api_client(bob).post("/api/v1/jobs/", SEED_SPEC.replace("timeout: 3600", "timeout: 59"),
                                    content_type="application/yaml")
    assert response.status_code == 400
    assert response.json()["timeout"] == [
        "is 59 s; a training's timeout is at least 60 s (1 min, MIN_TRAIN_TIMEOUT_S): its process starts and loads "
        "the model first, so a shorter one ends it before it trains"]
    accepted = api_client(bob).post("/api/v1/jobs/", SEED_SPEC.replace("timeout: 3600", "timeout: 60"),
                                    content_type="application/yaml")
    assert accepted.status_code == 201, accepted.content


def test_the_training_timeout_minimum_is_a_setting(bob, demo_registered, settings):
    settings.MIN_TRAIN_TIMEOUT_S = 5
    response = api_client(bob).post("/api/v1/jobs/", SEED_SPEC.replace("timeout: 3600", "timeout: 5"),
                                    content_type="application/yaml")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("key", ["team", "user"])
def test_a_team_the_submitter_is_not_in_is_refused_at_the_key_that_named_it(bob, demo_registered, key):
    """`team: robotics` was refused under `user` (CI trial 17, H7)."""
    spec = SEED_SPEC.replace("user: vision", f"{key}: robotics")
    response = api_client(bob).post("/api/v1/jobs/", spec, content_type="application/yaml")
    assert response.status_code == 400 and response.json() == {key: ["you are not a member of a team named 'robotics'"]}


@pytest.mark.parametrize(("method", "url"), JOB_ENDPOINTS)
def test_another_teams_job_is_not_found_on_every_endpoint(method, url, carol, bobs_job):
    response = getattr(api_client(carol), method)(url.format(id=bobs_job.pk))
    assert response.status_code == 404
    assert "detail" in response.json()
    bobs_job.refresh_from_db()
    assert bobs_job.state == JobState.RUNNING and bobs_job.cancel_requested_at is None


@pytest.mark.parametrize(("method", "url"), JOB_ENDPOINTS)
def test_a_missing_job_looks_the_same(method, url, carol):
    response = getattr(api_client(carol), method)(url.format(id="00000000-0000-0000-0000-000000000000"))
    assert response.status_code == 404


def test_lists_show_only_the_callers_teams(carol, bob, bobs_job, teams):
    carols = make_job(team=teams["robotics"], user=carol, state=JobState.QUEUED)
    for url in ("/api/v1/jobs/", "/api/v1/queue/"):
        ids = {j["id"] for j in api_client(carol).get(url).json()["results"]}
        assert str(bobs_job.pk) not in ids
    assert [j["id"] for j in api_client(carol).get("/api/v1/jobs/").json()["results"]] == [str(carols.pk)]
    refused = api_client(carol).get("/api/v1/jobs/?team=vision")  # no rows of vision, and no hint it exists
    assert refused.status_code == 400 and refused.json() == {"team": ["you are not a member of a team named 'vision'"]}


def test_the_job_list_finds_a_job_by_a_prefix_of_its_id(carol, bob, bobs_job, teams):
    """`yoloq status 1274d5f1` looked for the prefix in the newest 1,000 jobs only: an older job was
    "not found". The list filters by prefix in the database, dashes or not, and never across teams."""
    older = make_job(team=teams["vision"], user=bob, state=JobState.SUCCEEDED)
    Job.objects.bulk_create(Job(task_name="n", team=teams["vision"], user=bob, spec={}, spec_hash=str(i),
                                timeout_s=60, state=JobState.SUCCEEDED) for i in range(1001))
    full = str(older.pk)
    for prefix in (full[:8], full[:13], full[:8].upper(), full):
        found = api_client(bob).get("/api/v1/jobs/", {"id": prefix}).json()
        assert [j["id"] for j in found["results"]] == [full] and found["count"] == 1, prefix
    assert api_client(carol).get("/api/v1/jobs/", {"id": full[:8]}).json()["count"] == 0
    for bad in ("12", "zzzz1234", "1" * 37):
        refused = api_client(bob).get("/api/v1/jobs/", {"id": bad})
        assert refused.status_code == 400 and list(refused.json()) == ["id"], bad
        assert refused.json()["id"] == [f"must be the start of a job id: 4 to 36 hex digits (0-9, a-f) and "
                                         f"dashes, got {bad!r}"]


def test_the_cluster_view_hides_other_teams_jobs(carol, bobs_job, node):
    Job.objects.filter(pk=bobs_job.pk).update(node=node, gpu_indices=[0])
    body = api_client(carol).get("/api/v1/cluster/").json()
    jobs = [j for n in body["nodes"] for g in n["gpus"] for j in g["jobs"]]
    assert jobs and all(j["id"] is None and j["team"] is None for j in jobs)


def test_a_member_cancels_their_own_job(bob, bobs_job):
    assert api_client(bob).post(f"/api/v1/jobs/{bobs_job.pk}/cancel/").status_code == 202


@pytest.mark.parametrize("action", ["cancel", "requeue"])
def test_cancel_and_requeue_name_a_body_field_they_do_not_take(alice, bobs_job, action):
    """{"bogus": 1} was taken and dropped without a word (a script sending a comment believed it
    recorded), where class/ and stage/ name such a field (CI trial 17, H8)."""
    response = api_client(alice).post(f"/api/v1/jobs/{bobs_job.pk}/{action}/", {"comment": "nightly"}, format="json")
    assert response.status_code == 400 and response.json() == {"comment": ["is not a known field"]}
    assert Job.objects.get(pk=bobs_job.pk).state == bobs_job.state


def test_a_member_cannot_cancel_a_teammates_job(alice, bob, teams):
    job = make_job(team=teams["vision"], user=make_user("dave", teams["vision"]))
    response = api_client(bob).post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.status_code == 403 and "manager" in response.json()["detail"]
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED


def test_a_manager_cancels_any_job_of_their_team(alice, bobs_job):
    assert api_client(alice).post(f"/api/v1/jobs/{bobs_job.pk}/cancel/").status_code == 202


def test_a_manager_s_cancel_says_why_and_the_owner_s_event_keeps_it(alice, bob, teams):
    """{"reason": …} was refused "cannot be set: is computed by the scheduler" (the queue reason's
    word): a manager's script could not say why, which the owner's notification promises (trial 32)."""
    from apps.jobs.models import JobEvent

    job = make_job(team=teams["vision"], user=bob)
    response = api_client(alice).post(f"/api/v1/jobs/{job.pk}/cancel/", {"reason": "superseded by run 43"},
                                      format="json")
    assert response.status_code == 202, response.content
    event = JobEvent.objects.get(job=job, kind="cancelled")
    assert event.message == "cancelled by alice while queued: superseded by run 43"
    assert event.data["reason"] == "superseded by run 43"
    response = api_client(alice).post(f"/api/v1/jobs/{make_job(team=teams['vision'], user=bob).pk}/cancel/",
                                      {"reason": "x" * 201}, format="json")
    assert response.status_code == 400
    assert list(response.json()) == ["reason"]
    sweep = make_job(team=teams["vision"], user=bob, is_sweep=True, state=JobState.RUNNING)
    response = api_client(alice).post(f"/api/v1/jobs/{sweep.pk}/cancel/", {"reason": "wrong grid"}, format="json")
    assert response.status_code == 202, response.content
    event = JobEvent.objects.get(job=sweep, kind="cancelled")
    assert event.message.startswith("cancelled by alice: wrong grid; cancelling its 0")
    assert event.data["reason"] == "wrong grid"


def test_a_manager_requeues_a_running_job_of_their_team(alice, bobs_job):
    response = api_client(alice).post(f"/api/v1/jobs/{bobs_job.pk}/requeue/")
    assert response.status_code == 202, response.content
    assert (response.json()["state"], response.json()["attempt"]) == ("queued", 2)


def test_a_member_cannot_requeue(bob, bobs_job):
    assert api_client(bob).post(f"/api/v1/jobs/{bobs_job.pk}/requeue/").status_code == 403


def test_requeue_of_a_queued_job_names_the_state(alice, teams, bob):
    job = make_job(team=teams["vision"], user=bob)
    response = api_client(alice).post(f"/api/v1/jobs/{job.pk}/requeue/")
    assert response.status_code == 409 and "state" in response.json()


def test_a_manager_changes_a_queued_jobs_class(alice, bob, teams):
    from apps.accounts.models import AuditEntry

    job = make_job(team=teams["vision"], user=bob)
    response = api_client(alice).post(f"/api/v1/jobs/{job.pk}/class/", {"priority": "high"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["priority_class"] == "high" == Job.objects.get(pk=job.pk).priority_class
    assert AuditEntry.objects.get(action="job.class", target_id=str(job.pk)).data == {"from": "medium", "to": "high"}


def test_a_member_may_not_change_the_class_of_their_own_job(bob, teams):
    job = make_job(team=teams["vision"], user=bob)
    response = api_client(bob).post(f"/api/v1/jobs/{job.pk}/class/", {"priority": "urgent"}, format="json")
    assert response.status_code == 403
    assert response.json() == {"detail": "only a manager of the job's team may change its class"}
    assert Job.objects.get(pk=job.pk).priority_class == "medium"


@pytest.mark.parametrize("body", [{"priority": "critical"}, {"priority": ""}, {}, {"priority_class": "high"}])
def test_a_class_change_names_a_bad_body(body, alice, bob, teams):
    job = make_job(team=teams["vision"], user=bob)
    response = api_client(alice).post(f"/api/v1/jobs/{job.pk}/class/", body, format="json")
    assert response.status_code == 400 and set(response.json()) <= {"priority", "priority_class"}
    assert response.json(), response.content
    if body == {"priority": "critical"}:
        assert response.json() == {"priority": ["must be one of low, medium, high, urgent, got 'critical'"]}
    assert Job.objects.get(pk=job.pk).priority_class == "medium"


def test_a_class_change_of_a_running_job_is_a_409_naming_its_state_as_requeue_and_cancel_answer(alice, bobs_job):
    """It was a 400 naming `priority`, where cancel/ and requeue/ of a job in the wrong state are
    409s naming `state` (CI trial 17, H12)."""
    response = api_client(alice).post(f"/api/v1/jobs/{bobs_job.pk}/class/", {"priority": "high"}, format="json")
    assert response.status_code == 409
    assert response.json() == {"state": ["the job is running; only a queued job changes class"]}
    assert Job.objects.get(pk=bobs_job.pk).priority_class == "medium"


def test_an_admin_acts_on_every_team(bobs_job, teams):
    from apps.accounts.services import user_ensure

    root = user_ensure(username="root", password="pw", superuser=True)
    client = api_client(root)
    assert client.get(f"/api/v1/jobs/{bobs_job.pk}/").status_code == 200
    assert client.post(f"/api/v1/jobs/{bobs_job.pk}/requeue/").status_code == 202


@pytest.mark.parametrize(("field", "value"), [
    ("state", "running"), ("node", "node-a"), ("gpus", [0, 1]), ("attempt", 7), ("priority_factors", {"age": 1}),
    ("queue_position", 1), ("id", "00000000-0000-0000-0000-000000000001"),
])
def test_mass_assignment_of_platform_fields_is_refused(field, value, bob, demo_registered):
    import yaml

    document = yaml.safe_load(SEED_SPEC) | {field: value}
    response = api_client(bob).post("/api/v1/jobs/", document, format="json")
    assert response.status_code == 400
    assert "cannot be set" in response.json()[field][0]
    assert not Job.objects.exists()


def test_a_spec_sent_without_its_content_type_is_told_which_to_send(bob, demo_registered):
    """Trial 23: curl --data-binary @job.yaml without -H Content-Type (a form's type) got a 415 naming no type."""
    response = api_client(bob).post("/api/v1/jobs/", SEED_SPEC, content_type="application/x-www-form-urlencoded")

    assert response.status_code == 415
    assert response.json() == {"detail": 'Unsupported media type "application/x-www-form-urlencoded" in request: '
                                         "send application/json, application/yaml, text/yaml, application/x-yaml "
                                         "(the Content-Type header)."}


def test_a_yaml_spec_naming_a_key_twice_is_refused_not_last_wins(bob, demo_registered):
    response = api_client(bob).post("/api/v1/jobs/", "task_name: a\n" + SEED_SPEC,
                                    content_type="application/yaml")
    assert response.status_code == 400
    body = response.json()
    assert list(body) == ["task_name"] and "given twice in the YAML (lines 1 and 2)" in str(body["task_name"])
    assert not Job.objects.exists()


def test_a_json_spec_naming_a_key_twice_is_refused_not_last_wins(bob, demo_registered):
    body = ('{"task_name": "a", "command": "yolo train data=demo model=yolov8n.yaml epochs=1 imgsz=64", '
            '"resources": {"gpu": 1, "gpu": 2}}')
    response = api_client(bob).post("/api/v1/jobs/", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {"spec": ["names the key 'gpu' twice in one object"]}
    assert not Job.objects.exists()


def test_the_same_request_again_under_its_idempotency_key_returns_the_first_job(bob, demo_registered):
    """Re-encoded as JSON it is still the same request: the stored job comes back, nothing new is made."""
    import yaml

    client = api_client(bob)
    first = client.post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml", HTTP_IDEMPOTENCY_KEY="k1")
    again = client.post("/api/v1/jobs/", yaml.safe_load(SEED_SPEC), format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"] and Job.objects.count() == 1


def test_a_retry_of_a_job_stored_before_a_spec_field_existed_is_still_the_same_request(bob, demo_registered):
    """A client retrying across an upgrade: the stored spec lacks the fields added since (here
    task_named and requires, derived from the same text), which is no reason for a 409."""
    client = api_client(bob)
    first = client.post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml", HTTP_IDEMPOTENCY_KEY="k1")
    job = Job.objects.get(pk=first.json()["id"])
    job.spec = {key: value for key, value in job.spec.items() if key not in ("task_named", "requires")}
    job.save(update_fields=["spec"])
    again = client.post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml", HTTP_IDEMPOTENCY_KEY="k1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"] and Job.objects.count() == 1
    renamed = client.post("/api/v1/jobs/", SEED_SPEC.replace("task_name: yolo-v8s", "task_name: renamed"),
                          content_type="application/yaml", HTTP_IDEMPOTENCY_KEY="k1")
    assert renamed.status_code == 409, "what both sides have is still compared"


def test_a_retry_racing_the_first_request_under_its_key_gets_that_job_not_a_duplicate_409(bob, demo_registered,
                                                                                             monkeypatch):
    """trial26: five concurrent submits of one spec under one Idempotency-Key made one job, but 1-3 of them
    answered 409 "an identical job of your team is already active: … (<that job>)": each had asked whether
    the key was used before the first committed, then met its job in the duplicate check. A CI retry
    racing its first try (yoloq: exit 1) is what the key is for."""
    from apps.core.prepared import PreparedRead
    from apps.jobs import services

    client = api_client(bob)
    first = client.post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml", HTTP_IDEMPOTENCY_KEY="k1")
    # As read before the first one committed: a replay check that finds nothing (a prepared read, as
    # the submit reads it ahead with the teams on PostgreSQL).
    never = PreparedRead(lambda user_id, key: Job.objects.filter(user_id=user_id, idempotency_key=key)
                         .exclude(user_id=user_id).values_list("pk", flat=True)[:1],
                         samples=({"user_id": 1, "key": "a"}, {"user_id": 2, "key": "b"}))
    monkeypatch.setattr(services, "KEY_USED", never)
    again = client.post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml", HTTP_IDEMPOTENCY_KEY="k1")
    assert (first.status_code, again.status_code) == (201, 200), again.content
    assert again.json()["id"] == first.json()["id"] and Job.objects.count() == 1
    other = client.post("/api/v1/jobs/", SEED_SPEC.replace("task_name: yolo-v8s", "task_name: renamed"),
                        content_type="application/yaml", HTTP_IDEMPOTENCY_KEY="k1")
    assert other.status_code == 409 and "Idempotency-Key" in other.json(), "another request under the key"
    plain = client.post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml", HTTP_IDEMPOTENCY_KEY="k2")
    assert plain.status_code == 409 and "identical job" in plain.json()["detail"], "a new key: still a duplicate"


def test_an_idempotency_key_reused_for_another_request_is_a_conflict(bob, demo_registered):
    """A new task_name (outside spec_hash) is another request: 409 naming the header and the job it made."""
    client = api_client(bob)
    first = client.post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml", HTTP_IDEMPOTENCY_KEY="k1")
    other = client.post("/api/v1/jobs/", SEED_SPEC.replace("task_name: yolo-v8s", "task_name: renamed"),
                        content_type="application/yaml", HTTP_IDEMPOTENCY_KEY="k1")
    assert other.status_code == 409
    message = other.json()["Idempotency-Key"][0]
    assert "already used for another request" in message and first.json()["id"] in message
    assert list(Job.objects.values_list("task_name", flat=True)) == ["yolo-v8s-industrial-inspection"]


def test_charging_a_team_the_caller_is_not_in_is_refused(carol, demo_registered):
    response = api_client(carol).post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml")
    assert response.status_code == 400
    assert "not a member" in response.json()["user"][0]


def test_charging_another_user_is_refused(bob, alice, demo_registered):
    response = api_client(bob).post("/api/v1/jobs/", SEED_SPEC.replace("user: vision", "user: alice"),
                                    content_type="application/yaml")
    assert response.status_code == 400 and "user" in response.json()


def test_unauthenticated_requests_are_refused():
    from rest_framework.test import APIClient

    assert APIClient().get("/api/v1/jobs/").status_code in (401, 403)


@pytest.mark.parametrize("query", ["after=-1", "after=x"])
def test_bad_query_parameters_name_the_parameter(query, bob, bobs_job):
    response = api_client(bob).get(f"/api/v1/jobs/{bobs_job.pk}/metrics/?{query}")
    assert response.status_code == 400 and "after" in response.json()


@pytest.mark.parametrize(("body", "content_type", "field", "words"), [
    ("task_name: [unclosed\n", "application/yaml", "spec", "is not valid YAML"),
    ("{\"task_name\": ", "application/json", "spec", "is not valid JSON"),
    ('{"task_name": "a", "task_name": "b"}', "application/json", "spec", "twice"),
    ("task_name: x\ncommand: 'yolo train epochs=ten'\n", "application/yaml", "command.epochs", "integer"),
])
def test_every_400_maps_each_field_to_a_list_of_messages(body, content_type, field, words, bob, demo_registered):
    """A spec that does not parse answers in the shape a bad field does (it was a bare string; new-user trial)."""
    response = api_client(bob).post("/api/v1/jobs/", body, content_type=content_type)
    assert response.status_code == 400
    errors = response.json()
    assert isinstance(errors[field], list) and words in errors[field][0], errors


def test_a_bad_query_parameter_is_a_list_of_messages_too(bob, bobs_job):
    response = api_client(bob).get(f"/api/v1/jobs/{bobs_job.pk}/metrics/?after=x")
    assert response.json() == {"after": ["must be an integer, got 'x'"]}


@pytest.mark.parametrize("resources, field, message", [
    ({"gpu": 4}, "resources.gpu", r"asks for 4 GPUs on one node; the largest node has 2$"),
    ({"gpu": 1, "memory": "500Gi"}, "resources.memory", r"asks for 512000 MiB of RAM; the largest node has \d+ MiB$"),
    ({"gpu": 1, "cpu": "64"}, "resources.cpu", r"asks for 64 CPUs; the largest node has \d+$"),
    ({"gpu": 1, "gpu_model": "A100"}, "resources.gpu_model",
     r"no node has 1 GPU\(s\) of model A100; the models here: .+$"),
    ({"gpu": 1, "gpu_memory": "80Gi"}, "resources.gpu_memory",
     r"no node has 1 GPU\(s\) with 81920 MiB of memory; the largest GPU has 16384 MiB$"),
])
def test_a_job_no_node_can_run_names_the_resource_and_what_the_nodes_have(resources, field, message, bob,
                                                                          demo_registered, node):
    """Each resource alone that no node has is named (it was one "resources" message naming
    the largest node's GPU count, also when the RAM asked was the problem)."""
    import re

    response = api_client(bob).post("/api/v1/jobs/", {
        "task_name": "too-big", "team": "vision", "resources": resources,
        "command": "yolo train data=demo model=yolov8n.yaml epochs=1 imgsz=64"}, format="json")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert list(body) == [field] and re.match(message, body[field][0]), body
    assert not Job.objects.exists()


def test_a_team_that_keeps_urgent_for_its_managers_refuses_a_members_urgent_submit(alice, bob, demo_registered):
    """The urgent allowance was spent by whichever member submitted urgent first; a team may
    keep urgent for its managers (manager trial F41). The submit's audit entry names the class."""
    from apps.accounts.models import AuditEntry, Team

    urgent = SEED_SPEC.replace("priority: medium", "priority: urgent")
    assert api_client(bob).post("/api/v1/jobs/", urgent, content_type="application/yaml").status_code == 201
    Job.objects.all().delete()
    Team.objects.filter(slug="vision").update(urgent_by=Team.UrgentBy.MANAGERS)

    refused = api_client(bob).post("/api/v1/jobs/", urgent, content_type="application/yaml")
    assert refused.status_code == 400
    assert list(refused.json()) == ["priority"]
    assert "team vision lets only its managers submit urgent jobs (its managers: alice)" in refused.json()["priority"][0]
    assert not Job.objects.exists()
    high = SEED_SPEC.replace("priority: medium", "priority: high")
    assert api_client(bob).post("/api/v1/jobs/", high, content_type="application/yaml").status_code == 201
    made = api_client(alice).post("/api/v1/jobs/", urgent.replace("user: vision", "user: vision\nallow_duplicate: true"),
                                  content_type="application/yaml")
    assert made.status_code == 201, made.content
    assert AuditEntry.objects.get(action="job.submit", target_id=made.json()["id"]).data == {"priority": "urgent"}


def test_a_managers_requeue_charges_the_gpu_time_the_ended_attempt_held(alice, teams, bob):
    """The fenced worker charges nothing: the attempt's GPU time was missing from the ledger."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.quotas.models import UsageRecord

    job = make_job(team=teams["vision"], user=bob, state=JobState.RUNNING, gpus=2,
                   started_at=timezone.now() - timedelta(hours=1))
    assert api_client(alice).post(f"/api/v1/jobs/{job.pk}/requeue/").status_code == 202
    record = UsageRecord.objects.get(job=job, attempt=1)
    assert abs(record.gpu_seconds - 2 * 3600) < 60 and record.user == bob


def test_a_submit_names_every_problem_in_one_answer(bob, demo_registered):
    """Trial 16, G9: the API answered in two rounds — the spec's own fields, then (once fixed) the
    dataset and model it names."""
    response = api_client(bob).post("/api/v1/jobs/", {
        "task_name": "", "timeout": "abc",
        "command": "yolo train data=nonexist model=nope.pt epochs=ten imgsz=-5"}, format="json")
    assert response.status_code == 400
    assert set(response.json()) == {"task_name", "timeout", "command.epochs", "command.imgsz", "command.data",
                                    "command.model"}, response.json()
    assert "unknown dataset" in response.json()["command.data"][0]
    assert not Job.objects.exists()


def test_a_sweep_names_every_problem_in_one_answer(bob, demo_registered):
    """Trial 16, G6: a swept lr0 without an optimizer hid the unknown model choice until it was fixed."""
    response = api_client(bob).post("/api/v1/jobs/", {
        "task_name": "sw", "command": "yolo train data=demo model=yolov8n.yaml epochs=2 imgsz=64",
        "sweep": {"trials": 2, "parameters": {"lr0": {"low": 0.001, "high": 0.01},
                                              "model": ["yolov8n.yaml", "zzz.pt"]}}}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert "optimizer" in body["sweep.parameters.lr0"][0] and "zzz.pt" in body["sweep.parameters.model[1]"][0], body


def test_a_duplicate_409_names_the_active_job_and_what_counts(alice, demo_registered):
    """Another task_name, class and timeout on the same command is still a duplicate; the 409 said only
    "an identical job … is already active", and an operator resubmitting under a new name was left to
    guess why (optrial24). It names the job and what is compared."""
    first = api_client(alice).post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml")
    assert first.status_code == 201
    again = SEED_SPEC.replace("task_name: yolo-v8s-industrial-inspection", "task_name: other-name").replace(
        "priority: medium", "priority: high")
    response = api_client(alice).post("/api/v1/jobs/", again, content_type="application/yaml")
    assert response.status_code == 409
    detail = response.json()["detail"]
    assert f"yolo-v8s-industrial-inspection ({first.json()['id'][:8]}, queued)" in detail
    assert "same command (task, mode, arguments, export settings, sweep), GPUs (count, memory, models) and image" in detail
    assert "name, class, timeout and host memory do not count" in detail and "allow_duplicate: true" in detail


def test_a_job_being_cancelled_is_no_twin_of_the_same_spec_submitted_again(alice, demo_registered):
    """Trial 31: `yoloq cancel` of a running job, then the same spec again (cancel and resubmit) was a 409
    "an identical job of your team is already active: … (…, running)": the job the user had just cancelled,
    still stopping. A job whose cancel is requested is ending; a twin still queued or running is not."""
    from apps.jobs.services import job_cancel, job_transition

    first = api_client(alice).post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml")
    assert first.status_code == 201
    job = Job.objects.get(pk=first.json()["id"])
    assert job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.RUNNING)
    job.refresh_from_db()
    assert job_cancel(job=job, by=alice)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.cancel_requested_at is not None  # its worker is stopping it
    again = api_client(alice).post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml")
    assert again.status_code == 201, again.content
    third = api_client(alice).post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml")
    assert third.status_code == 409 and f"({again.json()['id'][:8]}, queued)" in third.json()["detail"]


def test_a_member_of_two_teams_says_which_one_a_job_is_for(teams, demo_registered):
    """trial26: bob, added to robotics, sent a spec naming no team and it went to robotics (the first by
    name): its quota, its queue, and `data=` looked up among robotics' datasets. Uploads already refuse
    that guess; a submit now does too, naming the teams. One team, or a named one, is as before."""
    from apps.accounts.services import membership_set

    dana = make_user("dana", teams["vision"])
    client = api_client(dana)
    unnamed = SEED_SPEC.replace("user: vision\n", "")
    assert client.post("/api/v1/jobs/", unnamed, content_type="application/yaml").status_code == 201
    membership_set(user=dana, team=teams["robotics"], role="member")

    for spec in (unnamed.replace("task_name: yolo", "task_name: second"),
                 SEED_SPEC.replace("user: vision", "user: dana").replace("task_name: yolo", "task_name: third")):
        refused = client.post("/api/v1/jobs/", spec, content_type="application/yaml")
        assert refused.status_code == 400, refused.content
        field = "user" if "user: dana" in spec else "team"  # the key the spec used; none: team
        assert refused.json() == {field: ["is required: you are in several teams (robotics, vision); say which "
                                          "one the job is for (team: robotics)"]}
    named = client.post("/api/v1/jobs/", SEED_SPEC.replace("epochs=2", "epochs=3"), content_type="application/yaml")
    assert named.status_code == 201 and named.json()["team"] == "vision"


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_a_utf16_spec_with_its_byte_order_mark_is_read_as_its_text(bob, demo_registered, encoding):
    """What Windows Notepad's "Unicode" and PowerShell 5's `>` write, as `yoloq submit` sends the file:
    answered "spec: is not UTF-8 text" (trial30). The mark makes the encoding certain."""
    import codecs

    from apps.jobs.models import Job

    bom = codecs.BOM_UTF16_LE if encoding.endswith("le") else codecs.BOM_UTF16_BE
    text = SEED_SPEC.replace("\n", "\r\n")
    response = api_client(bob).post("/api/v1/jobs/", bom + text.encode(encoding), content_type="application/yaml")
    assert response.status_code == 201, response.content
    assert Job.objects.get().raw_spec == text


@pytest.mark.parametrize(("body", "words"), [
    (b"\xff\xfe\x00\xd8t\x00", "starts with a UTF-16 byte-order mark but is not UTF-16 text (illegal UTF-16 surrogate"),
    (b"\xff\xfe\x00\x00t\x00\x00\x00", "is UTF-32 text (it starts with a UTF-32 byte-order mark); save it as UTF-8"),
    ("task_name: caf\u00e9\n".encode("latin-1"), "is not UTF-8 text (byte 14 is 0xe9); save it as UTF-8 or as UTF-16"),
])
def test_a_spec_in_another_encoding_is_refused_naming_the_encoding(bob, demo_registered, body, words):
    response = api_client(bob).post("/api/v1/jobs/", body, content_type="application/yaml")
    assert response.status_code == 400, response.content
    assert words in response.json()["spec"][0] if isinstance(response.json()["spec"], list) \
        else words in response.json()["spec"]
