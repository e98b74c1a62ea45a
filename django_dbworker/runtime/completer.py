"""The statements that end attempts: one per outcome kind, a group of attempts at once.

The writer thread decides what to write when; this says how. Each kind of
outcome has its statement (``OutcomeKind.statement``), all fenced to this
worker: a row comes back only if it was still this attempt's. On a dialect with
row locks, a row another transaction locks is skipped, not waited for, and
told apart from a lost one (``still_held``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..sql import superseding
from ..sql.connection import Runner
from ..sql.jobs import HISTORY_MESSAGE_LENGTH
from ..sql.waiting import superseded
from ..states import JobState
from .outcome import Outcome, OutcomeKind

if TYPE_CHECKING:
    from .attempt import Attempt
    from .lane import Lane


@dataclasses.dataclass
class Written:
    """What one statement did: the state each written row took, and the rows it had
    to skip because another transaction locks them (still this worker's)."""

    states: dict[Any, str] = dataclasses.field(default_factory=dict)
    locked: set[Any] = dataclasses.field(default_factory=set)


class Completer:
    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self._writers: dict[str | None, Callable[[Runner, Lane, list[Any], Outcome], Written]]
        self._writers = {
            "complete": self._complete,
            "error": self._error,
            "cancel": self._cancel,
            "requeue": self._requeue,
            "snooze": self._snooze,
            None: lambda conn, lane, ids, outcome: Written(),  # lost: nothing to write
        }

    def write(self, conn: Runner, lane: Lane, kind: OutcomeKind, items: list[Any]) -> Written:
        """Write ``kind`` for the attempts ``items`` ((attempt, outcome) of one lane; one
        item unless the kind is ``COMPLETED``)."""
        ids = [attempt.pk for attempt, _ in items]
        if kind is OutcomeKind.COMPLETED and lane.handler.result_field:
            written = self._complete_with_results(conn, lane, items)
        else:
            written = self._writers[kind.statement](conn, lane, ids, items[0][1])
        missing = [pk for pk in ids if pk not in written.states]
        if kind.statement is not None and missing and lane.stmts.dialect.row_locks:
            # Rows the statement skipped because another transaction locks them are still
            # ours: write them later. Only the others were reset or deleted meanwhile.
            written.locked = self._still_held(conn, lane, missing)
        return written

    def write_logs(self, conn: Runner, lane: Lane, attempt: Attempt) -> str:
        """Write the execution log of ``attempt``: ``written``, ``locked`` (write it
        later) or ``lost`` (the row is no longer this attempt's)."""
        data = attempt.take_logs()
        if data is None:
            return "written"
        stmts = lane.stmts
        params = {"logs": data, "pk": stmts.key_param(attempt.pk), "worker": self.worker_id}
        try:
            if conn.execute(stmts.log_set, params):
                return "written"
            if stmts.dialect.row_locks and self._still_held(conn, lane, [attempt.pk]):
                attempt.logs_unwritten()
                return "locked"
        except Exception:  # in either statement: the log is still to be written
            attempt.logs_unwritten()
            raise
        return "lost"

    def write_progress(self, conn: Runner, lane: Lane, attempts: list[Attempt]) -> list[Attempt]:
        """Write the check-ins the rows of ``attempts`` may lack (in one statement, with
        a heartbeat): the last one of an attempt is kept with its outcome. Returns the
        attempts whose rows another transaction locks (a heartbeat's, an operator's): their
        outcomes wait with the check-in, which is written first. A row no longer ours is
        left to the outcome's statement to tell."""
        entries = {a.pk: e for a in attempts if (e := a.unwritten_progress()) is not None}
        if not entries:
            return []
        stmts = lane.stmts
        params = {"ids": stmts.ids_param(list(entries)), "worker": self.worker_id}
        try:
            rows = conn.execute(
                stmts.heartbeat_with_progress, {**params, **stmts.progress_params(entries)}
            )
            written = set(stmts.keys(rows))
            missing = [pk for pk in entries if pk not in written]
            locked = (
                self._still_held(conn, lane, missing)
                if missing and stmts.dialect.row_locks
                else set()
            )
        except Exception:
            for attempt in attempts:
                attempt.progress_unwritten()
            raise
        for attempt in attempts:
            if attempt.pk in written:
                attempt.progress_written(entries[attempt.pk])
        return [a for a in attempts if a.pk in locked]

    def landed(self, conn: Runner, lane: Lane, kind: OutcomeKind, items: list[Any]) -> Written:
        """Which outcomes of ``items`` ((attempt, outcome)) an earlier try wrote, though
        its reply was lost (the connection broke after the commit), and the state each
        row took. A completion is this worker's if the row is completed and still names
        it (only a claim changes that, and no one claims a completed row); another
        outcome if the row's last ``history`` entry is this worker's, with the row's
        state and this outcome's message (the resetter's failure and an operator's
        cancel write no such entry)."""
        stmts = lane.stmts
        ids = [attempt.pk for attempt, _ in items]
        rows = conn.execute(stmts.outcome_of, {"ids": stmts.ids_param(ids)})
        messages = {attempt.pk: outcome.message for attempt, outcome in items}
        written = Written()
        for key, state, worker, history in rows:
            pk = stmts.key(key)
            if worker != self.worker_id:
                continue
            if kind is OutcomeKind.COMPLETED:
                if state == JobState.COMPLETED:
                    written.states[pk] = state
                continue
            if isinstance(history, str):
                history = json.loads(history)
            last = history[-1] if history else {}
            outcome = state
            if state == JobState.QUEUED:
                outcome = "snoozed" if kind is OutcomeKind.SNOOZED else "requeued"
            message = (messages.get(pk) or "")[:HISTORY_MESSAGE_LENGTH]
            said = (last.get("message") or "") if isinstance(last, dict) else ""
            if (
                isinstance(last, dict)
                and last.get("worker") == self.worker_id
                and last.get("outcome") == outcome
                and (said == message or (state == JobState.CANCELED and superseded(said)))
            ):
                # (Superseded: its message names a holder only the lost reply knew.)
                written.states[pk] = state
        return written

    def _still_held(self, conn: Runner, lane: Lane, ids: list[Any]) -> set[Any]:
        stmts = lane.stmts
        rows = conn.execute(
            stmts.still_held, {"ids": stmts.ids_param(ids), "worker": self.worker_id}
        )
        return set(stmts.keys(rows))

    def _many(
        self, conn: Runner, lane: Lane, sql: str, ids: list[Any], state: str, **params: Any
    ) -> Written:
        stmts = lane.stmts
        rows = conn.execute(sql, {**params, "ids": stmts.ids_param(ids), "worker": self.worker_id})
        return Written(dict.fromkeys(stmts.keys(rows), state))

    def _complete(self, conn: Runner, lane: Lane, ids: list[Any], outcome: Outcome) -> Written:
        return self._many(conn, lane, lane.stmts.complete, ids, JobState.COMPLETED.value)

    def _cancel(self, conn: Runner, lane: Lane, ids: list[Any], outcome: Outcome) -> Written:
        return self._many(
            conn, lane, lane.stmts.cancel, ids, JobState.CANCELED.value, message=outcome.message
        )

    def _requeue(self, conn: Runner, lane: Lane, ids: list[Any], outcome: Outcome) -> Written:
        # A job whose waiting-only key another job holds meanwhile is superseded: its
        # outcome then says so (the log line, post_handle, job_finished).
        notes: dict[Any, str] = {}
        states = superseding.requeue(conn, lane.stmts, ids, self.worker_id, outcome.message, notes)
        if notes:
            outcome.message = next(iter(notes.values()))
        written = Written(states)
        if JobState.QUEUED.value in states.values():
            conn.notify(lane.table)
        return written

    def _snooze(self, conn: Runner, lane: Lane, ids: list[Any], outcome: Outcome) -> Written:
        """Back to the queue for the snooze's delay (or canceled: the statement decides)."""
        stmts = lane.stmts
        params = {
            "message": outcome.message,
            # None: due at once, claimable without waiting to be staged.
            "delay": float(outcome.retry_delay) if outcome.retry_delay > 0 else None,
            "pk": stmts.key_param(ids[0]),
            "worker": self.worker_id,
        }
        rows = conn.execute(stmts.snooze, params)
        if rows and rows[0][0] == JobState.QUEUED and params["delay"] is None:
            conn.notify(lane.table)
        return Written({ids[0]: rows[0][0]} if rows else {})

    def _complete_with_results(self, conn: Runner, lane: Lane, items: list[Any]) -> Written:
        """``complete`` that stores what each attempt returned: None (most tasks) as
        SQL NULL, by the plain statement; other values by one that takes them."""
        stmts = lane.stmts
        field = lane.handler.result_field
        assert field is not None
        pairs, empty = [], []
        for attempt, outcome in items:
            if outcome.result in (None, "null"):
                empty.append(attempt.pk)
            else:
                pairs.append((attempt.pk, outcome.result))
        completed = JobState.COMPLETED.value
        written = Written()
        if empty:
            sql = stmts.complete_without_result(field)
            written = self._many(conn, lane, sql, empty, completed)
        if pairs:
            rows = conn.execute(
                stmts.complete_with_results(field),
                {
                    **stmts.results_params(pairs),
                    "ids": stmts.ids_param([pk for pk, _ in pairs]),
                    "worker": self.worker_id,
                },
            )
            written.states.update(dict.fromkeys(stmts.keys(rows), completed))
        return written

    def _error(self, conn: Runner, lane: Lane, ids: list[Any], outcome: Outcome) -> Written:
        """Errored or failed: the statement decides (the cancel flag, the budget)."""
        stmts = lane.stmts
        budget = outcome.budget
        params = {
            "non_retryable": outcome.non_retryable,
            "max_retries": lane.handler.max_num_retries if budget is None else budget,
            "message": outcome.message,
            # None: due at once, so the row waits for nothing (``stage``).
            "delay": float(outcome.retry_delay) if outcome.retry_delay > 0 else None,
            "pk": stmts.key_param(ids[0]),
            "worker": self.worker_id,
        }
        sql = stmts.error
        history = lane.handler.errors_field
        if history:
            sql = stmts.error_with_history(history)
            params["entry"] = self._error_entry(outcome)
        notes: dict[Any, str] = {}
        rows = superseding.error(conn, stmts, sql, params, notes)
        if notes:  # superseded: its outcome says so
            outcome.message = next(iter(notes.values()))
        return Written({ids[0]: rows[0][0]} if rows else {})

    def _error_entry(self, outcome: Outcome) -> str:
        """One attempt's error, for a handler's ``errors_field``."""
        error = outcome.error
        kind = type(error) if error is not None else RuntimeError
        message = outcome.message or ""
        return json.dumps(
            {
                "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
                "traceback": message.split("\n\n", 1)[-1] if error is not None else message,
                "message": message.split("\n", 1)[0],
                "worker": self.worker_id,
            }
        )
