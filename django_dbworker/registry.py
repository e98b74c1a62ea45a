"""The worker registry: each worker process keeps a row in ``WorkerProcess``."""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from django.db import connections, router

from .db import Connection

if TYPE_CHECKING:
    from .worker import Worker

logger = logging.getLogger(__name__)

MAX_LISTED_JOBS = 100


class RegistryStatements:
    def __init__(self, alias: str) -> None:
        from .models import WorkerProcess

        wrapper = connections[alias]
        quote = wrapper.ops.quote_name
        meta = WorkerProcess._meta
        table = quote(meta.db_table)
        col = {f.name: quote(str(f.column)) for f in meta.concrete_fields}
        pg = wrapper.vendor == "postgresql"
        now = "now()" if pg else "dbworker_time(0)"
        as_json = "%s::jsonb" if pg else "%s"
        after = "now() + make_interval(secs => %s)" if pg else "dbworker_time(%s)"
        self.insert = (
            f"INSERT INTO {table} ({col['worker_id']}, {col['hostname']}, {col['pid']}, "
            f"{col['handlers']}, {col['num_handlers']}, {col['jobs']}, {col['num_jobs']}, "
            f"{col['heartbeat_interval']}, {col['started_at']}, {col['last_heartbeat_at']}) "
            f"VALUES (%s, %s, %s, {as_json}, %s, {as_json}, %s, %s, {now}, {now})"
        )
        self.beat = (
            f"UPDATE {table} SET {col['last_heartbeat_at']} = {now}, {col['jobs']} = {as_json}, "
            f"{col['num_jobs']} = %s WHERE {col['worker_id']} = %s RETURNING {col['id']}"
        )
        self.delete = f"DELETE FROM {table} WHERE {col['worker_id']} = %s"
        self.prune = f"DELETE FROM {table} WHERE {col['last_heartbeat_at']} < {after}"


@functools.cache
def registry_statements(alias: str) -> RegistryStatements:
    return RegistryStatements(alias)


def registry_alias() -> str:
    from .models import WorkerProcess

    return router.db_for_write(WorkerProcess)


def _missing_table(exc: Exception) -> bool:
    text = str(exc).lower()
    return "workerprocess" in text and ("does not exist" in text or "no such table" in text)


def prune(conn: Connection, retention: float) -> None:
    """Remove registry rows of workers silent for ``retention`` seconds."""
    try:
        conn.execute(registry_statements(conn.alias).prune, [-float(retention)])
    except Exception as exc:
        if not _missing_table(exc):
            raise


class Registry:
    """Writes this worker's row, from the heartbeat thread."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.alias = registry_alias()
        self.sql = registry_statements(self.alias)
        self.enabled = True

    def _jobs(self) -> tuple[str, int]:
        jobs = [lane.job_label(pk) for lane in self.worker.lanes for pk in list(lane.held)]
        return json.dumps(jobs[:MAX_LISTED_JOBS]), len(jobs)

    def _run(self, conn: Connection, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        if not self.enabled:
            return []
        try:
            return conn.execute(sql, params)
        except Exception as exc:
            if not _missing_table(exc):
                raise
            self.enabled = False
            logger.warning(
                "worker registry disabled: its table is missing; "
                "run `python manage.py migrate django_dbworker`"
            )
            return []

    def register(self, conn: Connection) -> None:
        jobs, count = self._jobs()
        lanes = self.worker.lanes
        self._run(
            conn,
            self.sql.insert,
            [
                self.worker.worker_id,
                socket.gethostname(),
                os.getpid(),
                json.dumps([lane.label for lane in lanes]),
                sum(lane.num_handlers for lane in lanes),
                jobs,
                count,
                min(lane.heartbeat_interval for lane in lanes),
            ],
        )

    def beat(self, conn: Connection) -> None:
        jobs, count = self._jobs()
        if self.enabled and not self._run(
            conn, self.sql.beat, [jobs, count, self.worker.worker_id]
        ):
            self.register(conn)  # pruned while we were paused: come back

    def unregister(self, conn: Connection) -> None:
        self._run(conn, self.sql.delete, [self.worker.worker_id])
