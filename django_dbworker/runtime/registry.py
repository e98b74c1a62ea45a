"""The worker registry: each worker process keeps a row in ``WorkerProcess``.

Written from the heartbeat thread: a row at start, refreshed at every beat,
removed on a clean exit. The row says which handlers the worker runs, which
jobs it holds, and (``tables``) the ``stalled_max_age`` and ``max_num_resets``
its jobs of each model are to be judged by; every resetter reads those
(``holders``).

A worker whose job tables live on several databases keeps a row in each (the same
worker id), listing the handlers, jobs and tables of that database and the consumers
whose checkpoints are there: the resetter, the consumers' leader and the admin of a
database read its own registry, and one database out of reach leaves the rows of the
others beating (``django_dbworker.databases``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import router

from ..models import WorkerProcess
from ..sql.connection import Connection
from ..sql.orm import open_connections
from ..sql.registry import registry_statements

if TYPE_CHECKING:
    from .lane import Lane

logger = logging.getLogger("django_dbworker.registry")

MAX_LISTED_JOBS = 100


def registry_alias() -> str:
    """Where a worker registers that has no job table to claim from (consumers only)."""
    return router.db_for_write(WorkerProcess)


def missing_table(exc: Exception, name: str = "workerprocess") -> bool:
    """Whether ``exc`` says that a table of ours whose name ends in ``name`` is
    missing (``migrate`` was not run)."""
    text = str(exc).lower()
    return name in text and ("does not exist" in text or "no such table" in text)


def holders(conn: Connection) -> dict[str, list[tuple[str, float, int]]]:
    """Per job model label, (worker id, stalled_max_age, max_num_resets) of every worker
    the registry knows (alive or not yet pruned): what each declared for its jobs."""
    try:
        rows = conn.execute(registry_statements(WorkerProcess, conn.alias).holders)
    except Exception as exc:
        if not missing_table(exc):
            raise
        return {}
    found: dict[str, list[tuple[str, float, int]]] = {}
    for worker_id, tables in rows:
        if isinstance(tables, str):
            tables = json.loads(tables)
        for label, (age, resets) in (tables or {}).items():
            found.setdefault(label, []).append((worker_id, float(age), int(resets)))
    return found


def prune(conn: Connection, retention: float) -> None:
    """Remove registry rows of workers silent for ``retention`` seconds."""
    try:
        conn.execute(
            registry_statements(WorkerProcess, conn.alias).prune, {"retention": float(retention)}
        )
    except Exception as exc:
        if not missing_table(exc):
            raise


def lane_tables(lanes: Sequence[Lane]) -> dict[str, list[float | int]]:
    """What a worker declares per job model: the longest stalled_max_age and the most
    max_num_resets of its handlers of that model."""
    tables: dict[str, list[float | int]] = {}
    for lane in lanes:
        label = lane.model._meta.label
        age, resets = lane.stalled_max_age, lane.handler.max_num_resets
        if label in tables:
            age = max(age, tables[label][0])
            resets = max(resets, int(tables[label][1]))
        tables[label] = [age, resets]
    return tables


def handler_threads(lanes: Sequence[Lane]) -> int:
    """The handler threads of a process: its shared pool's size (every lane's jobs take
    its slots; a lane's ``num_handlers`` is its ceiling in it), else the sum of its
    lanes' (``num_handlers`` each)."""
    pool = next((lane.pool for lane in lanes if lane.pool is not None), None)
    return pool.size if pool is not None else sum(lane.num_handlers for lane in lanes)


class Registry:
    """This worker's row in one database (``alias``), written from the heartbeat thread:
    the ``lanes`` of that database, then ``labels`` (``consumer:<name>``)."""

    def __init__(
        self,
        worker_id: str,
        lanes: Sequence[Lane],
        labels: Sequence[str] = (),
        alias: str | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.lanes = list(lanes)
        #: Listed after the lanes' labels in ``handlers`` (``consumer:<name>``).
        self.labels = list(labels)
        self.alias = alias or next((lane.alias for lane in self.lanes), None) or registry_alias()
        self.sql = registry_statements(WorkerProcess, self.alias)
        self.enabled = True
        #: The row was written (a beat then refreshes it).
        self.registered = False

    def _pool(self) -> str | None:
        """The shared pool's figures (``runworker --pool``), as JSON; None without one."""
        pool = next((lane.pool for lane in self.lanes if lane.pool is not None), None)
        return None if pool is None else json.dumps(pool.report())

    def _jobs(self) -> tuple[str, int]:
        jobs = [lane.job_label(pk) for lane in self.lanes for pk in list(lane.held)]
        return json.dumps(jobs[:MAX_LISTED_JOBS]), len(jobs)

    def _run(self, conn: Connection, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        if not self.enabled:
            return []
        try:
            return conn.execute(sql, params)
        except Exception as exc:
            if not missing_table(exc):
                raise
            self.enabled = False
            logger.warning(
                "worker registry disabled: its table is missing; "
                "run `python manage.py migrate django_dbworker`"
            )
            return []

    def register(self, conn: Connection) -> None:
        jobs, count = self._jobs()
        lanes = self.lanes
        self._run(
            conn,
            self.sql.insert,
            {
                "worker_id": self.worker_id,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "handlers": json.dumps([lane.label for lane in lanes] + self.labels),
                "num_handlers": handler_threads(lanes),
                "threads": json.dumps({lane.label: lane.num_handlers for lane in lanes}),
                "jobs": jobs,
                "num_jobs": count,
                "num_connections": open_connections(),
                "heartbeat_interval": min((lane.heartbeat_interval for lane in lanes), default=1.0),
                "tables": json.dumps(lane_tables(lanes)),
                "pool": self._pool(),
            },
        )

    def beat(self, conn: Connection) -> None:
        jobs, count = self._jobs()
        params = {
            "jobs": jobs,
            "num_jobs": count,
            "num_connections": open_connections(),
            "pool": self._pool(),
            "worker_id": self.worker_id,
        }
        if self.enabled and not self._run(conn, self.sql.beat, params):
            self.register(conn)  # pruned while we were paused: come back

    def unregister(self, conn: Connection) -> None:
        self._run(conn, self.sql.delete, {"worker_id": self.worker_id})


def registries(
    worker_id: str, lanes: Sequence[Lane], labels: dict[str, list[str]]
) -> list[Registry]:
    """A registry row per database the worker claims from (its lanes' aliases) or runs
    consumers on (``labels``: alias → ``consumer:<name>`` labels)."""
    aliases = list(dict.fromkeys([*(lane.alias for lane in lanes), *labels]))
    return [
        Registry(
            worker_id,
            [lane for lane in lanes if lane.alias == alias],
            labels.get(alias, []),
            alias,
        )
        for alias in aliases or [registry_alias()]
    ]
