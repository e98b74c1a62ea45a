"""The completion an atomic attempt writes inside the handler's own transaction.

It runs on the handler thread's Django connection (not one of ours), between the
handler's writes and their commit, and is fenced like every write of the writer
(``sql.jobs``: ``state = 'processing' AND worker_hostname = %(worker)s``): when the
row is no longer this attempt's it updates nothing, and the caller rolls the whole
transaction back. Unlike the writer's statements it waits for a row lock instead of
skipping the row (``SKIP LOCKED`` would read a heartbeat's lock as a lost job), and it
tells what it did by its row count, which every backend reports (MariaDB has no
``UPDATE … RETURNING``; Django asks it for found rows, not changed ones).
"""

from __future__ import annotations

import functools
from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from .dialects import param
from .jobs import COMPLETED, PROCESSING, JobStatements

#: The time an outcome ends at, per vendor: the statement's, not the transaction's
#: (PostgreSQL's ``now()`` is when the transaction began, maybe minutes before).
_NOW = {"postgresql": "statement_timestamp()", "mysql": "UTC_TIMESTAMP(6)"}


@functools.cache
def completion(stmts: JobStatements, result_field: str | None, progress: bool, logs: bool) -> str:
    """``UPDATE`` of one row to completed: pk, worker, and ``now`` on SQLite (this
    machine's clock, as the engine's SQLite statements use); ``result`` (JSON text, or
    None for SQL NULL) with ``result_field``, the last check-in ``progress`` and the
    whole execution log ``logs`` (JSON text) when asked for."""
    col, d = stmts.col, stmts.dialect
    now = _NOW.get(d.vendor, param("now"))
    sets = [f"{col['state']} = {COMPLETED}", f"{col['finished_at']} = {now}"]
    if result_field is not None:
        sets.append(f"{stmts.column(result_field)} = {d.as_json('result')}")
    if progress:
        sets.append(f"{col['progress']} = {d.as_json('progress')}")
    if logs:
        sets.append(f"{col['execution_logs']} = {d.as_json('logs')}")
    return (
        f"UPDATE {stmts.table} SET {', '.join(sets)} WHERE {col['pk']} = %(pk)s "
        f"AND {col['state']} = {PROCESSING} AND {col['worker_hostname']} = %(worker)s"
    )


def complete_one(
    connection: BaseDatabaseWrapper,
    stmts: JobStatements,
    pk: Any,
    worker: str,
    *,
    result_field: str | None = None,
    result: str | None = None,
    progress: str | None = None,
    logs: str | None = None,
) -> bool:
    """Write the completion of row ``pk`` in ``connection``'s open transaction (the
    handler's); whether the row was still ``worker``'s attempt. ``result``,
    ``progress``, ``logs``: JSON text (None: SQL NULL, or left as it is). Outside a
    transaction it refuses: the outcome would commit apart from the handler's writes."""
    if not connection.in_atomic_block:
        raise RuntimeError("an atomic completion must be written inside the handler's transaction")
    sql = completion(stmts, result_field, progress is not None, logs is not None)
    params: dict[str, Any] = {
        "pk": stmts.key_param(pk),
        "worker": worker,
        **now_param(stmts, connection),
    }
    if result_field is not None:
        params["result"] = None if result in (None, "null") else result
    if progress is not None:
        params["progress"] = progress
    if logs is not None:
        params["logs"] = logs
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return bool(cursor.rowcount == 1)


def now_param(stmts: JobStatements, connection: BaseDatabaseWrapper) -> dict[str, Any]:
    """The ``now`` parameter where the statement takes one (SQLite)."""
    if stmts.dialect.vendor in _NOW:
        return {}
    field = stmts.model._meta.get_field("finished_at")
    assert isinstance(field, models.Field)
    return {"now": field.get_db_prep_value(timezone.now(), connection)}
