"""Jobs that wait for a time, released when it comes: the stager.

A queued or errored job with ``process_after`` set (scheduled for later, or waiting
for a retry's delay) is not in the dequeue index, so a claim never reads it, however
many wait: the claim's cost does not depend on them. When such a job comes due, a
worker *stages* it (``JobStatements.stage``): ``process_after`` is cleared and
``queued_at`` becomes the time it came due, which puts it in the dequeue index, and
the claims take it in the handler's ordering like any other job.

Each worker knows, per job table it serves, when the next waiting job comes due
(``JobStatements.next_due``: the first entry of the waiting index) and wakes its
dispatcher at that moment: a scheduled job starts within a claim's latency of its
time, not after a polling interval. It reads that time again

- at start, and after it staged rows;
- when jobs are enqueued into the table (a NOTIFY, or on other databases the probe
  of the table's largest key): a new job may be due earlier;
- when one of its own jobs errors with a retry delay, or snoozes (its writer says
  when);
- and at the latest every ``max_interval`` of the table's lanes (what no one says:
  an operator's ``schedule()``, another worker's retries).

Every worker of a table does the same: whichever comes first stages the rows (the
others skip the rows it locks) and the others' claims find them; on PostgreSQL the
staged rows also wake every worker (the update trigger's NOTIFY).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..sql import triggers
from ..sql.jobs import STAGE_BATCH, JobStatements
from ..states import JobState
from .events import Observer, Written
from .outcome import OutcomeKind

if TYPE_CHECKING:
    from ..sql.connection import Runner
    from .lane import Lane

logger = logging.getLogger("django_dbworker.worker")

NEVER = float("inf")


@dataclasses.dataclass
class _Table:
    alias: str
    table: str
    stmts: JobStatements
    #: Longest time between two reads of the next due time.
    reprobe: float
    #: When (monotonic) the next waiting row comes due; NEVER: none waits.
    due_at: float = NEVER
    #: When to read the next due time again (0: at once).
    probe_at: float = 0.0


class Stager(Observer):
    """Stages the waiting rows of the tables of its lanes when they come due. Run by
    the dispatcher (``run``); told of retries by the writer (``finished``) and of
    inserts by the listener or the probe (``news``)."""

    #: The most rows one statement stages.
    batch = STAGE_BATCH

    def __init__(self, wake: Callable[[], None] = lambda: None) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._tables: dict[tuple[str, str], _Table] = {}

    def attach(self, lanes: Sequence[Lane]) -> None:
        for lane in lanes:
            key = (lane.alias, lane.table)
            known = self._tables.get(key)
            if known is None:
                self._tables[key] = _Table(lane.alias, lane.table, lane.stmts, lane.max_interval)
            else:
                known.reprobe = min(known.reprobe, lane.max_interval)

    def __bool__(self) -> bool:
        return bool(self._tables)

    # -- what others tell it (other threads) -----------------------------------------

    def news(self, table: str) -> None:
        """Rows were enqueued into ``table`` (``"*"``: any): read its next due time."""
        for known in self._tables.values():
            if table in ("*", known.table):
                known.probe_at = 0.0

    def finished(self, lane: Lane, written: Sequence[Written]) -> None:
        """A job of ours errored with a retry delay, or snoozed: it comes due then
        (writer thread)."""
        delays = [
            outcome.retry_delay
            for _, outcome, state in written
            if outcome.retry_delay > 0
            and (
                state == JobState.ERRORED
                or (state == JobState.QUEUED and outcome.kind is OutcomeKind.SNOOZED)
            )
        ]
        known = self._tables.get((lane.alias, lane.table))
        if delays and known is not None and self._expect(known, time.monotonic() + min(delays)):
            self._wake()

    # -- the dispatcher's part -------------------------------------------------------

    def run(
        self,
        now: float,
        conn: Callable[[str], Runner],
        staged: Callable[[str], None],
        failed: Callable[[str, Exception], float] | None = None,
    ) -> float:
        """Stage what came due, read the next due times that are to be read again;
        ``staged(table)`` for each table whose rows became claimable. Seconds until it
        is due again. ``failed(alias, error)``: a statement on database ``alias`` failed
        (its tables are tried again after the seconds it returns, the others go on);
        without it, the error is raised."""
        wait = NEVER
        for known in self._tables.values():
            try:
                wait = min(wait, self._run_table(known, now, conn(known.alias), staged))
            except Exception as exc:
                if failed is None:
                    raise
                delay = failed(known.alias, exc)
                known.probe_at = now + delay
                wait = min(wait, delay)
        return max(wait, 0.0)

    def _run_table(
        self, known: _Table, now: float, runner: Runner, staged: Callable[[str], None]
    ) -> float:
        """``run`` for one table: seconds until it is due again."""
        if known.due_at <= now:
            got = self.stage(known, runner)
            if got:
                staged(known.table)
            if got >= self.batch:  # more came due than one statement takes: go on
                self._expect(known, now)
                return 0.0
            known.probe_at = 0.0
        if known.probe_at <= now:
            self._probe(known, runner, now)
        return min(known.due_at - now, known.probe_at - now)

    def settle(self, conn: Callable[[str], Runner], staged: Callable[[str], None]) -> bool:
        """Stage every row that is due now, whatever was known (``--burst`` asks before
        it ends), ``staged(table)`` for each table it staged rows of; whether any."""
        any_staged = False
        for known in self._tables.values():
            runner = conn(known.alias)
            while (got := self.stage(known, runner)) > 0:
                any_staged = True
                staged(known.table)
                if got < self.batch:
                    break
            self._probe(known, runner, time.monotonic())
        return any_staged

    def stage(self, known: _Table, runner: Runner) -> int:
        """One ``stage`` statement on ``known``'s table: how many rows it staged."""
        with self._lock:  # a retry noted meanwhile is read again after it
            known.due_at = NEVER
        count = len(runner.execute(known.stmts.stage_batch(self.batch)))
        if count:
            logger.debug("%s: %d waiting job(s) came due", known.table, count)
            if not triggers.wanted():  # the update trigger's NOTIFY wakes the others
                runner.notify(known.table)
        return count

    def _expect(self, known: _Table, when: float) -> bool:
        """A row of ``known``'s table comes due at ``when``: whether that is sooner than
        it knew."""
        with self._lock:
            if when >= known.due_at:
                return False
            known.due_at = when
            return True

    def _probe(self, known: _Table, runner: Runner, now: float) -> None:
        [(seconds,)] = runner.execute(known.stmts.next_due)
        due_at = NEVER if seconds is None else now + max(float(seconds), 0.0)
        with self._lock:
            known.due_at = min(known.due_at, due_at)
        known.probe_at = now + known.reprobe


def stage_due(runner: Runner, stmts: JobStatements) -> int:
    """Stage every row of ``stmts``' table that is due now (the testing helpers'
    claims, which run no dispatcher); how many."""
    total = 0
    while (got := len(runner.execute(stmts.stage))) > 0:
        total += got
        if got < STAGE_BATCH:
            break
    return total
