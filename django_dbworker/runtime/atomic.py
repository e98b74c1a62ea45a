"""Attempts whose outcome commits with the handler's writes (docs/transactions.md).

A transactional attempt (``Handler.atomic``, a ``complete()`` phase, or
``attempt.completing()`` from inside ``handle``) writes its completion on the
handler thread's own Django connection, inside the transaction that holds the
handler's writes, fenced to the attempt (``sql.atomic``) before that transaction
commits. So either both commit or neither does:

- the handler raises: its transaction rolls back, and the error is written after it
  by the writer, as for any handler;
- the fenced completion finds nothing (the row was reset and claimed again, deleted,
  or is no longer this worker's): ``Uncommitted`` rolls everything back, and the
  writer writes nothing for the attempt (``lost``);
- the attempt is not to complete (past its maximum runtime, lost per the heartbeat):
  the same rollback, and the writer writes the outcome decided;
- it commits: the writer writes nothing either, and only does the bookkeeping of a
  written outcome (the job let go, ``post_handle``, signals, statistics).

What each attempt's completion did is ``attempt.completion``: None (nothing yet),
``WRITTEN`` (in a transaction not committed yet), ``COMMITTED``, ``LOST``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from ..sql.atomic import complete_one
from .logs import extra
from .outcome import Outcome, OutcomeKind

if TYPE_CHECKING:
    from .attempt import Attempt
    from .execution import Execution

logger = logging.getLogger("django_dbworker.lane")

WRITTEN, COMMITTED, LOST = "written", "committed", "lost"


class Uncommitted(BaseException):
    """Rolls an attempt's transaction back: its outcome is ``outcome``, not a completion
    (``Outcome.lost()``: the row is no longer the attempt's). A ``BaseException``, so a
    handler's ``except Exception`` does not keep the transaction alive."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.kind.name.lower())
        self.outcome = outcome


class Completion:
    """What ``Attempt`` has of this: its completion's state and the phases' context."""

    #: What the attempt's own transaction did with its completion: None, ``WRITTEN``,
    #: ``COMMITTED``, ``LOST``; and what ``handle()`` returned, as it returned it.
    completion: str | None = None
    returned: Any = None
    #: Runs ``handle`` in the transaction (``Handler.is_atomic``).
    atomic = False
    _context: dict[str, Any] | None = None

    @property
    def context(self) -> dict[str, Any]:
        """What middleware hands to the handler and to the later phases (one dict per
        attempt): ``attempt.context["tenant"] = …`` in a middleware, read in the handler
        as ``self.attempt.context["tenant"]``."""
        if self._context is None:
            self._context = {}
        return self._context

    def completing(self, result: Any = None) -> contextlib.AbstractContextManager[None]:
        """A transaction on the job's database whose end writes the job's completion
        (with ``result`` for a ``result_field``), fenced to this attempt: the block's
        writes and the outcome commit together, or neither does (docs/transactions.md).
        For sync code; nested in a transaction of the caller's, it commits with it."""
        return completing(self, result)  # type: ignore[arg-type]


def write(execution: Execution, attempt: Attempt, result: Any) -> None:
    """Write the completion of ``attempt`` (``result``: what ``handle`` returned) in the
    calling thread's transaction on the job's database; ``Uncommitted`` if it must not
    complete. Once per attempt: a second call (the complete phase after
    ``completing()``) does nothing."""
    if attempt.completion == WRITTEN:
        return
    if attempt.completion == LOST:
        raise Uncommitted(Outcome.lost())
    if isinstance(result, BaseException):  # returned, not raised: an error all the same
        raise result
    lane, handler = attempt.lane, execution.handler
    stored = execution.stored(result) if handler.result_field is not None else None
    outcome = execution.decide(attempt, None)
    if outcome.kind is not OutcomeKind.COMPLETED:
        raise Uncommitted(outcome)
    with attempt._lock:
        if attempt.abandoned or attempt.withdrawn:
            raise Uncommitted(Outcome.lost())
        # From here no write-off (overtime) and no cancel request: the outcome is this.
        attempt.finished = True
        logs = json.dumps(attempt.logs) if attempt.logs else None
        progress = attempt.progress
    found = complete_one(
        connections[lane.alias],
        lane.stmts,
        attempt.pk,
        lane.worker_id,
        result_field=handler.result_field,
        result=stored,
        progress=None if progress is None else json.dumps(progress),
        logs=logs,
    )
    if not found:
        attempt.completion = LOST
        logger.warning(
            "job %s: no longer this attempt's when its transaction was to complete it "
            "(reset, deleted or claimed again meanwhile); its transaction is rolled back",
            attempt.label,
            extra=extra("atomic_lost", worker=lane.worker_id, job=attempt.pk),
        )
        raise Uncommitted(Outcome.lost())
    attempt.result = stored
    attempt.completion = WRITTEN
    transaction.on_commit(lambda: _committed(attempt), using=lane.alias)


def _committed(attempt: Attempt) -> None:
    if attempt.completion == WRITTEN:
        attempt.completion = COMMITTED


@contextlib.contextmanager
def atomic(execution: Execution, attempt: Attempt) -> Iterator[None]:
    """A transaction on the job's database around a transactional phase; once it
    commits with the completion written, the completion is ``COMMITTED``."""
    alias = attempt.lane.alias
    try:
        with transaction.atomic(using=alias):
            yield
    except BaseException:
        if attempt.completion == WRITTEN:  # rolled back with everything else
            attempt.completion = None
        raise
    if attempt.completion == WRITTEN and (
        execution.in_callers_transaction or not connections[alias].in_atomic_block
    ):
        attempt.completion = COMMITTED


@contextlib.contextmanager
def completing(attempt: Attempt, result: Any = None) -> Iterator[None]:
    """``attempt.completing()``: the block's writes and the job's completion in one
    transaction (a savepoint inside the caller's)."""
    execution = attempt.lane.execution
    if attempt.lane.asynchronous:
        raise RuntimeError(
            "attempt.completing() needs a sync handler: Django's transactions do not "
            "work in async code (wrap the block in a sync function run by sync_to_async)"
        )
    with atomic(execution, attempt):
        yield
        write(execution, attempt, result)


def settle(
    execution: Execution, attempt: Attempt, error: BaseException | None
) -> tuple[Outcome | None, BaseException | None]:
    """The outcome of an attempt whose completion its transaction wrote or refused
    (None: decide it as usual), and the error to decide it by."""
    if isinstance(error, Uncommitted):
        return error.outcome, None
    state = attempt.completion
    if state == WRITTEN and execution.in_callers_transaction:
        state = COMMITTED  # the caller's transaction (the testing helpers) holds it
    if state == COMMITTED:
        if error is not None:
            logger.warning(
                "job %s: its handler raised after its completion committed; it stays "
                "completed (%s: %s)",
                attempt.label,
                type(error).__name__,
                error,
                extra=extra("raised_after_commit", worker=attempt.worker_id, job=attempt.pk),
            )
        outcome = Outcome.completed(attempt.result)
        outcome.committed = True
        return outcome, None
    if state == LOST:
        return Outcome.lost(error), None
    if state == WRITTEN and error is None:
        # A transaction of the handler's own rolled the completion back and the handler
        # returned: its writes are gone with it, so the job is not done.
        attempt.completion = None
        error = RuntimeError(
            "the transaction that wrote this job's completion (attempt.completing()) "
            "rolled back, and the handler returned"
        )
    return None, error
