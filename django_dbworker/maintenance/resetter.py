"""The resetter: brings back jobs whose worker stopped heartbeating."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django.db import connections, models, router
from django.utils import timezone

from .. import conf
from ..control.limits import Limits
from ..control.models import RateBucket
from ..databases import job_alias, per_alias
from ..handler import Handler, seconds
from ..runtime.backoff import Backoff
from ..runtime.logs import extra
from ..runtime.registry import holders, missing_table, prune
from ..signals import job_reset, send
from ..sql import superseding
from ..sql.connection import Connection, Connections
from ..sql.jobs import JobStatements, statements_for
from ..sql.limits import prune_buckets
from ..sql.stats import stats_statements
from ..stats import JobStats
from .outages import Outages

logger = logging.getLogger("django_dbworker.resetter")


@dataclasses.dataclass
class ResetReport:
    handler: str
    reset: list[Any] = dataclasses.field(default_factory=list)
    failed: list[Any] = dataclasses.field(default_factory=list)
    #: Stalled jobs canceled instead: another job waits with their waiting-only key.
    superseded: list[Any] = dataclasses.field(default_factory=list)
    #: The worker that held each job reset, failed or superseded.
    holders: dict[Any, str] = dataclasses.field(default_factory=dict)
    #: True when the pass left stalled jobs alone because the database failed recently.
    held_back: bool = False


class Resetter:
    """Moves stalled ``processing`` rows back to ``queued``, or to ``failed`` once their
    reset budget is spent, for the job models of the given handlers.

    Each job is judged by what the worker holding it declared in the worker
    registry for its table: its ``stalled_max_age`` and ``max_num_resets`` (the
    largest of its handlers of that model). So the resetter of one handler never
    takes the live job of another handler of the same table that allows a longer
    silence. Jobs of workers the registry does not know (long gone, or an older
    version) get the largest of this resetter's own handlers' values.

    ``spare`` names ids the caller is holding alive itself (a resetter inside a
    worker never resets its own jobs, whatever their heartbeat says).

    After losing the database (its own connection, or one of its worker's), or
    waiting long for SQLite's write lock, the resetter leaves jobs alone for
    ``stalled_max_age``: when the database restarts (or a long transaction holds
    SQLite's lock) no heartbeat can be written, and live workers need time to
    beat again before their jobs may be taken. Statement errors (a lock timeout on
    PostgreSQL) do not count: they must not keep the resetter idle.

    On PostgreSQL a row another transaction keeps locked cannot be heartbeated
    (the heartbeat skips it); the resetter skips it too. So that it does not
    take such a job the moment the lock goes, before its worker's next beat,
    the resetter remembers stalled rows it found locked and leaves each alone
    until ``stalled_max_age`` after it last saw it locked.

    Job tables on several databases are judged each by the registry of its own
    database, and apart: a database out of reach holds back the resets of its jobs
    only, and the others' passes go on (``django_dbworker.databases``).
    """

    def __init__(
        self,
        handlers: Sequence[Handler],
        spare: Callable[[type[models.Model]], list[Any]] | None = None,
    ) -> None:
        self.handlers = list(handlers)
        self.spare = spare or (lambda model: [])
        self._conn = Connections("resetter")
        #: Per database (None: any), its last failure: what holds resets back.
        self.outages = Outages()
        #: Per database, when its failing pass was last logged (monotonic).
        self._said_failing: dict[str, float] = {}
        #: (model, pk) -> when a pass last found that stalled row locked (monotonic).
        self._locked: dict[tuple[type[models.Model], Any], float] = {}
        self.models: dict[type[models.Model], list[Handler]] = {}
        for handler in self.handlers:
            assert handler.model is not None
            self.models.setdefault(handler.model, []).append(handler)
        #: The job models of each database.
        self.aliases = per_alias(self.models, job_alias)
        #: The databases of the handlers with rate limits: each pass deletes their
        #: buckets that are full again.
        self.bucket_aliases = sorted(
            {
                router.db_for_write(model)
                for model, handlers in self.models.items()
                for limits in map(Limits.of, handlers)
                if limits is not None and (limits.rate or limits.rate_per_key)
            }
        )

    @property
    def conn(self) -> Connections:
        """Its connections: in a worker the dispatcher thread's (it runs there), in
        ``runresetter`` its own."""
        return Connections.of_thread(self._conn)

    def note_failure(self, contended: bool = False, alias: str | None = None) -> None:
        """The database ``alias`` (None: any) was out of reach, or (``contended``)
        SQLite's write lock was held long (seen by any thread of this process):
        heartbeats may not have been written meanwhile."""
        self.outages.note_failure(contended, alias)

    def close(self) -> None:
        self._conn.close()

    def run_once(self) -> list[ResetReport]:
        """One pass over each database's job tables. A database that fails is left
        until the next pass (its failure logged) while the others are passed over; the
        pass raises only when every database failed."""
        reports: list[ResetReport] = []
        failures: list[Exception] = []
        for alias, job_models in self.aliases.items():
            try:
                reports += self._run_alias(alias, job_models)
            except Exception as exc:
                conn = self.conn(alias)
                if conn.lost or conn.contended:
                    self.note_failure(contended=not conn.lost, alias=alias)
                failures.append(exc)
                if len(self.aliases) > 1:
                    self._said(alias, exc)
        if failures and len(failures) == len(self.aliases):
            raise failures[0]
        return reports

    def _said(self, alias: str, exc: Exception) -> None:
        """Log a failed pass of one database of several, once a minute."""
        now = time.monotonic()
        if now - self._said_failing.get(alias, -60.0) < 60:
            return
        self._said_failing[alias] = now
        logger.warning(
            "resetter: database %r failed (%s); its jobs wait, the other databases' are reset",
            alias,
            " ".join(f"{type(exc).__name__}: {exc}".split()),
            extra=extra("reset_failed_database"),
        )

    def _run_alias(self, alias: str, job_models: list[type[models.Model]]) -> list[ResetReport]:
        conn = self.conn(alias)
        known = holders(conn)
        reports = [
            self._reset(model, self.models[model], known.get(model._meta.label, []))
            for model in job_models
        ]
        prune(conn, conf.get("WORKER_RETENTION"))
        if alias in self.bucket_aliases:
            conn.execute(prune_buckets(RateBucket, alias))
        self._prune_stats(alias)
        self._said_failing.pop(alias, None)
        return reports

    def _prune_stats(self, alias: str) -> None:
        """Delete the per-minute statistics past ``DBWORKER["STATS_RETENTION"]`` (kept
        beside their jobs)."""
        retention = conf.get("STATS_RETENTION")
        if retention is None:
            return
        conn = self.conn(alias)
        before = conn.wrapper.ops.adapt_datetimefield_value(
            timezone.now() - timedelta(seconds=float(retention))
        )
        try:
            conn.execute(stats_statements(JobStats, alias).prune, {"before": before})
        except Exception as exc:
            if not missing_table(exc, "jobstats"):
                raise

    def _reset(
        self,
        model: type[models.Model],
        handlers: list[Handler],
        known: list[tuple[str, float, int]],
    ) -> ResetReport:
        alias = router.db_for_write(model)
        stmts = statements_for(model, connections[alias].vendor, alias)
        conn = self.conn(alias)
        name = ", ".join(h.get_name() for h in handlers)
        report = ResetReport(name)
        age = max(seconds(h.stalled_max_age) or 0.0 for h in handlers)
        resets = max(h.max_num_resets for h in handlers)
        longest = max([age, *(h[1] for h in known)])
        if self.outages.held_back(report, longest, alias):
            return report
        if not stmts.dialect.row_locks:
            # SQLite: take the write lock first. Waiting long for it means heartbeats
            # could not be written either: their jobs' silence proves nothing.
            conn.execute("BEGIN IMMEDIATE")
            if conn.contended:
                conn.execute("ROLLBACK")
                self.note_failure(contended=True, alias=alias)
                self.outages.held_back(report, longest, alias)
                return report
        try:
            self._reset_rows(model, handlers, known, stmts, conn, report, age, resets, longest)
        except BaseException:
            if not stmts.dialect.row_locks:
                with contextlib.suppress(Exception):
                    conn.execute("ROLLBACK")
            raise
        if not stmts.dialect.row_locks:
            conn.execute("COMMIT")
        if report.reset:
            conn.notify(model._meta.db_table)
        for failed, pks in ((False, report.reset), (True, report.failed)):
            for pk in pks:
                send(
                    job_reset,
                    model,
                    job_id=pk,
                    worker_id=report.holders[pk],
                    failed=failed,
                    superseded=False,
                )
        for pk in report.superseded:  # ended (canceled): another job waits with its key
            send(
                job_reset,
                model,
                job_id=pk,
                worker_id=report.holders[pk],
                failed=True,
                superseded=True,
            )
        if report.reset or report.failed or report.superseded:
            logger.info(
                "%s: reset %d stalled jobs, failed %d, superseded %d",
                report.handler,
                len(report.reset),
                len(report.failed),
                len(report.superseded),
                extra=extra("reset_pass", handler=report.handler),
            )
        return report

    def _reset_rows(
        self,
        model: type[models.Model],
        handlers: list[Handler],
        known: list[tuple[str, float, int]],
        stmts: JobStatements,
        conn: Connection,
        report: ResetReport,
        age: float,
        resets: int,
        longest: float,
    ) -> None:
        spare = list(self.spare(model))
        holder_params = stmts.holders_params(known)
        stalled: set[Any] = set()
        if stmts.dialect.row_locks:
            spare += self._recently_locked(model, longest, conn, stmts)
            stalled = set(
                stmts.keys(
                    conn.execute(
                        stmts.stalled_ids,
                        {**holder_params, "age": age, "spare": stmts.ids_param(spare)},
                    )
                )
            )
        common = {
            **holder_params,
            "age": age,
            "resets": resets,
            "spare": stmts.ids_param(spare),
        }
        declared = {
            worker: (worker_age, worker_resets) for worker, worker_age, worker_resets in known
        }
        # A job whose waiting-only key another job holds meanwhile is superseded.
        notes: dict[Any, str] = {}
        reset, superseded = superseding.reset_stalled(conn, stmts, common, notes)
        for pk, worker in superseded:
            pk = stmts.key(pk)
            report.superseded.append(pk)
            report.holders[pk] = worker
            logger.warning(
                "job %s:%s canceled: no heartbeat from worker %s; %s",
                model._meta.label,
                pk,
                worker,
                notes.get(pk, "superseded"),
                extra=extra("superseded", job=pk, worker=worker, handler=report.handler),
            )
        for pk, worker in reset:
            pk = stmts.key(pk)
            report.reset.append(pk)
            report.holders[pk] = worker
            logger.warning(
                "job %s:%s reset: no heartbeat for over %gs from worker %s",
                model._meta.label,
                pk,
                declared.get(worker, (age, resets))[0],
                worker,
                extra=extra("reset", job=pk, worker=worker, handler=report.handler),
            )
        message = handlers[0].reset_failure_message
        for pk, worker in conn.execute(stmts.fail_stalled, {**common, "message": message}):
            pk = stmts.key(pk)
            report.failed.append(pk)
            report.holders[pk] = worker
            logger.error(
                "job %s:%s failed: stalled again after %d resets (last worker %s)",
                model._meta.label,
                pk,
                declared.get(worker, (age, resets))[1],
                worker,
                extra=extra("reset_failed", job=pk, worker=worker, handler=report.handler),
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
                    longest,
                    extra=extra("reset_locked", job=pk, handler=report.handler),
                )
            self._locked[(model, pk)] = now

    def _recently_locked(
        self, model: type[models.Model], age: float, conn: Connection, stmts: JobStatements
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
            free = set(
                stmts.keys(conn.execute(stmts.unlocked_ids, {"ids": stmts.ids_param(recent)}))
            )
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
