"""The outcome writer: one thread that writes what handler threads finished.

Completions of one lane go out as one statement for all ids at hand (group
commit: at low load that is one job, under load a batch, with no timer to
wait for; a handler with ``ack_each_job`` writes each on its own). Errors,
cancellations and requeues are written one per statement.
A write that fails is retried with backoff; its jobs stay held, so they keep
their heartbeat and are not reset meanwhile.

On PostgreSQL an outcome skips a row another transaction holds a lock on
(``SKIP LOCKED``) instead of waiting for it: that job is set aside and tried
again every ``LOCKED_RETRY`` seconds, while every other outcome goes out at
once. Execution-log writes, which handler threads make while they run, use a
connection of their own, so one waiting for a row lock holds up no outcome.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Any

from .attempt import Attempt, Outcome
from .backoff import Backoff
from .db import Connection
from .states import JobState

if TYPE_CHECKING:
    from .lane import Lane
    from .worker import Worker

logger = logging.getLogger(__name__)

MAX_BATCH = 1000
#: Seconds between two tries of an outcome whose row another transaction has locked.
LOCKED_RETRY = 0.5

Item = tuple[Attempt, Outcome]


class Writer(threading.Thread):
    def __init__(self, worker: Worker) -> None:
        super().__init__(name="dbworker-writer", daemon=True)
        self.worker = worker
        self._queue: SimpleQueue[Item | None] = SimpleQueue()
        self._conns: dict[str, Connection] = {}
        self._log_conns: dict[str, Connection] = {}
        self._log_lock = threading.Lock()
        self._give_up_at: float | None = None
        #: Outcomes whose rows were locked by another transaction, retried at _retry_at.
        self._locked: list[Item] = []
        self._locked_noted: set[Attempt] = set()
        self._retry_at = 0.0
        self.written = 0
        #: The thread ended on an unexpected error (the worker then stops).
        self.died = False

    def submit(self, attempt: Attempt, outcome: Outcome) -> None:
        self._queue.put((attempt, outcome))

    def stop(self, deadline: float) -> None:
        """Write what is queued, retrying failures until ``deadline``, then end."""
        self._give_up_at = deadline
        self._queue.put(None)

    def execute(self, alias: str, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        """Run one execution-log statement now, from a handler thread."""
        with self._log_lock:
            if alias not in self._log_conns:
                self._log_conns[alias] = Connection(alias, "log")
            return self._log_conns[alias].execute(sql, params)

    def _conn(self, alias: str) -> Connection:
        if alias not in self._conns:
            self._conns[alias] = Connection(alias, "writer")
        return self._conns[alias]

    def run(self) -> None:
        clean = False
        try:
            stopping = False
            while not stopping or self._locked:
                batch: list[Item] = []
                if self._locked and time.monotonic() >= self._retry_at:
                    batch, self._locked = self._locked, []
                elif stopping:
                    if self._give_up_at is not None and time.monotonic() > self._give_up_at:
                        self._give_up(self._locked, "their rows stay locked")
                        break
                    time.sleep(max(0.0, min(self._retry_at - time.monotonic(), LOCKED_RETRY)))
                    continue
                if not stopping:
                    stopping = self._collect(batch)
                if batch:
                    self._write(batch)
            clean = True
        finally:
            if not clean:
                self.died = True
                self.worker.wake()
            for conn in self._conns.values():
                conn.close()
            with self._log_lock:
                for conn in self._log_conns.values():
                    conn.close()

    def _collect(self, batch: list[Item]) -> bool:
        """Add what handler threads submitted to ``batch``; True once told to stop."""
        if not batch:
            timeout = max(self._retry_at - time.monotonic(), 0.0) if self._locked else None
            try:
                item = self._queue.get(timeout=timeout)
            except Empty:
                return False
            if item is None:
                return True
            batch.append(item)
        while len(batch) < MAX_BATCH:
            try:
                nxt = self._queue.get_nowait()
            except Empty:
                return False
            if nxt is None:
                return True
            batch.append(nxt)
        return False

    def _give_up(self, items: list[Item], reason: object) -> None:
        logger.error(
            "giving up writing outcomes of jobs %s (%s); the resetter will bring them back",
            ", ".join(str(a.pk) for a, _ in items),
            reason,
        )
        for attempt, _ in items:
            attempt.lane.release(attempt)
        self.worker.exit_code = 1

    def _write(self, batch: list[Item]) -> None:
        completed: dict[Lane, list[Item]] = defaultdict(list)
        others: list[tuple[Lane, str, list[Item]]] = []
        for attempt, outcome in batch:
            if outcome.state == JobState.COMPLETED and not attempt.lane.handler.ack_each_job:
                completed[attempt.lane].append((attempt, outcome))
            else:
                others.append((attempt.lane, outcome.state, [(attempt, outcome)]))
        groups = [(lane, JobState.COMPLETED.value, items) for lane, items in completed.items()]
        groups += others
        backoff = Backoff(base=0.2, cap=5.0)
        for group in groups:
            while True:
                try:
                    self._write_group(*group)
                    break
                except Exception as exc:
                    if self._give_up_at is not None and time.monotonic() > self._give_up_at:
                        self._give_up(group[2], exc)
                        break
                    delay = backoff.next()
                    logger.warning(
                        "could not write outcomes of jobs %s (%s); retrying in %.1fs",
                        ", ".join(str(a.pk) for a, _ in group[2]),
                        exc,
                        delay,
                    )
                    self._conn(group[0].alias).close()
                    time.sleep(delay)

    def _write_group(self, lane: Lane, state: str, items: list[Item]) -> None:
        stmts, me = lane.stmts, self.worker.worker_id
        conn = self._conn(lane.alias)
        ids = [a.pk for a, _ in items]
        outcome = items[0][1]
        written: dict[Any, str] = {}
        if state == "lost":
            pass
        elif state == JobState.COMPLETED:
            rows = conn.execute(stmts.complete, [stmts.ids_param(ids), me])
            written = {row[0]: JobState.COMPLETED for row in rows}
        elif state in (JobState.ERRORED, JobState.FAILED):
            rows = conn.execute(
                stmts.error,
                [
                    outcome.non_retryable,
                    lane.handler.max_num_retries,
                    outcome.message,
                    float(outcome.retry_delay),
                    ids[0],
                    me,
                ],
            )
            written = {ids[0]: rows[0][0]} if rows else {}
        elif state == JobState.CANCELED:
            rows = conn.execute(stmts.cancel, [outcome.message, stmts.ids_param(ids), me])
            written = {row[0]: JobState.CANCELED for row in rows}
        elif state == JobState.QUEUED:
            rows = conn.execute(stmts.requeue, [stmts.ids_param(ids), me])
            written = {row[0]: JobState.QUEUED for row in rows}
            if rows:
                conn.notify(lane.table)
        locked: set[Any] = set()
        missing = [pk for pk in ids if pk not in written]
        if state != "lost" and missing and stmts.pg:
            # Rows the statement skipped because another transaction locks them are still
            # ours: write them later. Only the others were reset or deleted meanwhile.
            locked = {
                row[0] for row in conn.execute(stmts.still_held, [stmts.ids_param(missing), me])
            }
        completed: list[Item] = []
        for attempt, result in items:
            if attempt.pk in locked:
                self._set_aside(lane, attempt, result)
                continue
            self._locked_noted.discard(attempt)
            if written.get(attempt.pk) == JobState.COMPLETED:
                completed.append((attempt, result))
            else:
                self._report(lane, attempt, result, written.get(attempt.pk))
            lane.release(attempt)
            self.written += 1
        self._report_completed(lane, completed)

    def _set_aside(self, lane: Lane, attempt: Attempt, outcome: Outcome) -> None:
        if not self._locked:
            self._retry_at = time.monotonic() + LOCKED_RETRY
        self._locked.append((attempt, outcome))
        if attempt not in self._locked_noted:
            self._locked_noted.add(attempt)
            logger.info(
                "job %s: row locked by another transaction; its outcome (%s) waits for it",
                lane.job_label(attempt.pk),
                outcome.state,
                extra={"job_id": attempt.pk, "handler": lane.label},
            )

    def _report_completed(self, lane: Lane, items: list[Item]) -> None:
        """One INFO line for the jobs one statement completed: per job at low load, one
        line listing them all under load (a log record per job would cost more than the
        job: about a third of a core at 20,000 jobs/s)."""
        if not items or not logger.isEnabledFor(logging.INFO):
            return
        if len(items) == 1:
            attempt, outcome = items[0]
            self._report(lane, attempt, outcome, JobState.COMPLETED)
            return
        ids = [attempt.pk for attempt, _ in items]
        durations = [outcome.duration * 1000 for _, outcome in items]
        logger.info(
            "%d jobs of %s completed in %.0f–%.0f ms: %s",
            len(ids),
            lane.model._meta.label,
            min(durations),
            max(durations),
            ", ".join(map(str, ids)),
            extra={"job_ids": ids, "handler": lane.label, "state": JobState.COMPLETED.value},
        )

    def _report(self, lane: Lane, attempt: Attempt, outcome: Outcome, state: str | None) -> None:
        label = lane.job_label(attempt.pk)
        extra = {"job_id": attempt.pk, "handler": lane.label, "state": state}
        ms = outcome.duration * 1000
        if outcome.state == "lost":
            logger.warning(
                "job %s: no longer ours (deleted, or reset and claimed again); outcome dropped",
                label,
                extra=extra,
            )
        elif state is None:
            logger.warning(
                "job %s: outcome %s refused, the job was reset or deleted meanwhile",
                label,
                outcome.state,
                extra=extra,
            )
        elif state == JobState.COMPLETED:
            logger.info("job %s: completed in %.0f ms", label, ms, extra=extra)
        elif state == JobState.QUEUED and outcome.error is None:
            logger.info("job %s: %s", label, outcome.message, extra=extra)
        elif state == JobState.ERRORED:
            logger.warning(
                "job %s: errored in %.0f ms, retry in %.0fs: %s",
                label,
                ms,
                outcome.retry_delay,
                _first_line(outcome.message),
                extra=extra,
            )
        else:
            logger.warning(
                "job %s: %s after %.0f ms: %s",
                label,
                state,
                ms,
                _first_line(outcome.message),
                extra=extra,
            )


def _first_line(text: str | None) -> str:
    return (text or "").split("\n", 1)[0]
