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
once.

Execution logs go through this thread too: a handler's ``log()`` only marks
its attempt's log as changed; the writer writes the whole log of that attempt
in one statement (however many changes it gathered meanwhile), before any
outcome of that attempt, and on a locked row it waits like an outcome does,
without holding up any other job. So does an attempt's last check-in: its outcome
never ends the row without it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Any

from ..exceptions import CancelReason
from ..sql.connection import Connections
from .attempt import Attempt
from .backoff import Backoff
from .completer import Completer
from .events import Events
from .health import DatabaseHealth
from .logs import extra
from .outages import Outages
from .outcome import Outcome, OutcomeKind
from .reports import report, report_completed

if TYPE_CHECKING:
    from .lane import Lane

logger = logging.getLogger("django_dbworker.writer")

MAX_BATCH = 1000
#: Seconds between two tries of an outcome whose row another transaction has locked.
LOCKED_RETRY = 0.5

#: An outcome to write, or (outcome None) an attempt whose execution log changed.
Item = tuple[Attempt, Outcome | None]


class Writer(threading.Thread):
    """``on_died``: the thread ended on an unexpected error (the worker then stops);
    ``on_gave_up``: outcomes were given up on at shutdown (the exit code says so)."""

    def __init__(
        self,
        worker_id: str,
        health: DatabaseHealth,
        on_died: Callable[[], None],
        on_gave_up: Callable[[], None],
        events: Events | None = None,
    ) -> None:
        super().__init__(name="dbworker-writer", daemon=True)
        self.worker_id = worker_id
        self.health = health
        self.on_died = on_died
        self.on_gave_up = on_gave_up
        #: Told of every outcome written (and when there is nothing to write).
        self.events = events or Events([])
        self.completer = Completer(worker_id)
        self._queue: SimpleQueue[Item | None] = SimpleQueue()
        self._conn = Connections("writer")
        self._give_up_at: float | None = None
        #: Outcomes whose rows were locked by another transaction, retried at _retry_at.
        self._locked: list[Item] = []
        self._locked_noted: set[Attempt] = set()
        self._retry_at = 0.0
        #: The write under way follows a failed try of it (``_retrying``).
        self._retry = False
        self.written = 0
        #: Outcomes by the state they wrote ("lost": the job was no longer ours).
        self.counts: Counter[str] = Counter()
        #: The thread ended on an unexpected error (the worker then stops).
        self.died = False
        #: The worker's job tables live on several databases (set by the worker): the
        #: writes of one out of reach wait in ``_outages`` while the others' go on.
        self.several_databases = False
        self._outages = Outages()
        #: Attempts whose write failed on a lost connection: it may have landed.
        self._maybe_landed: set[Attempt] = set()

    def submit(self, attempt: Attempt, outcome: Outcome | None) -> None:
        """Write ``outcome`` of ``attempt``, or (None) its changed execution log."""
        self._queue.put((attempt, outcome))

    def stop(self, deadline: float) -> None:
        """Write what is queued, retrying failures until ``deadline``, then end."""
        self._give_up_at = deadline
        self._queue.put(None)

    def run(self) -> None:
        # The observers told from this thread (the statistics) write through its
        # connections.
        with self._conn.bind():
            self._run()

    def _run(self) -> None:
        clean = False
        try:
            stopping = False
            while not stopping or self._locked or self._outages:
                batch: list[Item] = self._outages.due() if self._outages else []
                if self._locked and time.monotonic() >= self._retry_at:
                    batch += self._locked
                    self._locked = []
                elif stopping and not batch:
                    if self._give_up_at is not None and time.monotonic() > self._give_up_at:
                        reason = "their rows stay locked or their database is out of reach"
                        self._give_up(self._locked + self._outages.take_all(), reason)
                        break
                    wake = self._next_retry() or time.monotonic() + LOCKED_RETRY
                    time.sleep(max(0.0, min(wake - time.monotonic(), LOCKED_RETRY)))
                    continue
                if not stopping:
                    stopping = self._collect(batch)
                if batch:
                    self._write(batch)
            clean = True
        finally:
            if not clean:
                self.died = True
                self.on_died()
            self.events.close()
            self._conn.close()

    def _collect(self, batch: list[Item]) -> bool:
        """Add what handler threads submitted to ``batch``; True once told to stop."""
        if not batch:
            retry = self._next_retry()
            timeout = None if retry is None else max(retry - time.monotonic(), 0.0)
            try:
                item = self._queue.get_nowait()
            except Empty:
                again = self.events.idle()  # nothing to write now: observers may flush
                if again is not None:
                    timeout = again if timeout is None else min(timeout, again)
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

    def _next_retry(self) -> float | None:
        """When set-aside writes are next due (monotonic): rows that were locked, or a
        database that was out of reach."""
        times = [self._retry_at] if self._locked else []
        down = self._outages.next_at()
        return min(times + ([down] if down is not None else []), default=None)

    def _give_up(self, items: list[Item], reason: object) -> None:
        logger.error(
            "giving up writing outcomes of jobs %s (%s); the resetter will bring them back",
            ", ".join(str(a.pk) for a, _ in items),
            reason,
            extra=extra("gave_up", worker=self.worker_id, jobs=[a.pk for a, _ in items]),
        )
        dropped = []
        for attempt, outcome in items:
            if outcome is not None:
                outcome.state = "lost"
                self._mark_written(attempt, None)
                attempt.lane.release(attempt)
                dropped.append((attempt, outcome, None))
        if dropped:
            self.events.finished(dropped[0][0].lane, dropped)
        self.on_gave_up()

    def _write(self, batch: list[Item]) -> None:
        committed = [item for item in batch if item[1] is not None and item[1].committed]
        if committed:  # written in the handlers' transactions: nothing left to write
            self._settle(committed)
            batch = [item for item in batch if not (item[1] is not None and item[1].committed)]
        if self._outages:  # what comes for a database out of reach waits for its retry
            down = [item for item in batch if item[0].lane.alias in self._outages]
            for item in down:
                self._outages.hold(item[0].lane.alias, [item])
            batch = [item for item in batch if item[0].lane.alias not in self._outages]
        # Execution logs first, each attempt's once: an outcome ends the attempt, and its
        # log can be written no more after that.
        blocked: set[Attempt] = set()
        flushed: set[Attempt] = set()
        for attempt, _ in batch:
            if attempt not in flushed and attempt.logs_pending and not attempt.written:
                # (Written: a thread left running past its maximum runtime logs on, while
                # a retry this worker claimed, fenced by the same worker id, may run.)
                flushed.add(attempt)
                self._retrying(attempt.lane, [(attempt, None)], self._write_logs, blocked)
        # Check-ins made since the last heartbeat: the row keeps the last one with the
        # outcome (an attempt that checked in at all has its ``progress`` set).
        checked_in: dict[Lane, list[Item]] = defaultdict(list)
        for attempt, outcome in batch:
            if outcome is not None and attempt.progress is not None and attempt not in blocked:
                checked_in[attempt.lane].append((attempt, outcome))
        for lane, items in checked_in.items():
            self._retrying(lane, items, self._write_progress, blocked)
        completed: dict[Lane, list[Item]] = defaultdict(list)
        groups: list[tuple[Lane, OutcomeKind, list[Item]]] = []
        for attempt, outcome in batch:
            if outcome is None:
                continue
            if attempt in blocked:  # its log waits for a row lock: so does its outcome
                self._set_aside(attempt.lane, attempt, outcome)
            elif outcome.kind is OutcomeKind.COMPLETED and not attempt.lane.handler.ack_each_job:
                completed[attempt.lane].append((attempt, outcome))
            else:
                groups.append((attempt.lane, outcome.kind, [(attempt, outcome)]))
        groups[:0] = [(lane, OutcomeKind.COMPLETED, items) for lane, items in completed.items()]
        for lane, kind, items in groups:
            self._retrying(lane, items, self._write_group, kind)

    def _retrying(
        self,
        lane: Lane,
        items: list[Item],
        write: Callable[..., Any],
        *args: Any,
    ) -> None:
        """``write(lane, items, *args)``, retried with backoff until it succeeds or the
        writer gives up (at shutdown)."""
        backoff = Backoff(base=0.2, cap=5.0)
        self._retry = False
        if lane.alias in self._outages:  # went out of reach earlier in this batch
            self._outages.hold(lane.alias, items)
            return
        while True:
            try:
                write(lane, items, *args)
                self.health.ok("writer", lane.alias)
                if self.several_databases:
                    self._outages.reached(lane.alias)
                return
            except Exception as exc:
                conn = self._conn(lane.alias)
                if self._give_up_at is not None and time.monotonic() > self._give_up_at:
                    self._give_up(items, exc)
                    return
                self.events.statement_failed("write")
                if conn.lost and self.several_databases:
                    # One database of several out of reach: its writes wait (in their
                    # order) while the other databases' go on.
                    delay = self._outages.hold(lane.alias, items)
                    self._maybe_landed.update(attempt for attempt, _ in items)
                    self.health.failed("writer", exc, delay, lane.alias)
                    conn.close()
                    return
                delay = backoff.next()
                if conn.lost:
                    self.health.failed("writer", exc, delay, lane.alias)
                else:
                    logger.warning(
                        "could not write %s of jobs %s (%s); retrying in %.1fs",
                        "outcomes" if items[0][1] is not None else "the execution log",
                        ", ".join(str(a.pk) for a, _ in items),
                        exc,
                        delay,
                        extra=extra(
                            "write_failed", worker=self.worker_id, jobs=[a.pk for a, _ in items]
                        ),
                    )
                conn.close()
                time.sleep(delay)
                # The failed try may have committed before its reply was lost.
                self._retry = True

    def _write_logs(self, lane: Lane, items: list[Item], blocked: set[Attempt]) -> None:
        """Write the execution log of one attempt; a locked row puts it in ``blocked``."""
        attempt = items[0][0]
        result = self.completer.write_logs(self._conn(lane.alias), lane, attempt)
        if result == "locked":
            blocked.add(attempt)
            self._set_aside(lane, attempt, None)
        elif result == "lost":
            attempt.request_cancel(CancelReason.LOST)

    def _write_progress(self, lane: Lane, items: list[Item], blocked: set[Attempt]) -> None:
        """Write the last check-ins of ``items``; a locked row puts its attempt in
        ``blocked`` (its outcome waits, so the row never ends without its check-in)."""
        conn = self._conn(lane.alias)
        blocked.update(self.completer.write_progress(conn, lane, [a for a, _ in items]))

    def _write_group(self, lane: Lane, items: list[Item], kind: OutcomeKind) -> None:
        conn = self._conn(lane.alias)
        written = self.completer.write(conn, lane, kind, items)
        unwritten = [
            (a, o) for a, o in items if a.pk not in written.states and a.pk not in written.locked
        ]
        retried = self._retry or any(a in self._maybe_landed for a, _ in unwritten)
        if retried and unwritten and kind.statement is not None:
            # Tried again after a failure: the earlier try may have landed.
            written.states.update(self.completer.landed(conn, lane, kind, unwritten).states)
        completed: list[tuple[Attempt, Outcome]] = []
        done: list[tuple[Attempt, Outcome, str | None]] = []
        for attempt, outcome in items:
            assert outcome is not None
            if attempt.pk in written.locked:
                self._set_aside(lane, attempt, outcome)
                continue
            self._locked_noted.discard(attempt)
            state = written.states.get(attempt.pk)
            if kind is OutcomeKind.COMPLETED and state is not None:
                completed.append((attempt, outcome))
            else:
                report(lane, attempt, outcome, state)
            outcome.state = state or "lost"  # what post_handle and job_finished see
            self._mark_written(attempt, state)
            done.append((attempt, outcome, state))
            self.written += 1
        if done:
            lane.release(*(attempt for attempt, _, _ in done))
        report_completed(lane, completed)
        self.events.finished(lane, done)

    def _settle(self, items: list[Item]) -> None:
        """The bookkeeping of outcomes their attempts' own transactions committed
        (``runtime.atomic``), as for those this thread writes."""
        lanes: dict[Lane, list[tuple[Attempt, Outcome]]] = defaultdict(list)
        for attempt, outcome in items:
            assert outcome is not None
            lanes[attempt.lane].append((attempt, outcome))
        for lane, pairs in lanes.items():
            done: list[tuple[Attempt, Outcome, str | None]] = []
            for attempt, outcome in pairs:
                outcome.state = OutcomeKind.COMPLETED.state
                self._mark_written(attempt, outcome.state)
                done.append((attempt, outcome, outcome.state))
                self.written += 1
            lane.release(*(attempt for attempt, _ in pairs))
            report_completed(lane, pairs)
            self.events.finished(lane, done)

    def _mark_written(self, attempt: Attempt, state: str | None) -> None:
        """The outcome of ``attempt`` is written as ``state`` (None: refused or dropped);
        its lane is told next, to stop holding the job."""
        attempt.mark_written(state)
        self._maybe_landed.discard(attempt)
        self.counts[state or "lost"] += 1

    def _set_aside(self, lane: Lane, attempt: Attempt, outcome: Outcome | None) -> None:
        if not self._locked:
            self._retry_at = time.monotonic() + LOCKED_RETRY
        self._locked.append((attempt, outcome))
        if attempt not in self._locked_noted:
            self._locked_noted.add(attempt)
            what = f"its outcome ({outcome.state})" if outcome else "its execution log"
            logger.info(
                "job %s: row locked by another transaction; %s waits for it",
                attempt.label,
                what,
                extra=extra("locked", worker=self.worker_id, job=attempt.pk, handler=lane.label),
            )
