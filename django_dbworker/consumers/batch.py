"""One batch of one consumer: guard, window, frontier, handle_batch, checkpoint.

Transactional mode, in one transaction on the consumed model's database:

1. the guard: ``UPDATE`` of the checkpoint row where ``owner``, ``generation`` and
   ``running_by`` are still ours, returning its position, paused flag and head, the
   batch's statements and idle time bounded by ``batch_timeout`` where the database
   can (``sql.consumers.take_turn``: PostgreSQL and MariaDB). It
   locks the row until the end of the transaction: the leader's change of owner
   waits for the batch, and a batch of a process that lost the consumer finds no row
   and stops (``Lost``);
2. the window: up to ``batch_size`` rows after the checkpoint, unscoped, with a
   flag for ``scope``, in one statement (one snapshot);
3. the frontier (``frontier.GapWatch``) and the rows of scope up to it;
4. ``handle_batch`` (``self.batch`` tells it the fence); a batch past
   ``batch_timeout`` raises ``BatchTimeout`` (on PostgreSQL and MariaDB the server
   also ends a statement or an idle transaction past it);
5. ``position`` moves to the frontier and ``head`` to the highest position seen
   (the table's, read at most every ``HEAD_REFRESH`` s while behind), passed gaps
   go to the audit; commit.

At-least-once mode reads the window outside a transaction, runs ``handle_batch``,
then moves the checkpoint with a compare-and-set on the old position: a batch that
returned is checkpointed however long it took (its side effects are done; the
timeout bounds waiting, and the runner's watchdog counts a batch that runs past it).

A batch that finds nothing to advance marks the consumer caught up (an empty window,
at most every ``HEAD_REFRESH`` s) or notes the head it saw beyond a gap, so readers
can tell how long it has been behind the table's head (``status``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from django.db import connections, router, transaction
from django.db.models import BooleanField, ExpressionWrapper

from ..sql.consumers import lock_wait, take_turn
from ..sql.dialects import dialect_for
from ..sql.mysql_session import UTCNow
from .consumer import Batch, Consumer, set_current_batch
from .frontier import GapWatch, Step
from .models import ConsumerCheckpoint, ConsumerGapSkip
from .status import table_head

logger = logging.getLogger("django_dbworker.consumers")

IN_SCOPE = "_dbworker_in_scope"
#: Seconds between reads of the table's head (``MAX(position)``) while a consumer is
#: behind, and between two marks of an idle consumer as caught up.
HEAD_REFRESH = 1.0
#: How long the runner's watchdog waits for the checkpoint row when it counts a hung
#: batch (the hung transaction may hold it until the server ends it), in seconds.
HUNG_LOCK_WAIT = 1.0


class Lost(Exception):
    """The checkpoint row is no longer ours (reassigned, paused, or taken over)."""


class BatchTimeout(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class Fence:
    name: str
    worker_id: str
    generation: int


@dataclasses.dataclass(frozen=True)
class Result:
    handled: int
    advanced: int
    #: The window was full: more rows are probably waiting.
    full: bool
    waiting_for: int | None


def consumer_alias(consumer: Consumer) -> str:
    assert consumer.model is not None
    return router.db_for_write(consumer.model)


class Batches:
    """Runs the batches of one consumer for one worker (one thread)."""

    def __init__(self, consumer: Consumer, fence: Fence, gap_threshold: float) -> None:
        assert consumer.model is not None
        self.consumer = consumer
        self.model = consumer.model
        self.fence = fence
        self.alias = consumer_alias(consumer)
        self.gaps = GapWatch(gap_threshold)
        self._head_due = 0.0  # when to read the table's head again (monotonic)
        self._idle_due = 0.0  # when an idle batch may mark the consumer caught up again
        #: Failed batches in a row before the running one (read with each batch).
        self.failures = 0

    def _fenced(self) -> dict[str, Any]:
        """The checkpoint row's fields while it is ours."""
        f = self.fence
        return {
            "name": f.name,
            "owner": f.worker_id,
            "generation": f.generation,
            "running_by": f.worker_id,
        }

    def _guarded(self) -> Any:
        return ConsumerCheckpoint.objects.using(self.alias).filter(**self._fenced())

    def _window(self, after: int) -> list[Any]:
        c = self.consumer
        field = c.position_field
        qs = self.model._default_manager.using(self.alias).filter(**{f"{field}__gt": after})
        if c.scope is not None:
            qs = qs.annotate(**{IN_SCOPE: ExpressionWrapper(c.scope, output_field=BooleanField())})
        return list(qs.order_by(field)[: c.batch_size])

    def _plan(self, position: int) -> tuple[list[Any], Step, list[Any]]:
        rows = self._window(position)
        field = self.consumer.position_field
        positions = [getattr(r, field) for r in rows]
        head = (
            head_of(self.consumer) if positions and positions[-1] != position + len(rows) else None
        )
        step = self.gaps.step(position, positions, time.monotonic(), head)
        chosen = [r for r in rows if getattr(r, field) <= step.frontier]
        if self.consumer.scope is not None:
            chosen = [r for r in chosen if getattr(r, IN_SCOPE)]
        return rows, step, chosen

    def _timed_out(self, started: float) -> None:
        if time.monotonic() - started > self.consumer.batch_timeout:
            raise BatchTimeout(f"batch took over {self.consumer.batch_timeout:g}s")

    def _record(
        self, position: int, head: int, step: Step, rows: list[Any], checkpoint: Any
    ) -> None:
        """Move the checkpoint to the frontier and note the head: the highest position
        seen, refreshed from the table at most every ``HEAD_REFRESH`` seconds while the
        window comes back full (a backlog). A batch that started with nothing known
        beyond the checkpoint marks when the consumer was last caught up."""
        field = self.consumer.position_field
        seen = max([getattr(r, field) for r in rows] + [position])
        now = time.monotonic()
        if len(rows) >= self.consumer.batch_size and now >= self._head_due:
            seen = max(seen, head_of(self.consumer))
            self._head_due = now + HEAD_REFRESH
        fields: dict[str, Any] = {}
        if head <= position:
            fields["caught_up_at"] = UTCNow()
        updated = checkpoint.update(
            position=step.frontier,
            head=max(seen, head),
            failures=0,
            failing=False,
            last_error="",
            last_batch_at=UTCNow(),
            updated_at=UTCNow(),
            **fields,
        )
        if not updated:
            raise Lost(self.fence.name)
        if step.skipped:
            ConsumerGapSkip.objects.using(self.alias).bulk_create(
                ConsumerGapSkip(
                    consumer=self.fence.name,
                    first_position=first,
                    last_position=last,
                    waited=waited,
                    worker=self.fence.worker_id,
                )
                for first, last, waited in step.skipped
            )
            for first, last, waited in step.skipped:
                logger.warning(
                    "consumer %s: passed missing positions %d..%d after %.1fs",
                    self.fence.name,
                    first,
                    last,
                    waited,
                    extra={"action": "gap_skip", "consumer": self.fence.name},
                )

    def run_once(self) -> Result:
        if not self.consumer.transactional:
            state = self._guarded().values_list("position", "paused", "head", "failures").first()
            if state is None:
                raise Lost(self.fence.name)
            return self._batch(time.monotonic(), *state)
        # The checkpoint row touched if it is still ours, locked to the end of the batch.
        with (
            transaction.atomic(using=self.alias),
            take_turn(
                ConsumerCheckpoint, self.alias, self._fenced(), self.consumer.batch_timeout
            ) as turn,
        ):
            started = time.monotonic()
            if turn is None:
                raise Lost(self.fence.name)
            return self._batch(started, *turn)

    def _batch(
        self, started: float, position: int, paused: bool, head: int, failures: int
    ) -> Result:
        self.failures = failures
        if paused:
            return Result(0, 0, False, None)
        rows, step, chosen = self._plan(position)
        if step.frontier == position:
            self._idle(position, head, rows)
            return Result(0, 0, False, step.waiting_for)
        if chosen:
            self._handle(chosen, position, step.frontier)
        if self.consumer.transactional:
            self._timed_out(started)
            self._record(position, head, step, rows, self._guarded())
        else:  # a compare-and-set on the position read before the batch
            with transaction.atomic(using=self.alias):
                checkpoint = self._guarded().filter(position=position)
                self._record(position, head, step, rows, checkpoint)
        self.failures = 0
        return Result(
            len(chosen),
            step.frontier - position,
            len(rows) >= self.consumer.batch_size,
            step.waiting_for,
        )

    def _handle(self, rows: list[Any], position: int, frontier: int) -> None:
        f = self.fence
        batch = Batch(
            f.name, f.generation, f.worker_id, position + 1, frontier, self._guarded().exists
        )
        set_current_batch(batch)
        try:
            self.consumer.handle_batch(rows)
        finally:
            set_current_batch(None)

    def _idle(self, position: int, head: int, rows: list[Any]) -> None:
        """Nothing to advance: an empty window marks the consumer caught up (at most
        every ``HEAD_REFRESH`` s); rows past a gap raise the head it saw, once."""
        if rows:
            seen = getattr(rows[-1], self.consumer.position_field)
            if seen > head:
                self._guarded().update(head=seen)
            return
        now = time.monotonic()
        if now >= self._idle_due:
            self._guarded().update(caught_up_at=UTCNow(), head=position)
            self._idle_due = now + HEAD_REFRESH

    def failed(self, exc: BaseException, counted: int = 0) -> int:
        """Count a failed batch (unless the watchdog counted it already ``counted``
        times while it ran); the failures in a row (0 if the row is not ours)."""
        return self._count_failure(f"{type(exc).__name__}: {exc}", 0 if counted else 1)

    def hung(self, seconds: float) -> int | None:
        """Count a failure for the batch still running after ``seconds`` (the runner's
        watchdog, from its own thread); the failures in a row, or None when the row
        cannot be written now (SQLite: the hung batch holds the write lock)."""
        if self.consumer.transactional and not dialect_for(connections[self.alias]).row_locks:
            return None
        message = (
            f"BatchTimeout: batch still running after {seconds:.1f}s "
            f"(batch_timeout {self.consumer.batch_timeout:g}s)"
        )
        return self._count_failure(message, 1, wait=HUNG_LOCK_WAIT) or None

    def _count_failure(self, message: str, add: int, wait: float | None = None) -> int:
        try:
            with transaction.atomic(using=self.alias), lock_wait(self.alias, wait):
                row = self._guarded().select_for_update().first()
                if row is None:
                    return 0
                row.failures += add
                row.failing = row.failures >= self.consumer.max_failures
                row.last_error = message[:10_000]
                row.save(update_fields=["failures", "failing", "last_error"])
                return int(row.failures)
        except Exception as again:
            logger.warning("consumer %s: could not record a failure: %s", self.fence.name, again)
            return 0


def head_of(consumer: Consumer) -> int:
    assert consumer.model is not None
    return table_head(consumer.model, consumer.position_field, consumer_alias(consumer))
