"""A submit stays cheap: what admission reads (nodes, quotas, configuration) is reused for a
moment, and a change made in the same process is seen at once."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.quotas.models import TeamQuota
from tests.conftest import api_client

pytestmark = pytest.mark.django_db
ADMISSION_TABLES = ("cluster_node", "cluster_gpu", "scheduling_schedulerconfig", "quotas_teamquota")


def submit(client, name: str, gpus: float = 1):
    return client.post("/api/v1/jobs/", {
        "task_name": name, "team": "vision", "allow_duplicate": True, "resources": {"gpu": gpus},
        "command": "yolo train data=demo model=yolov8n.yaml epochs=1 imgsz=64"}, format="json")


def test_a_second_submit_reads_no_cluster_or_quota_table(bob, demo_registered, node, settings):
    settings.ADMISSION_CACHE_S = 60
    client = api_client(bob)
    assert submit(client, "first").status_code == 201
    with CaptureQueriesContext(connection) as captured:
        assert submit(client, "second").status_code == 201
    tables = " ".join(q["sql"] for q in captured.captured_queries)
    assert not [t for t in ADMISSION_TABLES if t in tables], tables
    # The token, the teams, the dataset, the registry name, the active count and three inserts (job,
    # its first event, the audit entry); no more. On PostgreSQL the inserts and the user's row lock
    # are one statement (apps.core.prepared.rows_insert), and so are the dataset and the registry
    # name (reads_ahead).
    statements = [q["sql"][:80] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) <= (5 if connection.vendor == "postgresql" else 8), statements


def test_a_submit_with_an_idempotency_key_is_five_statements_on_postgresql(bob, demo_registered, node, settings):
    """The token; the replay check with the teams; the dataset with the registry name; the rows
    with the user's lock; the active count (and BEGIN and COMMIT, savepoints here). Each of the
    first three pairs was two round trips (docs/performance.md, item 26)."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's round trips; SQLite runs each read alone")
    settings.ADMISSION_CACHE_S = 60
    client = api_client(bob)
    assert submit(client, "first").status_code == 201
    with CaptureQueriesContext(connection) as captured:
        response = client.post("/api/v1/jobs/", {
            "task_name": "keyed", "team": "vision", "allow_duplicate": True, "resources": {"gpu": 1},
            "command": "yolo train data=demo model=yolov8n.yaml epochs=1 imgsz=64"}, format="json",
            HTTP_IDEMPOTENCY_KEY="key-5")
        assert response.status_code == 201
    statements = [q["sql"] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) == 5, [sql[:80] for sql in statements]
    key_and_teams, dataset_and_name = statements[1], statements[2]
    assert '"idempotency_key"' in key_and_teams and '"accounts_membership"' in key_and_teams
    assert '"datasets_dataset"' in dataset_and_name and '"registry_modelversion"' in dataset_and_name


def test_a_submits_statements_are_all_prepared_on_postgresql(bob, demo_registered, node, settings):
    """After a few submits on a connection PostgreSQL parses and plans none of a submit's
    statements again: each is a prepared statement (docs/performance.md, item 23)."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's prepared statements")
    settings.ADMISSION_CACHE_S = 60
    client = api_client(bob)
    for n in range(connection.settings_dict["OPTIONS"]["prepare_threshold"] + 1):
        assert submit(client, f"warm-{n}").status_code == 201
    with CaptureQueriesContext(connection) as captured:
        assert submit(client, "prepared").status_code == 201
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = {statement for (statement,) in cursor.fetchall()}
    # The test's own transaction makes the view's a savepoint: those are not the submit's. The
    # log holds each statement as the server got it ($1, $2 …), as pg_prepared_statements does.
    sent = [q["sql"] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(sent) == 5 and not [sql[:80] for sql in sent if sql not in prepared], (sent, prepared)


def test_the_replay_check_and_the_active_count_do_not_walk_the_users_history(bob, demo_registered, node,
                                                                            settings):
    """Each is one index search on SQLite: the user's past jobs are not read (they were, by
    the user's index in time order, on every submit)."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's plans; tests/jobs/test_indexes.py checks PostgreSQL's at 100k jobs")
    client = api_client(bob)
    statements = []

    def keep(execute, sql, params, many, context):
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        response = client.post("/api/v1/jobs/", {
            "task_name": "planned", "team": "vision", "allow_duplicate": True, "resources": {"gpu": 1},
            "command": "yolo train data=demo model=yolov8n.yaml epochs=1 imgsz=64"}, format="json",
            HTTP_IDEMPOTENCY_KEY="key-1")
    assert response.status_code == 201

    def plan(*words: str) -> str:
        sql, params = next((sql, params) for sql, params in statements
                           if sql.startswith("SELECT") and all(w in sql for w in words))
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            return " ".join(str(row[-1]) for row in cursor.fetchall())

    assert "INDEX one_job_per_idempotency_key (user_id=? AND idempotency_key=?)" in plan(
        '"jobs_job"', '"idempotency_key" =')
    assert "COVERING INDEX job_user_state_team (user_id=? AND state=?)" in plan('COUNT(', 'FROM "jobs_job"')


def test_a_node_registered_in_this_process_is_seen_by_the_next_submit(bob, demo_registered, node, settings):
    from worker.inventory import simulated_gpus
    from worker.node import register_this_host

    settings.ADMISSION_CACHE_S = 60
    client = api_client(bob)
    assert submit(client, "too-big", gpus=4).json()["resources.gpu"]  # the node has 2 GPUs
    register_this_host(name="node-b", gpus=simulated_gpus(4))
    assert submit(client, "fits-now", gpus=4).status_code == 201


def test_a_change_made_elsewhere_is_seen_once_the_period_is_over(bob, demo_registered, node, teams, settings):
    """``.update()`` sends no signal, like a quota saved by another web process."""
    TeamQuota.objects.create(team=teams["vision"], max_gpus_per_job=1)
    settings.ADMISSION_CACHE_S = 60
    client = api_client(bob)
    assert submit(client, "before").status_code == 201
    TeamQuota.objects.filter(team=teams["vision"]).update(max_gpus_per_job=0.5)
    assert submit(client, "within-the-period").status_code == 201  # still the quota read a moment ago
    settings.ADMISSION_CACHE_S = 0  # the period is over
    assert "resources.gpu" in submit(client, "after").json()


def reads_admission_tables() -> bool:
    from apps.scheduling.admission import admission_inputs

    with CaptureQueriesContext(connection) as captured:
        admission_inputs()
    return any(t in q["sql"] for q in captured.captured_queries for t in ADMISSION_TABLES)


def test_a_read_that_a_change_overtook_is_not_kept(node, settings):
    """Another thread saves a quota while this one reads: what it read may predate the save."""
    from apps.scheduling.admission import admission_inputs_changed

    settings.ADMISSION_CACHE_S = 60
    overtaken = []

    def a_change_lands_during_each_read(execute, sql, params, many, context):
        if sql.startswith("SELECT \"cluster_node\""):
            overtaken.append(sql)
            admission_inputs_changed()
        return execute(sql, params, many, context)

    with connection.execute_wrapper(a_change_lands_during_each_read):
        assert reads_admission_tables()
    assert len(overtaken) == 2  # read again at once, and that read was overtaken too
    assert reads_admission_tables()  # so neither copy was kept
    assert not reads_admission_tables()  # this one, not overtaken, is


def test_a_change_is_forgotten_again_when_its_transaction_commits(node, teams, settings,
                                                                 django_capture_on_commit_callbacks):
    """The signal fires before the commit; a copy read in between (by any thread) must not outlive it."""
    from django.db import transaction

    settings.ADMISSION_CACHE_S = 60
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            TeamQuota.objects.create(team=teams["vision"], max_gpus_per_job=1)
            assert reads_admission_tables()  # read between the save and the commit, and kept
            assert not reads_admission_tables()
    assert reads_admission_tables()


def test_admission_answers_a_request_s_shape_once_per_read_of_the_cluster(node, teams, settings, monkeypatch):
    """The verdict is kept with what admission read (docs/performance.md, item 27): the same shape is
    placed once, another shape or team is placed anew, and the answers are the uncached ones."""
    from apps.scheduling import admission
    from apps.scheduling.policy import JobRequest

    settings.ADMISSION_CACHE_S = 60
    placed = []
    fits = admission.fits_empty_cluster
    monkeypatch.setattr(admission, "fits_empty_cluster", lambda nodes, job: placed.append(job) or fits(nodes, job))

    def ask(team: str = "vision", **shape) -> tuple[dict, bool]:
        """The answer, and whether it placed the job to give it."""
        request = JobRequest(job_id="?", team=team, user="", submitted_at=0, **shape)
        placed.clear()
        answer = admission.job_admission_errors(request, team_known=True)
        was_placed = bool(placed)
        assert answer == admission._admission_errors(request, admission.admission_inputs(), team_known=True)
        return answer, was_placed

    assert ask(gpus=1) == ({}, True)
    assert ask(gpus=1) == ({}, False)  # the same shape: the answer kept
    answer, was_placed = ask(gpus=2, memory_mb=10**9)  # another shape: placed
    assert "resources.memory" in answer and was_placed
    assert ask(team="robotics", gpus=1) == ({}, True)  # another team (its quota): placed
    answer, _ = ask(gpus=64)
    answer["resources.gpu"] = "changed by the caller"
    assert ask(gpus=64)[0] != answer  # a caller's copy, not the kept one
    settings.ADMISSION_CACHE_S = 0  # read again: nothing kept from before
    assert ask(gpus=1) == ({}, True)
