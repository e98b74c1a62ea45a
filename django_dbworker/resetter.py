"""The resetter: brings back jobs whose worker stopped heartbeating."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, models, router

from . import conf
from .backoff import Backoff
from .db import Connection
from .handler import Handler, seconds
from .registry import prune, registry_alias
from .statements import statements_for

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ResetReport:
    handler: str
    reset: list[Any] = dataclasses.field(default_factory=list)
    failed: list[Any] = dataclasses.field(default_factory=list)
    #: True when the pass left stalled jobs alone because the database failed recently.
    held_back: bool = False


class Resetter:
    """For each handler, moves stalled ``processing`` rows back to ``queued``, or to
    ``failed`` once ``max_num_resets`` is spent.

    ``spare`` names ids the caller is holding alive itself (a resetter inside a
    worker never resets its own jobs, whatever their heartbeat says).

    After losing the database (its own connection, or one of its worker's) the
    resetter leaves jobs alone for ``stalled_max_age``: when the database
    restarts, every heartbeat goes stale at once, and live workers need time to
    reconnect and beat again before their jobs may be taken. Statement errors
    (a lock timeout) do not count: they must not keep the resetter idle.

    On PostgreSQL a row another transaction keeps locked cannot be heartbeated
    (the heartbeat skips it); the resetter skips it too. So that it does not
    take such a job the moment the lock goes, before its worker's next beat,
    the resetter remembers stalled rows it found locked and leaves each alone
    until ``stalled_max_age`` after it last saw it locked.
    """

    def __init__(
        self,
        handlers: Sequence[Handler],
        spare: Callable[[type[models.Model]], list[Any]] | None = None,
    ) -> None:
        self.handlers = list(handlers)
        self.spare = spare or (lambda model: [])
        self._conns: dict[str, Connection] = {}
        self._failed_at: float | None = None
        self._holding_back = False
        #: (model, pk) -> when a pass last found that stalled row locked (monotonic).
        self._locked: dict[tuple[type[models.Model], Any], float] = {}

    def note_failure(self) -> None:
        """The database was out of reach (seen by any thread of this process)."""
        self._failed_at = time.monotonic()

    def conn(self, alias: str) -> Connection:
        if alias not in self._conns:
            self._conns[alias] = Connection(alias, "resetter")
        return self._conns[alias]

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def run_once(self) -> list[ResetReport]:
        try:
            return self._run_once()
        except Exception:
            if any(conn.lost for conn in self._conns.values()):
                self.note_failure()
            raise

    def _run_once(self) -> list[ResetReport]:
        reports = []
        seen: set[tuple[Any, ...]] = set()
        for handler in self.handlers:
            model = handler.model
            assert model is not None
            age = seconds(handler.stalled_max_age) or 0.0
            key = (model, age, handler.max_num_resets, handler.reset_failure_message)
            if key in seen:
                continue
            seen.add(key)
            reports.append(self._reset(handler, model, age))
        prune(self.conn(registry_alias()), conf.get("WORKER_RETENTION"))
        return reports

    def _reset(self, handler: Handler, model: type[models.Model], age: float) -> ResetReport:
        alias = router.db_for_write(model)
        stmts = statements_for(model, connections[alias].vendor, alias)
        conn = self.conn(alias)
        report = ResetReport(handler.get_name())
        failed_at = self._failed_at
        if failed_at is not None and time.monotonic() - failed_at < age:
            report.held_back = True
            if not self._holding_back:
                self._holding_back = True
                logger.warning(
                    "%s: the database failed %.1fs ago; no job is reset until its worker "
                    "had stalled_max_age (%gs) to heartbeat again",
                    report.handler,
                    time.monotonic() - failed_at,
                    age,
                )
            return report
        self._holding_back = False
        spare = list(self.spare(model))
        stalled: set[Any] = set()
        if stmts.pg:
            spare += self._recently_locked(model, age, conn, stmts)
            stalled = {row[0] for row in conn.execute(stmts.stalled_ids, [-age, spare])}
        common = [-age, handler.max_num_resets, stmts.ids_param(spare)]
        for pk, worker in conn.execute(stmts.reset_stalled, common):
            report.reset.append(pk)
            logger.warning(
                "job %s:%s reset: no heartbeat for %gs from worker %s",
                model._meta.label,
                pk,
                age,
                worker,
                extra={"job_id": pk, "worker": worker, "handler": report.handler},
            )
        for pk, worker in conn.execute(
            stmts.fail_stalled, [handler.reset_failure_message, *common]
        ):
            report.failed.append(pk)
            logger.error(
                "job %s:%s failed: stalled again after %d resets (last worker %s)",
                model._meta.label,
                pk,
                handler.max_num_resets,
                worker,
                extra={"job_id": pk, "worker": worker, "handler": report.handler},
            )
        # Stalled rows the SKIP LOCKED statements passed over are locked by another
        # transaction (or were heartbeated or finished meanwhile: sparing those is harmless).
        now = time.monotonic()
        for pk in stalled.difference(report.reset, report.failed):
            if (model, pk) not in self._locked:
                logger.info(
                    "job %s:%s: stalled, but another transaction locks its row; left alone "
                    "until %gs after the lock goes",
                    model._meta.label,
                    pk,
                    age,
                    extra={"job_id": pk, "handler": report.handler},
                )
            self._locked[(model, pk)] = now
        if report.reset:
            conn.notify(model._meta.db_table)
        if report.reset or report.failed:
            logger.info(
                "%s: reset %d stalled jobs, failed %d",
                report.handler,
                len(report.reset),
                len(report.failed),
            )
        return report

    def _recently_locked(
        self, model: type[models.Model], age: float, conn: Connection, stmts: Any
    ) -> list[Any]:
        """Ids of this model found locked within ``age``; those still locked are noted again."""
        now = time.monotonic()
        recent = []
        for key, seen in list(self._locked.items()):
            if key[0] is not model:
                continue
            if now - seen >= age:
                del self._locked[key]
            else:
                recent.append(key[1])
        if recent:
            free = {row[0] for row in conn.execute(stmts.unlocked_ids, [recent])}
            for pk in recent:
                if pk not in free:
                    self._locked[(model, pk)] = now
        return recent

    def serve(self, interval: float, stop: threading.Event, once: bool = False) -> int:
        """Run passes every ``interval`` seconds until ``stop`` is set (runresetter)."""
        backoff = Backoff()
        try:
            while not stop.is_set():
                try:
                    self.run_once()
                    backoff.reset()
                    wait = interval
                except Exception as exc:
                    self.close()
                    if once:
                        logger.error("resetter pass failed: %s", exc)
                        return 1
                    wait = backoff.next()
                    logger.warning("resetter pass failed, retrying in %.1fs: %s", wait, exc)
                if once:
                    return 0
                stop.wait(wait)
            return 0
        finally:
            self.close()
