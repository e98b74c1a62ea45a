"""Every statement the engine runs against one job table, written once for all vendors.

Statements are built once per (model, database) from the model's metadata: table
and column names are quoted by the backend, state names are our own constants
(written literally so PostgreSQL can match the partial indexes), every value
that comes from a job, a handler or a user travels as a named parameter, and
what differs between vendors comes from the ``Dialect``.

Writes for a job are fenced: ``state = 'processing' AND worker_hostname =
%(worker)s``. A worker id is new at every process start and a worker never
claims an id any of its handlers still holds, so a late finisher whose job was
reset can never write over a newer attempt. (An attempt written off past its
maximum runtime is let go while its thread runs: the worker itself drops what
that thread sends after, ``runtime.overtime``.) Which state each statement may
move a row from and to is ``states.TRANSITIONS``.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connections, models
from django.db.backends.base.base import BaseDatabaseWrapper

from ..states import JobState
from .dialects import Dialect, dialect_for, param
from .partitions import ACTIVE_DAY, KEY, finished_on_sql, is_partitioned_model
from .rows import JobRows
from .waiting import WaitingKeys


def _lit(state: JobState) -> str:
    return f"'{state.value}'"


#: The attempts ``history`` keeps (the oldest go first), the characters of each one's
#: message, and the execution-log entries it summarises.
HISTORY_LENGTH = 50
HISTORY_MESSAGE_LENGTH = 500
HISTORY_LOG_ENTRIES = 20
#: The most waiting rows one ``stage`` statement makes claimable.
STAGE_BATCH = 5000
#: The outcomes ``history`` records besides the states (the resetter's, a requeue's).
RESET, REQUEUED, SNOOZED = "'reset'", "'requeued'", "'snoozed'"
#: The message of a reset in ``history``.
NO_HEARTBEAT = "'its worker stopped heartbeating'"

QUEUED, PROCESSING, ERRORED = (
    _lit(JobState.QUEUED),
    _lit(JobState.PROCESSING),
    _lit(JobState.ERRORED),
)
COMPLETED, FAILED, CANCELED = (
    _lit(JobState.COMPLETED),
    _lit(JobState.FAILED),
    _lit(JobState.CANCELED),
)

#: Primary key types that travel as integers (cheaper, on PostgreSQL as an array literal).
INTEGER_KEYS = frozenset(
    {
        "AutoField",
        "BigAutoField",
        "SmallAutoField",
        "IntegerField",
        "BigIntegerField",
        "SmallIntegerField",
        "PositiveIntegerField",
        "PositiveBigIntegerField",
        "PositiveSmallIntegerField",
    }
)


def history_time(value: Any) -> datetime.datetime | None:
    """A time of a ``history`` entry (ISO 8601 text, see ``history_entry``) as a
    datetime; None for anything else."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value)
    except ValueError:
        return None


class JobStatements:
    """The SQL for one job model on one database. Each statement's parameters are
    named in its comment; ``ids`` parameters take ``ids_param(keys)``."""

    def __init__(self, model: type[models.Model], connection: BaseDatabaseWrapper) -> None:
        meta = model._meta
        assert meta.pk is not None
        self.model = model
        self.dialect: Dialect = dialect_for(connection)
        problem = self.dialect.server_problem(connection)
        if problem:
            raise NotImplementedError(f"{problem} (dbworker.E030)")
        self.vendor = self.dialect.vendor
        self.rows = JobRows(model, connection)
        self._pk_field = meta.pk
        self._connection = connection
        self.int_keys = meta.pk.get_internal_type() in INTEGER_KEYS
        quote = connection.ops.quote_name
        self.table = table = quote(meta.db_table)
        col = {f.name: quote(str(f.column)) for f in meta.concrete_fields}
        col["pk"] = pk = quote(str(meta.pk.column))
        self.col = col
        d = self.dialect
        now = d.now
        pk_type = self._pk_type = str(meta.pk.rel_db_type(connection))

        def in_ids(name: str) -> str:
            return d.in_ids(name, pk_type)

        state, host = col["state"], col["worker_hostname"]
        #: A partitioned table (``sql.partitions``): the statements that finish a job
        #: write ``finished_on``, those about active jobs name the active partition.
        self.partitioned = d.vendor == "postgresql" and is_partitioned_model(model)
        self.active = f" AND {col[KEY]} = DATE '{ACTIVE_DAY}'" if self.partitioned else ""
        act = self.active
        mine = f"{state} = {PROCESSING} AND {host} = %(worker)s{act}"
        #: The model's waiting-only unique keys, and the guards that keep them when a
        #: job comes back to waiting (empty for most models: the statements are as
        #: they were).
        self.waiting = WaitingKeys(model, d, table, col, in_ids)
        back = self.waiting.guard(JobState.QUEUED, table)
        ids = "ids"
        # The given rows (ids) / row (pk), where they are this worker's.
        these = self._these = d.fenced(table, pk, f"{pk} {in_ids('ids')} AND {mine}") + act
        this = d.fenced(table, pk, f"{pk} = %(pk)s AND {mine}") + act

        # worker, max_retries, held, limit (+ the filter's own): see ``claim()``.
        self._claim_set = (
            f"UPDATE {table} SET {state} = {PROCESSING}, "
            f"{col['started_at']} = {now}, {col['last_heartbeat_at']} = {now}, "
            f"{col['finished_at']} = NULL, {col['failure_message']} = NULL, "
            f"{col['execution_logs']} = '[]', {col['progress']} = NULL, {host} = %(worker)s"
        )
        after = col["process_after"]
        #: max_retries: the rows a claim may take (the dequeue index's predicate first).
        #: Rows that wait for a time (``process_after`` set) are not among them: they are
        #: ``stage``d when they come due.
        self.claimable = (
            f"{state} IN ({QUEUED}, {ERRORED}) AND {after} IS NULL "
            f"AND ({state} = {QUEUED} OR {col['num_failures']} <= %(max_retries)s){act}"
        )
        #: The rows that wait for a time (the waiting index's predicate).
        waiting = f"{state} IN ({QUEUED}, {ERRORED}) AND {after} IS NOT NULL{act}"
        self._due = (
            f"SELECT {pk} FROM {table} WHERE {waiting} AND {after} <= {now} ORDER BY {after}"
        )
        #: ``stage_batch(STAGE_BATCH)``.
        self.stage = self.stage_batch(STAGE_BATCH)
        #: → seconds until the next waiting row comes due (negative: overdue; NULL: none).
        if d.partial_indexes:
            self.next_due = (
                f"SELECT {d.seconds_until(f'MIN({after})')} FROM {table} WHERE {waiting}"
            )
        else:  # each state apart: the first entry of the (state, process_after) index
            firsts = " UNION ALL ".join(
                f"(SELECT {after} AS dbw_at FROM {table} "
                f"WHERE {state} = {one} AND {after} IS NOT NULL ORDER BY {after} LIMIT 1)"
                for one in (QUEUED, ERRORED)
            )
            self.next_due = f"SELECT {d.seconds_until('MIN(dbw_at)')} FROM ({firsts}) AS dbw_w"
        #: held: none of the rows this worker holds.
        self.not_held = self.not_among("held")
        self._claim_pick = (
            f"SELECT {pk} FROM {table} WHERE {self.claimable} "
            f"AND NOT ({pk} {d.in_uncounted_ids('held', pk_type)})"
        )
        returning = ", ".join(f"{table}.{col[f.name]}" for f in self.rows.fields)
        self._claim_returning = f"RETURNING {returning}"

        #: ids, worker → (pk, cancel) of the held rows it refreshed (with row locks, the
        #: rows another transaction locks are skipped: see ``still_held``).
        self.heartbeat = (
            f"UPDATE {table} SET {col['last_heartbeat_at']} = {now} "
            f"WHERE {these} "
            f"RETURNING {pk}, {col['cancel']}"
        )
        #: ids, worker, progress (``progress_params``: each key's check-in) → (pk, cancel):
        #: ``heartbeat`` that also writes the check-ins of the rows it names.
        self.heartbeat_with_progress = (
            f"UPDATE {table} SET {col['last_heartbeat_at']} = {now}, {col['progress']} = "
            f"COALESCE({d.json_member('progress', f'{table}.{pk}', pk_type)}, {col['progress']}) "
            f"WHERE {these} "
            f"RETURNING {pk}, {col['cancel']}"
        )
        #: ids, worker → (pk, cancel): which of the given rows are still this worker's.
        self.still_held = (
            f"SELECT {pk}, {col['cancel']} FROM {table} WHERE {pk} {in_ids('ids')} AND {mine}"
        )
        #: ids, worker → pk of each row completed.
        self.complete = (
            f"UPDATE {table} SET {state} = {COMPLETED}, {col['finished_at']} = {now}"
            f"{self.finishing(COMPLETED)} "
            f"WHERE {these} RETURNING {pk}"
        )
        #: non_retryable, max_retries, message, delay (s; NULL: due at once), pk, worker →
        #: the state written: canceled if the cancel flag is set (nothing counted), else
        #: failed or errored.
        outcome = (
            f"CASE WHEN {col['cancel']} THEN {CANCELED} "
            f"WHEN %(non_retryable)s OR {col['num_failures']} >= %(max_retries)s "
            f"THEN {FAILED} ELSE {ERRORED} END"
        )
        self._error_set = (
            f"UPDATE {table} SET {state} = {outcome}, "
            f"{col['num_failures']} = CASE WHEN {col['cancel']} THEN {col['num_failures']} "
            f"ELSE {col['num_failures']} + 1 END, "
            f"{col['failure_message']} = %(message)s, {col['finished_at']} = {now}, "
            f"{col['process_after']} = {d.after(param('delay'))}, "
            f"{self.history_entry(outcome, '%(message)s', now)}{self.finishing(outcome)}"
        )
        # An error that would make the row errored while another job holds a key it
        # takes there leaves it to ``superseding`` (the row is superseded).
        held = self.waiting.held(JobState.ERRORED, table)
        this_error = this
        if held:
            spent = (
                f"{col['cancel']} OR %(non_retryable)s OR {col['num_failures']} >= %(max_retries)s"
            )
            this_error = d.fenced(
                table, pk, f"{pk} = %(pk)s AND {mine} AND ({spent} OR NOT ({held}))"
            )
        self._error_where = f" WHERE {this_error} RETURNING {state}"
        self.error = self._error_set + self._error_where
        #: message, ids, worker → pk of each row canceled.
        self.cancel = (
            f"UPDATE {table} SET {state} = {CANCELED}, {col['finished_at']} = {now}, "
            f"{col['failure_message']} = %(message)s, "
            f"{self.history_entry(CANCELED, '%(message)s', now)}{self.finishing(CANCELED)} "
            f"WHERE {these} RETURNING {pk}"
        )
        #: message, delay (s; NULL: due at once), pk, worker → the state written: queued
        #: for ``delay`` seconds, ``num_snoozes`` + 1 (a snooze); canceled if the cancel
        #: flag is set (nothing counted).
        snoozed = f"CASE WHEN {col['cancel']} THEN {CANCELED} ELSE {SNOOZED} END"
        written = f"CASE WHEN {col['cancel']} THEN {CANCELED} ELSE {QUEUED} END"
        self.snooze = (
            f"UPDATE {table} SET {state} = {written}, "
            f"{col['num_snoozes']} = CASE WHEN {col['cancel']} THEN {col['num_snoozes']} "
            f"ELSE {col['num_snoozes']} + 1 END, "
            f"{col['finished_at']} = CASE WHEN {col['cancel']} THEN {now} ELSE NULL END, "
            f"{col['started_at']} = CASE WHEN {col['cancel']} THEN {col['started_at']} "
            f"ELSE NULL END, "
            f"{col['last_heartbeat_at']} = NULL, {col['queued_at']} = {now}, "
            f"{after} = CASE WHEN {col['cancel']} THEN NULL ELSE {d.after(param('delay'))} END, "
            f"{self.history_entry(snoozed, '%(message)s', now)}{self.finishing(written)} "
            f"WHERE {this} RETURNING {state}"
        )
        #: message, ids, worker → pk of each row back in the queue (unrun, nothing counted).
        self.requeue = (
            f"UPDATE {table} SET {state} = {QUEUED}, {col['started_at']} = NULL, "
            f"{col['last_heartbeat_at']} = NULL, {col['queued_at']} = {now}, "
            f"{self.history_entry(REQUEUED, '%(message)s', now)} "
            f"WHERE {d.fenced(table, pk, f'{pk} {in_ids(ids)} AND {mine}{back}')} RETURNING {pk}"
        )
        #: worker, held, message → pks: this worker's processing rows that none of its
        #: lanes holds (a claim committed whose reply never came back), requeued.
        self.requeue_unheld = (
            f"UPDATE {table} SET {state} = {QUEUED}, {col['started_at']} = NULL, "
            f"{col['last_heartbeat_at']} = NULL, {col['queued_at']} = {now}, "
            f"{self.history_entry(REQUEUED, '%(message)s', now)} "
            f"WHERE {d.fenced(table, pk, f'{mine} AND {self.not_held}{back}')} RETURNING {pk}"
        )
        #: worker, held → pks of ``requeue_unheld``'s rows, guard or not.
        self.unheld_ids = f"SELECT {pk} FROM {table} WHERE {mine} AND {self.not_held}"
        #: logs (the attempt's whole log, JSON), pk, worker → pk if written.
        self.log_set = (
            f"UPDATE {table} SET {col['execution_logs']} = {d.as_json('logs')} "
            f"WHERE {this} RETURNING {pk}"
        )

        # Stalled rows, each judged by the threshold its holder declared (the worker
        # registry, see ``holders_params``); holders it does not know get ``age`` and
        # ``resets``.
        j = "j"
        heartbeat_at = f"{j}.{col['last_heartbeat_at']}"
        stale = (
            f"{j}.{state} = {PROCESSING} AND ({heartbeat_at} IS NULL OR "
            f"{heartbeat_at} < {d.after('-COALESCE(h.age, %(age)s)')})"
            f"{act.replace(' AND ', f' AND {j}.', 1)}"
        )
        joined = f"{table} AS {j} LEFT JOIN {d.holders('holders')} ON h.worker = {j}.{host}"
        spare = f"NOT ({j}.{pk} {in_ids('spare')})"
        stalled = (
            f"SELECT {j}.{pk} FROM {joined} WHERE {stale} AND {spare} AND "
            f"{j}.{col['num_resets']} {{op}} COALESCE(h.resets, %(resets)s){{more}}{d.lock_of(j)}"
        )
        # A stalled attempt ended when its worker last heartbeated (or was claimed).
        last_seen = f"COALESCE({col['last_heartbeat_at']}, {col['started_at']})"
        #: holders, age, resets, spare → (pk, worker) of each row back in the queue.
        self.reset_stalled = (
            f"UPDATE {table} SET {state} = {QUEUED}, "
            f"{col['num_resets']} = {col['num_resets']} + 1, {col['started_at']} = NULL, "
            f"{col['last_heartbeat_at']} = NULL, {col['queued_at']} = {now}, "
            f"{self.history_entry(RESET, NO_HEARTBEAT, last_seen)} "
            f"WHERE {pk} IN (dbw_stalled){act} RETURNING {pk}, {host}"
        )
        reset, back_j = self.reset_stalled, self.waiting.guard(JobState.QUEUED, j)
        self.reset_stalled = reset.replace("dbw_stalled", stalled.format(op="<", more=back_j))
        #: pk, holders, age, resets, spare → (pk, worker): ``reset_stalled`` of one row.
        self.reset_one = reset.replace(
            "dbw_stalled", stalled.format(op="<", more=f"{back_j} AND {j}.{pk} = %(pk)s")
        )
        #: holders, age, resets, spare → pk of each row ``reset_stalled`` may take,
        #: guard or not.
        self.resettable_ids = stalled.format(op="<", more="")
        #: message, holders, age, resets, spare → (pk, worker) of each row failed.
        self.fail_stalled = (
            f"UPDATE {table} SET {state} = {FAILED}, {col['finished_at']} = {now}, "
            f"{col['failure_message']} = %(message)s, "
            f"{self.history_entry(FAILED, '%(message)s', last_seen)}{self.finishing(FAILED)} "
            f"WHERE {pk} IN ({stalled.format(op='>=', more='')}){act} RETURNING {pk}, {host}"
        )
        #: holders, age, spare → pk of every stalled row, locked or not (with row locks,
        #: the resetter learns which ones its passes skipped).
        self.stalled_ids = f"SELECT {j}.{pk} FROM {joined} WHERE {stale} AND {spare}"
        #: A job superseded by the job that waits with its waiting-only key (see
        #: ``sql.waiting``): message, pk, worker → pk.
        self.supersede = (
            f"UPDATE {table} SET {state} = {CANCELED}, {col['finished_at']} = {now}, "
            f"{col['failure_message']} = %(message)s, "
            f"{self.history_entry(CANCELED, '%(message)s', now)}{self.finishing(CANCELED)} "
            f"WHERE {this} RETURNING {pk}"
        )
        #: message, pk, holders, age, resets, spare → (pk, worker): a stalled one.
        self.supersede_stalled = (
            f"UPDATE {table} SET {state} = {CANCELED}, {col['finished_at']} = {now}, "
            f"{col['failure_message']} = %(message)s, "
            f"{self.history_entry(CANCELED, '%(message)s', last_seen)}"
            f"{self.finishing(CANCELED)} "
            f"WHERE {pk} IN ({stalled.format(op='<', more=f' AND {j}.{pk} = %(pk)s')}){act} "
            f"RETURNING {pk}, {host}"
        )
        #: ids → (pk, state, worker, history) of the given rows: what an outcome whose
        #: reply was lost left (``Completer.landed``).
        self.outcome_of = (
            f"SELECT {pk}, {state}, {host}, {col['history']} FROM {table} "
            f"WHERE {pk} {in_ids('ids')}"
        )
        #: ids → (pk, state) of the given rows that still exist (``waiting``'s poll).
        self.states_of = f"SELECT {pk}, {state} FROM {table} WHERE {pk} {in_ids('ids')}"
        #: pk → pk if the row was deleted (retention, one row at a time).
        self.prune_one = f"DELETE FROM {table} WHERE {pk} = %(pk)s RETURNING {pk}"
        #: ids → pk of the given rows no other transaction locks (row locks only).
        self.unlocked_ids = f"SELECT {pk} FROM {table} WHERE {pk} {in_ids('ids')}{d.skip_locked}"

    def finishing(self, state: str) -> str:
        """``, finished_on = …`` for a statement that sets the state to the expression
        ``state`` (a partitioned table), else nothing."""
        if not self.partitioned:
            return ""
        return f", {self.col[KEY]} = {finished_on_sql(state, self.dialect.now)}"

    @functools.cache  # noqa: B019 - one statement per size, for the life of the process
    def stage_batch(self, limit: int) -> str:
        """→ pk of each row staged: up to ``limit`` waiting rows that came due join the
        claimable ones, earliest first. ``queued_at`` becomes the time each came due
        (the time it entered the queue, as a requeue's is)."""
        d, col, pk = self.dialect, self.col, self.col["pk"]
        after = col["process_after"]
        pick = f"{self._due} LIMIT {int(limit)}{d.skip_locked}"
        return (
            f"UPDATE {self.table} SET {col['queued_at']} = {d.greatest(col['queued_at'], after)}, "
            f"{after} = NULL WHERE {d.among(pk, pick)}{self.active} RETURNING {pk}"
        )

    def history_entry(self, outcome: str, message: str, ended: str) -> str:
        """``history = …`` that appends the attempt the statement ends (the row's worker,
        start, the log's keys and exit codes) with ``outcome``, ``message`` and ``ended``
        (SQL expressions), keeping the last ``HISTORY_LENGTH`` entries."""
        col, d = self.col, self.dialect
        entry = d.json_object(
            [
                ("worker", col["worker_hostname"]),
                ("started_at", d.iso_time(col["started_at"])),
                ("ended_at", d.iso_time(ended)),
                ("outcome", outcome),
                ("message", f"substr({message}, 1, {HISTORY_MESSAGE_LENGTH})"),
                ("logs", d.log_summary(col["execution_logs"], HISTORY_LOG_ENTRIES)),
            ]
        )
        history = col["history"]
        return f"{history} = {d.json_append_bounded(history, entry, HISTORY_LENGTH)}"

    @property
    def pg(self) -> bool:
        return self.dialect.row_locks

    # -- claims ----------------------------------------------------------------------

    def claim(
        self,
        ordering: str,
        extra_where: str = "",
        attempts: str | None = None,
        first_claim: str | None = None,
        limit: int | None = None,
        max_retries: int | None = None,
    ) -> str:
        """The claim: worker, max_retries, held (ids), limit, and whatever parameters
        ``extra_where`` names. Rows come back in ``ordering`` where the dialect can
        (``JobRows.sort`` does it elsewhere). ``attempts``: a JSON list field each
        claim appends the worker's id to; ``first_claim``: a datetime field the first
        claim of a row sets (see ``claim_head``). ``limit`` and ``max_retries``, when
        given, are written in the statement where the dialect wants them so
        (``Dialect.limit_written``), else their parameters give them."""
        extra = f" AND ({extra_where})" if extra_where else ""
        pick = f"{self._claim_pick}{extra} ORDER BY {ordering} LIMIT {param('limit')}"
        if self.dialect.limit_written:
            # What the plan's cost hangs on, known to the generic plan: how many rows to
            # take, and how many of the errored ones may be taken.
            if limit is not None:
                pick = pick.replace(param("limit"), str(int(limit)))
            if max_retries is not None:
                pick = pick.replace(param("max_retries"), str(int(max_retries)))
        # The picked keys as a set computed once: the rows are then looked up by key,
        # whatever number of them the plan expects.
        update = (
            f"{self.claim_head(attempts, first_claim)} "
            f"WHERE {self.dialect.among(self.col['pk'], pick + self.dialect.skip_locked)}"
            f"{self.active} {self._claim_returning}"
        )
        return self.dialect.ordered(update, ordering)

    def claim_head(self, attempts: str | None = None, first_claim: str | None = None) -> str:
        """``UPDATE … SET`` of a claim (worker), up to its ``WHERE``. ``attempts``: a
        JSON list field the worker's id is appended to; ``first_claim``: a datetime
        field set to the claim's time when it is NULL (kept through retries and
        resets, which clear ``started_at``)."""
        head = self._claim_set
        if attempts:
            column = self.column(attempts)
            appended = self.dialect.json_append(column, param("worker"), text=True)
            head += f", {column} = {appended}"
        if first_claim:
            column = self.column(first_claim)
            head += f", {column} = COALESCE({column}, {self.dialect.now})"
        return head

    @property
    def claim_returning(self) -> str:
        """``RETURNING`` the columns ``rows`` builds instances from."""
        return self._claim_returning

    @functools.cache  # noqa: B019 - one statement per field, for the life of the process
    def complete_with_results(self, field: str) -> str:
        """``complete`` that also sets JSON field ``field`` of each row: ids, worker, and
        the results (``results_params``)."""
        table, pk, col = self.table, self.col["pk"], self.col
        column = self.column(field)
        extra_from, value = self.dialect.with_results(table, pk, column, self._pk_type)
        join = f" AND {table}.{pk} = dbw_results.dbw_key" if extra_from else ""
        return (
            f"UPDATE {table} SET {col['state']} = {COMPLETED}, {col['finished_at']} = "
            f"{self.dialect.now}, {column} = {value}{self.finishing(COMPLETED)}{extra_from} "
            f"WHERE {self._these}{join} RETURNING {table}.{pk}"
        )

    @functools.cache  # noqa: B019 - one statement per field, for the life of the process
    def complete_without_result(self, field: str) -> str:
        """``complete`` that empties field ``field`` (SQL NULL, as the ORM stores
        None): ids, worker."""
        col = self.col
        return (
            f"UPDATE {self.table} SET {col['state']} = {COMPLETED}, {col['finished_at']} = "
            f"{self.dialect.now}, {self.column(field)} = NULL{self.finishing(COMPLETED)} "
            f"WHERE {self._these} RETURNING {col['pk']}"
        )

    @functools.cache  # noqa: B019 - one statement per field, for the life of the process
    def error_with_history(self, field: str) -> str:
        """``error`` that also appends parameter ``entry`` (JSON text) to the JSON list
        field ``field``."""
        column = self.column(field)
        appended = self.dialect.json_append(column, param("entry"))
        return f"{self._error_set}, {column} = {appended}{self._error_where}"

    def prunable(self, extra_where: str = "") -> str:
        """The keys of up to ``batch`` finished rows in ``state`` older than ``age``
        seconds (and matching ``extra_where``)."""
        col, table, pk = self.col, self.table, self.col["pk"]
        extra = f" AND ({extra_where})" if extra_where else ""
        return (
            f"SELECT {pk} FROM {table} WHERE {col['state']} = %(state)s AND "
            f"{col['finished_at']} < {self.dialect.after('-' + param('age'))}{extra} "
            "LIMIT %(batch)s"
        )

    def prune(self, extra_where: str = "") -> str:
        """Delete the rows of ``prunable``; rows another transaction locks are skipped.
        → pks."""
        locked = self.dialect.skip_locked.replace("NO KEY UPDATE", "UPDATE")
        pk = self.col["pk"]
        return (
            f"DELETE FROM {self.table} WHERE {pk} IN ({self.prunable(extra_where)}{locked}) "
            f"RETURNING {pk}"
        )

    def not_among(self, name: str) -> str:
        """None of the keys of parameter ``name`` (an ``ids_param``)."""
        return f"NOT ({self.col['pk']} {self.dialect.in_ids(name, self._pk_type)})"

    def results_params(self, pairs: Sequence[tuple[Any, str]]) -> dict[str, Any]:
        """The ``results`` of ``complete_with_results``: (key, JSON text) per row."""
        return self.dialect.results_param([(self.key_param(k), v) for k, v in pairs])

    def column(self, field: str) -> str:
        return self.col[self.model._meta.get_field(field).name]

    def order_by(self, ordering: Sequence[str]) -> str:
        return ", ".join(f"{c} DESC" if desc else c for c, desc in self.order_columns(ordering))

    def order_columns(self, ordering: Sequence[str]) -> list[tuple[str, bool]]:
        """(quoted column, descending) of each item of a handler's ``ordering``."""
        meta = self.model._meta
        columns = []
        for item in ordering:
            desc = item.startswith("-")
            name = item[1:] if desc else item
            column = self.col["pk"] if name == "pk" else self.col[meta.get_field(name).name]
            columns.append((column, desc))
        return columns

    # -- parameters and results ------------------------------------------------------

    def ids_param(self, keys: Sequence[Any]) -> Any:
        """Keys as the value of an ``ids`` (``held``, ``spare``) parameter."""
        if self.int_keys:
            return self.dialect.ids(keys, integers=True)
        return self.dialect.ids([self.key_param(pk) for pk in keys], integers=False)

    def key_param(self, pk: Any) -> Any:
        """One key as the value of a ``pk`` parameter."""
        if self.int_keys:
            return int(pk)
        return self._pk_field.get_db_prep_value(pk, self._connection)

    def progress_params(self, entries: Mapping[Any, Any]) -> dict[str, Any]:
        """``progress`` of ``heartbeat_with_progress``: the check-in of each key."""
        pairs = [(self.key_param(pk), json.dumps(e)) for pk, e in entries.items()]
        return {"progress": self.dialect.members_param(pairs)}

    def holders_params(self, holders: Sequence[tuple[str, float, int]]) -> dict[str, Any]:
        """The ``holders`` parameters: (worker id, stalled_max_age, max_num_resets) of the
        workers the registry knows."""
        return self.dialect.holders_params("holders", holders)

    def key(self, value: Any) -> Any:
        """A key as a statement returned it, as the model holds it (``job.pk``)."""
        return self.rows.key(value)

    def keys(self, rows: Sequence[Sequence[Any]]) -> list[Any]:
        """The keys in the first column of ``rows``."""
        return self.rows.keys(rows)


@functools.cache
def statements_for(model: type[models.Model], vendor: str, alias: str) -> JobStatements:
    return JobStatements(model, connections[alias])
