"""Every SQL statement the worker runs against a job table, for PostgreSQL and SQLite.

Statements are built once per (model, vendor) from the model's metadata: table
and column names are quoted by the backend, state names are our own constants
(written literally so PostgreSQL can match the partial indexes), and every
value that comes from a job, a handler or a user travels as a parameter.
Writes for a job are fenced: ``state = 'processing' AND worker_hostname = <this
worker process>``; a worker never holds one id twice, so a late finisher whose
job was reset can never write over a newer attempt.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

from .states import JobState

Q_ = JobState  # short alias for the literal state names below


def _lit(state: JobState) -> str:
    return f"'{state.value}'"


class JobStatements:
    """The SQL for one job model on one database vendor."""

    def __init__(self, model: type[models.Model], connection: BaseDatabaseWrapper) -> None:
        self.model = model
        self.vendor = connection.vendor
        self.pg = self.vendor == "postgresql"
        quote = connection.ops.quote_name
        meta = model._meta
        self.fields = list(meta.concrete_fields)
        self.attnames = [f.attname for f in self.fields]
        self.logs_index = self.attnames.index("execution_logs")
        self.pk_index = next(i for i, f in enumerate(self.fields) if f.primary_key)
        self.table = quote(meta.db_table)
        col = {f.name: quote(str(f.column)) for f in self.fields}
        assert meta.pk is not None
        col["pk"] = quote(str(meta.pk.column))
        self.col = col
        self.converters = self._converters(connection)
        pk, state, host = col["pk"], col["state"], col["worker_hostname"]
        now = "now()" if self.pg else "dbworker_time(0)"
        self.now = now
        pk_type = meta.pk.rel_db_type(connection)
        ids = f"= ANY(%s::{pk_type}[])" if self.pg else "IN (SELECT value FROM json_each(%s))"
        self.ids = ids
        # NO KEY UPDATE: what our UPDATEs take anyway; it does not conflict with FOR KEY
        # SHARE, which a transaction inserting a row that references the job holds.
        skip_locked = " FOR NO KEY UPDATE SKIP LOCKED" if self.pg else ""
        self.skip_locked = skip_locked
        returning = ", ".join(f"{self.table}.{col[f.name]}" for f in self.fields)
        mine = f"{state} = {_lit(Q_.PROCESSING)} AND {host} = %s"
        self.mine = mine

        self.claim_head = (
            f"UPDATE {self.table} SET {state} = {_lit(Q_.PROCESSING)}, "
            f"{col['started_at']} = {now}, {col['last_heartbeat_at']} = {now}, "
            f"{col['finished_at']} = NULL, {col['failure_message']} = NULL, "
            f"{col['execution_logs']} = '[]', {host} = %s "
            f"WHERE {pk} IN (SELECT {pk} FROM {self.table} WHERE "
            f"{state} IN ({_lit(Q_.QUEUED)}, {_lit(Q_.ERRORED)}) "
            f"AND ({state} = {_lit(Q_.QUEUED)} OR {col['num_failures']} <= %s) "
            f"AND ({col['process_after']} IS NULL OR {col['process_after']} <= {now}) "
            f"AND NOT ({pk} {ids})"
        )
        self.claim_returning = f"RETURNING {returning}"

        if self.pg:
            self.heartbeat = (
                f"WITH held AS (SELECT {pk} FROM {self.table} WHERE {pk} {ids} AND {mine}"
                f"{skip_locked}) UPDATE {self.table} SET {col['last_heartbeat_at']} = {now} "
                f"FROM held WHERE {self.table}.{pk} = held.{pk} "
                f"RETURNING {self.table}.{pk}, {self.table}.{col['cancel']}"
            )
        else:
            self.heartbeat = (
                f"UPDATE {self.table} SET {col['last_heartbeat_at']} = {now} "
                f"WHERE {pk} {ids} AND {mine} RETURNING {pk}, {col['cancel']}"
            )
        # Rows a heartbeat skipped because another transaction holds their lock.
        self.still_held = (
            f"SELECT {pk}, {col['cancel']} FROM {self.table} WHERE {pk} {ids} AND {mine}"
        )
        # Outcomes: on PostgreSQL rows another transaction locks are skipped, not waited
        # for (the writer tries them again later; ``still_held`` tells them apart).
        if self.pg:

            def fenced(match: str) -> str:
                return f"{pk} IN (SELECT {pk} FROM {self.table} WHERE {match}{skip_locked})"
        else:

            def fenced(match: str) -> str:
                return match

        self.complete = (
            f"UPDATE {self.table} SET {state} = {_lit(Q_.COMPLETED)}, {col['finished_at']} = {now} "
            f"WHERE {fenced(f'{pk} {ids} AND {mine}')} RETURNING {pk}"
        )
        # Params: non_retryable, max_num_retries, failure_message, retry delay (s), pk, worker.
        self.error = (
            f"UPDATE {self.table} SET {state} = CASE WHEN {col['cancel']} THEN {_lit(Q_.CANCELED)} "
            f"WHEN %s OR {col['num_failures']} >= %s THEN {_lit(Q_.FAILED)} "
            f"ELSE {_lit(Q_.ERRORED)} END, "
            f"{col['num_failures']} = CASE WHEN {col['cancel']} THEN {col['num_failures']} "
            f"ELSE {col['num_failures']} + 1 END, "
            f"{col['failure_message']} = %s, {col['finished_at']} = {now}, "
            f"{col['process_after']} = {self._after('%s')} "
            f"WHERE {fenced(f'{pk} = %s AND {mine}')} RETURNING {state}"
        )
        self.cancel = (
            f"UPDATE {self.table} SET {state} = {_lit(Q_.CANCELED)}, {col['finished_at']} = {now}, "
            f"{col['failure_message']} = %s WHERE {fenced(f'{pk} {ids} AND {mine}')} RETURNING {pk}"
        )
        self.requeue = (
            f"UPDATE {self.table} SET {state} = {_lit(Q_.QUEUED)}, {col['started_at']} = NULL, "
            f"{col['last_heartbeat_at']} = NULL, {col['queued_at']} = {now} "
            f"WHERE {fenced(f'{pk} {ids} AND {mine}')} RETURNING {pk}"
        )
        logs = col["execution_logs"]
        if self.pg:
            append = f"{logs} || jsonb_build_array(%s::jsonb)"
            length = f"jsonb_array_length({logs})"
            put = f"jsonb_set({logs}, ARRAY[%s]::text[], %s::jsonb)"
        else:
            append = f"json_insert({logs}, '$[#]', json(%s))"
            length = f"json_array_length({logs})"
            put = f"json_set({logs}, '$[' || %s || ']', json(%s))"
        self.log_append = (
            f"UPDATE {self.table} SET {logs} = {append} WHERE {pk} = %s AND {mine} "
            f"RETURNING {length} - 1"
        )
        self.log_update = (
            f"UPDATE {self.table} SET {logs} = {put} WHERE {pk} = %s AND {mine} RETURNING {pk}"
        )
        stalled = (
            f"SELECT {pk} FROM {self.table} WHERE {state} = {_lit(Q_.PROCESSING)} "
            f"AND ({col['last_heartbeat_at']} IS NULL OR {col['last_heartbeat_at']} < "
            f"{self._after('%s')}) AND {col['num_resets']} {{op}} %s AND NOT ({pk} {ids})"
            f"{skip_locked}"
        )
        # Params: -stalled_max_age (s), max_num_resets, ids to spare.
        self.reset_stalled = (
            f"UPDATE {self.table} SET {state} = {_lit(Q_.QUEUED)}, "
            f"{col['num_resets']} = {col['num_resets']} + 1, {col['started_at']} = NULL, "
            f"{col['last_heartbeat_at']} = NULL, {col['queued_at']} = {now} "
            f"WHERE {pk} IN ({stalled.format(op='<')}) RETURNING {pk}, {host}"
        )
        # Params: failure message, then as reset_stalled.
        self.fail_stalled = (
            f"UPDATE {self.table} SET {state} = {_lit(Q_.FAILED)}, {col['finished_at']} = {now}, "
            f"{col['failure_message']} = %s "
            f"WHERE {pk} IN ({stalled.format(op='>=')}) RETURNING {pk}, {host}"
        )
        # PostgreSQL: every stalled row, locked or not (the resetter learns which ones its
        # SKIP LOCKED passes skip). Params: -stalled_max_age (s), ids to spare.
        self.stalled_ids = (
            f"SELECT {pk} FROM {self.table} WHERE {state} = {_lit(Q_.PROCESSING)} "
            f"AND ({col['last_heartbeat_at']} IS NULL OR {col['last_heartbeat_at']} < "
            f"{self._after('%s')}) AND NOT ({pk} {ids})"
        )
        # PostgreSQL: which of the given rows no other transaction locks (the locks this
        # takes end with the statement). Params: ids.
        self.unlocked_ids = f"SELECT {pk} FROM {self.table} WHERE {pk} {ids}{skip_locked}"

    def _after(self, seconds_param: str) -> str:
        """The database's current time plus a number of seconds given as a parameter."""
        if self.pg:
            return f"now() + make_interval(secs => {seconds_param})"
        return f"dbworker_time({seconds_param})"

    def ids_param(self, ids: Sequence[int]) -> Any:
        """Keys as one parameter: an array literal (cast in the statement; far cheaper
        for psycopg to send than a list) on PostgreSQL, JSON on SQLite."""
        if self.pg:
            return "{" + ",".join(str(int(pk)) for pk in ids) + "}"
        return json.dumps(list(ids))

    def json_param(self, value: Any) -> str:
        return json.dumps(value)

    # -- claims ----------------------------------------------------------------------

    def claim(self, ordering: str, extra_where: str = "") -> str:
        """The claim statement; params: worker, max_num_retries, held ids, [extra], limit."""
        extra = f" AND ({extra_where})" if extra_where else ""
        return (
            f"{self.claim_head}{extra} ORDER BY {ordering} LIMIT %s{self.skip_locked}) "
            f"{self.claim_returning}"
        )

    def order_by(self, ordering: Sequence[str]) -> str:
        meta = self.model._meta
        parts = []
        for item in ordering:
            desc = item.startswith("-")
            name = item[1:] if desc else item
            column = self.col["pk"] if name == "pk" else self.col[meta.get_field(name).name]
            parts.append(f"{column} DESC" if desc else column)
        return ", ".join(parts)

    # -- rows → model instances ------------------------------------------------------

    def _converters(
        self, connection: BaseDatabaseWrapper
    ) -> list[tuple[int, list[Callable[..., Any]], Any]]:
        converters = []
        for i, field in enumerate(self.fields):
            if i == self.logs_index:
                continue  # a claim always returns '[]' here (see build_row)
            expression = field.get_col(self.model._meta.db_table)
            funcs = connection.ops.get_db_converters(expression) + expression.get_db_converters(
                connection
            )
            if funcs:
                converters.append((i, funcs, expression))
        return converters

    def plain_instances(self) -> bool:
        """Whether claimed rows may skip ``Model.__init__`` (nobody listens to its signals)."""
        return not (pre_init.has_listeners(self.model) or post_init.has_listeners(self.model))

    def build(self, rows: Sequence[Sequence[Any]], alias: str, connection: Any) -> list[Any]:
        """Model instances from the rows a claim returned (no further queries)."""
        plain = self.plain_instances()
        return [self.build_row(row, alias, connection, plain) for row in rows]

    def build_row(self, row: Sequence[Any], alias: str, connection: Any, plain: bool) -> Any:
        """One model instance from a row a claim returned; raises if a column cannot be
        converted (the row's primary key is ``row[self.pk_index]`` whatever happens)."""
        values = list(row)
        for i, funcs, expression in self.converters:
            value = values[i]
            for func in funcs:
                value = func(value, expression, connection)
            values[i] = value
        values[self.logs_index] = []  # the claim has just emptied the execution log
        model = self.model
        if not plain:
            return model.from_db(alias, self.attnames, values)
        # What Model.from_db does for a full row, minus the signals nobody listens to
        # and the per-field __init__ work: a measurable share of a no-op job's cost.
        obj = model.__new__(model)
        obj.__dict__.update(zip(self.attnames, values, strict=True))
        state = obj._state = ModelState()
        state.adding = False
        state.db = alias
        return obj


@functools.cache
def statements_for(model: type[models.Model], vendor: str, alias: str) -> JobStatements:
    from django.db import connections

    return JobStatements(model, connections[alias])
