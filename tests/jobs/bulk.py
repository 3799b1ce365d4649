"""Many rows fast, in one INSERT … SELECT per table (SQLite and PostgreSQL).

For the index tests and the list benchmarks (bench/api_lists.py): 100,000 jobs take about
a second this way, where ``bulk_create`` takes a minute. Every column not given an SQL
expression gets its model default (or the given value), so new fields need no change here.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import connection, models

from apps.jobs.models import Job, JobEvent, LogChunk, MetricPoint

PARAM = "\x00param\x00"
SPEC = {"task": "detect", "train_args": {"data": "demo", "model": "yolov8n.yaml", "epochs": 50, "imgsz": 640},
        "gpu_models": []}


def _uuid_sql() -> str:
    return "gen_random_uuid()" if connection.vendor == "postgresql" else "lower(hex(randomblob(16)))"


def _ago_sql(seconds: str) -> str:
    """A timestamp ``seconds`` (an SQL integer expression) before now, as the backend stores it."""
    if connection.vendor == "postgresql":
        return f"now() - make_interval(secs => {seconds})"
    return f"strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || ({seconds}) || ' seconds')"


def _case(expression: str, values: list[Any]) -> str:
    return "CASE " + " ".join(f"WHEN {expression} = {k} THEN {int(v)}" for k, v in enumerate(values)) + " END"


def insert_rows(model: type[models.Model], *, count: int, expressions: dict[str, str],
                values: dict[str, Any] | None = None, join: str = "") -> None:
    """INSERT ``count`` rows (× the rows of ``join``); ``n.i`` (1..count) numbers them."""
    values = values or {}
    columns, selects, params = [], [], []
    for field in model._meta.concrete_fields:
        name = field.attname
        if isinstance(field, models.AutoField) and name not in expressions:
            continue  # the database numbers them
        columns.append(connection.ops.quote_name(field.column))
        if name in expressions:
            selects.append(expressions[name])
            continue
        value = values[name] if name in values else field.get_default()  # "" for text without a default
        if value is None and not field.null:
            raise ValueError(f"{model.__name__}.{name} needs a value or an expression")
        if isinstance(field, models.JSONField):
            selects.append(f"CAST({PARAM} AS jsonb)" if connection.vendor == "postgresql" else PARAM)
            params.append(json.dumps(value))
        else:
            selects.append(PARAM)
            params.append(field.get_db_prep_save(value, connection))
    sql = (f"INSERT INTO {connection.ops.quote_name(model._meta.db_table)} ({', '.join(columns)}) "
           f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {int(count)}) "
           f"SELECT {', '.join(selects)} FROM n {join}")
    # The expressions use % (modulo, strftime): escape it, then put the placeholders back.
    sql = sql.replace("%", "%%").replace(PARAM, "%s")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def insert_jobs(count: int, *, owners: list[tuple[Any, Any]], queued_every: int = 50, running_every: int = 1000,
                node=None) -> None:
    """``count`` jobs spread over ``owners`` ((team, user) pairs), newest first: one in
    ``queued_every`` queued (in queue order), one in ``running_every`` running, the rest finished."""
    i = "n.i"
    owner = f"({i} % {len(owners)})"
    queued = f"{i} % {queued_every} = 0"
    running = f"{i} % {running_every} = 1"
    insert_rows(Job, count=count, expressions={
        "id": _uuid_sql(),
        "attempt_id": _uuid_sql(),
        "task_name": f"'job-' || {i}",
        "spec_hash": f"'h' || {i}",
        "team_id": _case(owner, [team.pk for team, _ in owners]),
        "user_id": _case(owner, [user.pk for _, user in owners]),
        "state": f"CASE WHEN {queued} THEN 'queued' WHEN {running} THEN 'running' "
                 f"WHEN {i} % 7 = 0 THEN 'failed' ELSE 'succeeded' END",
        "queue_position": f"CASE WHEN {queued} THEN {i} / {queued_every} END",
        "reason": f"CASE WHEN {queued} THEN 'waiting for 1 GPU' ELSE '' END",
        "node_id": f"CASE WHEN {running} THEN {node.pk} END" if node is not None else "NULL",
        "created_at": _ago_sql(i),
        "queued_at": _ago_sql(i),
        "finished_at": f"CASE WHEN NOT ({queued}) AND NOT ({running}) THEN {_ago_sql(i)} END",
    }, values={"spec": SPEC, "timeout_s": 3600, "raw_spec": "task_name: x"})
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {Job._meta.db_table}")


def insert_job_history(*, jobs: int, rows_per_job: int) -> None:
    """Events, log chunks and metric points for the ``jobs`` newest jobs (seq 1..rows_per_job each)."""
    newest = f"(SELECT id FROM {Job._meta.db_table} ORDER BY created_at DESC LIMIT {int(jobs)}) j"
    common = {"job_id": "j.id", "seq": "n.i", "created_at": _ago_sql("n.i")}
    insert_rows(JobEvent, count=rows_per_job, join=f"CROSS JOIN {newest}",
                expressions={**common}, values={"attempt": 1, "kind": "progress", "message": "epoch done"})
    insert_rows(LogChunk, count=rows_per_job, join=f"CROSS JOIN {newest}",
                expressions={**common}, values={"attempt": 1, "text": "Epoch 1/50 box_loss 1.23\n" * 4})
    insert_rows(MetricPoint, count=rows_per_job, join=f"CROSS JOIN {newest}",
                expressions={**common, "epoch": "n.i"},
                values={"attempt": 1, "values": {"metrics/mAP50(B)": 0.5, "train/box_loss": 1.2}})
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for model in (JobEvent, LogChunk, MetricPoint):
                cursor.execute(f"ANALYZE {model._meta.db_table}")
