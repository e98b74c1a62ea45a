"""The statement under the operator's operations (``django_dbworker.operations``):
one guarded ``UPDATE … RETURNING`` over the rows of any queryset.

It runs on Django's connection, the application's: on MariaDB the session's isolation
level, time zone and ``sql_mode`` stay as the project set them (``mysql_session``);
the time is the workers' clock in UTC whatever the session's time zone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import OperationalError, connections, router, transaction
from django.db.models import QuerySet

from . import mysql_session
from .dialects import dialect_for
from .partitions import KEY, finished_on_sql, is_moved_row, is_partitioned_model

#: Tries of an operation whose row moved to another partition while it waited for it.
MOVED_TRIES = 5


class GuardedUpdate:
    """``UPDATE <table> SET … WHERE <pk> IN (<queryset>) AND (<guard>) RETURNING …``."""

    def __init__(self, queryset: QuerySet[Any]) -> None:
        self.model = queryset.model
        # Where QuerySet.update() would write (what QuerySet.db says for a write).
        hints = queryset._hints  # type: ignore[attr-defined]
        self.alias: str = queryset._db or router.db_for_write(self.model, **hints)  # type: ignore[attr-defined]
        self.connection = connections[self.alias]
        # The model whose table holds the job columns (a parent's, under multi-table
        # inheritance).
        owner = self.model._meta.get_field("state").model
        assert owner is not None
        assert owner._meta.pk is not None
        self.meta = owner._meta
        quote = self.connection.ops.quote_name
        self.quote = quote
        self.table = quote(self.meta.db_table)
        self.pk = quote(self.meta.pk.column)
        self.pk_field = self.meta.pk
        ids = queryset if queryset.query.is_sliced else queryset.order_by()
        compiler = ids.values("pk").query.get_compiler(using=self.alias)
        try:
            self.ids_sql, ids_params = compiler.as_sql()
            self.empty = False
        except EmptyResultSet:  # e.g. queryset.none(), pk__in=[]
            self.ids_sql, ids_params = "", ()
            self.empty = True
        self.ids_params = list(ids_params)
        # The clock the claims compare process_after with (on MariaDB in UTC, whatever
        # the session's time zone).
        now_sql, now_params = compiler.compile(mysql_session.UTCNow())
        assert not now_params
        self.now = now_sql

    def col(self, name: str) -> str:
        return self.quote(str(self.meta.get_field(name).column))

    def concat(self, *values: str) -> str:
        """Text values joined, in this database's SQL."""
        return dialect_for(self.connection).concat(*values)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """The operation's transaction: the caller's if one is open, else its own (READ
        COMMITTED on MariaDB, for that transaction only)."""
        with mysql_session.transaction(self.connection, savepoint=False):
            yield

    def prep(self, name: str, value: Any) -> Any:
        return self.meta.get_field(name).get_db_prep_save(value, self.connection)

    def run(
        self,
        assignments: str,
        assignment_params: list[Any],
        guard: str,
        guard_params: list[Any],
        returning: str = "",
    ) -> list[tuple[Any, ...]]:
        """Run the statement; the rows it changed as (pk, *returning)."""
        if self.empty:
            return []
        if not dialect_for(self.connection).update_returning:
            return self._run_in_three(
                assignments, assignment_params, guard, guard_params, returning
            )
        sql = (
            f"UPDATE {self.table} SET {assignments} "
            f"WHERE {self.pk} IN ({self.ids_sql}) AND ({guard}) "
            f"RETURNING {self.pk}{', ' + returning if returning else ''}"
        )
        values = [*assignment_params, *self.ids_params, *guard_params]
        if not (self.connection.vendor == "postgresql" and is_partitioned_model(self.model)):
            with self.connection.cursor() as cursor:
                cursor.execute(sql, values)
                rows = cursor.fetchall()
            return [(self.pk_field.to_python(row[0]), *row[1:]) for row in rows]
        return self._run_partitioned(sql, values)

    def _run_partitioned(self, sql: str, values: list[Any]) -> list[tuple[Any, ...]]:
        """``run`` on a partitioned table (``sql.partitions``): the rows it finished or
        made active again move to their partition (``finished_on`` written after), and
        a row that moved while the statement waited for it (a worker finished it) is
        looked at again (PostgreSQL raises instead, even in READ COMMITTED)."""
        key, state = self.col(KEY), self.col("state")
        expression = finished_on_sql(state, f"COALESCE({self.col('finished_at')}, {self.now})")
        move = (
            f"UPDATE {self.table} SET {key} = {expression} "
            f"WHERE {self.pk} = ANY(%s) AND {key} <> {expression}"
        )
        for attempt in range(MOVED_TRIES):
            try:
                with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
                    cursor.execute(sql, values)
                    rows = cursor.fetchall()
                    if rows:
                        cursor.execute(move, [[row[0] for row in rows]])
                break
            except OperationalError as exc:
                if not is_moved_row(exc) or attempt == MOVED_TRIES - 1:
                    raise
        return [(self.pk_field.to_python(row[0]), *row[1:]) for row in rows]

    def _run_in_three(
        self,
        assignments: str,
        assignment_params: list[Any],
        guard: str,
        guard_params: list[Any],
        returning: str,
    ) -> list[tuple[Any, ...]]:
        """``run`` without ``UPDATE … RETURNING``: lock the rows (waiting for them, as
        the UPDATE would), write them, read them back, in one transaction. The keys go
        through a derived table (no LIMIT in ``IN (subquery)`` on MariaDB/MySQL). The
        UPDATE carries the ``sql_mode`` it needs (``mysql_session.scoped``)."""
        pk = f"{self.table}.{self.pk}"
        with self.transaction(), self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {pk} FROM {self.table} WHERE {pk} IN (SELECT * FROM ({self.ids_sql}) "
                f"AS dbw_ids) AND ({guard}) FOR UPDATE",
                [*self.ids_params, *guard_params],
            )
            keys = [row[0] for row in cursor.fetchall()]
            if not keys:
                return []
            marks = ", ".join(["%s"] * len(keys))
            cursor.execute(
                mysql_session.scoped(
                    f"UPDATE {self.table} SET {assignments} WHERE {pk} IN ({marks})"
                ),
                [*assignment_params, *keys],
            )
            cursor.execute(
                f"SELECT {pk}{', ' + returning if returning else ''} FROM {self.table} "
                f"WHERE {pk} IN ({marks})",
                keys,
            )
            rows = cursor.fetchall()
        return [(self.pk_field.to_python(row[0]), *row[1:]) for row in rows]
