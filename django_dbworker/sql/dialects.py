"""What differs between the databases we support, as SQL fragments.

A statement is written once (``jobs``, ``registry``) from these fragments, the
way Django's backends put vendor differences into ``operations`` classes.
Every fragment takes its values as named parameters (``%(name)s``).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper


def param(name: str) -> str:
    """The placeholder of a named parameter."""
    return f"%({name})s"


class Dialect:
    """One database vendor. Subclasses: ``PostgresDialect``, ``SQLiteDialect``,
    ``MySQLDialect`` (MariaDB)."""

    vendor = ""
    #: Row locks exist (``SKIP LOCKED`` skips them; a row another transaction locks is
    #: skipped by outcomes and heartbeats, then told apart from a lost one).
    row_locks = False
    #: The claim statement returns its rows in claim order (else the caller sorts them).
    ordered_claims = False
    #: ``UPDATE … RETURNING`` exists (else the connection runs such a statement as a
    #: pick, a write and a read: ``mysql_script.Script``).
    update_returning = True
    #: One writer at a time for the whole database (a transaction that wrote holds
    #: every other writer back until it ends).
    single_writer = False
    #: The features this database does not have yet, by name ("limits", "unique",
    #: "consumers"): why, in a sentence. The system checks refuse them (``support``).
    missing: dict[str, str] = {}
    #: An index can have a WHERE (a partial index); where it cannot, the dequeue and
    #: waiting indexes lead with the state (``indexes``).
    partial_indexes = True
    #: A unique index can have a WHERE (a partial index). Where it cannot, a unique job
    #: constraint indexes a generated column instead (``add_unique_where``).
    partial_unique = True
    #: A claim's ``LIMIT`` is written in its statement, one statement per size: the
    #: generic plan of a prepared claim then knows it. (PostgreSQL cannot see a
    #: parameter's value there: it costs the generic plan for a tenth of the claimable
    #: rows and plans every execution afresh instead.)
    limit_written = False
    #: The current time.
    now = ""
    #: What a subquery that picks rows to change adds to lock them without waiting.
    skip_locked = ""

    #: The current time in seconds since the epoch (a float).
    epoch = ""

    def server_problem(self, connection: BaseDatabaseWrapper) -> str | None:
        """Why the server behind ``connection`` cannot hold job tables (dbworker.E030),
        or None."""
        return None

    def clock(self, connection: BaseDatabaseWrapper) -> datetime.datetime:
        """The database's clock, as Django holds datetimes (aware with USE_TZ)."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT CURRENT_TIMESTAMP")
            now: datetime.datetime = cursor.fetchone()[0]
        return now

    def add_unique_where(
        self, table: str, name: str, columns: Sequence[str], condition: str
    ) -> str:
        """DDL (no partial index here): the unique index ``name`` over ``columns`` of
        the rows of ``table`` that match ``condition`` (SQL); a NULL in ``columns``
        collides with nothing."""
        raise NotImplementedError

    def drop_unique_where(self, table: str, name: str) -> str:
        """DDL: drop what ``add_unique_where`` added."""
        raise NotImplementedError

    def deadlocked(self, error: BaseException) -> bool:
        """Whether ``error`` says the database ended the transaction to break a
        deadlock (it rolled back all of it: only a whole transaction can run again)."""
        return False

    def least(self, *values: str) -> str:
        """The smallest of two or more values."""
        raise NotImplementedError

    def greatest(self, *values: str) -> str:
        """The largest of two or more values."""
        raise NotImplementedError

    def floor_int(self, value: str) -> str:
        """A non-negative number rounded down, as an integer (a ``LIMIT`` takes it)."""
        raise NotImplementedError

    def json_object(self, pairs: Sequence[tuple[str, str]]) -> str:
        """A JSON object of (name, SQL expression) pairs."""
        raise NotImplementedError

    def iso_time(self, value: str) -> str:
        """A datetime expression as ISO 8601 text inside a JSON document (with the UTC
        offset where Django stores aware datetimes)."""
        return value

    def log_summary(self, column: str, most: int) -> str:
        """The first ``most`` entries of an execution log (a JSON list column), each
        reduced to its ``key`` and ``exit_code``: a JSON list."""
        raise NotImplementedError

    def json_append_bounded(self, column: str, value: str, most: int) -> str:
        """``column`` (a JSON list) with the JSON ``value`` appended, its first entry
        dropped when it already holds ``most``."""
        raise NotImplementedError

    def among(self, value: str, subquery: str) -> str:
        """``value`` is one of the values ``subquery`` returns, the set computed once (so
        the plan does not hang on an estimate of how many there are)."""
        return f"{value} IN ({subquery})"

    def not_among(self, value: str, subquery: str) -> str:
        """``value`` is none of the values ``subquery`` returns (none of them NULL). The
        set is computed once, not per row."""
        return f"{value} NOT IN ({subquery})"

    def concat(self, *values: str) -> str:
        """Text values joined (none of them NULL)."""
        return "(" + " || ".join(values) + ")"

    def key_text(self, value: str) -> str:
        """A key of any type as the text a rate bucket holds it as (``RateBucket.key``),
        compared byte for byte with a bucket's column or another ``key_text``."""
        return f"CAST({value} AS TEXT)"

    def same_unique_key(
        self, name: str, columns: Sequence[str], other: str, this: str, held: str
    ) -> str:
        """Row ``other`` holds the key of unique constraint ``name`` (over ``columns``,
        held while ``held``, SQL about ``other``) that row ``this`` would hold: as the
        constraint's unique index compares them (NULLs never collide)."""
        same = " AND ".join(f"{other}.{c} = {this}.{c}" for c in columns)
        return f"{held} AND {same}"

    def exact(self, value: str) -> str:
        """A key-like text (a concurrency key, a handler's or a queue's name) as it is
        compared with another: byte for byte, whatever the collations of the columns
        and of the connection. PostgreSQL's deterministic collations and SQLite's
        BINARY compare so already."""
        return value

    def ordered(self, update: str, ordering: str, ctes: str = "", after: str = "") -> str:
        """A claim (``UPDATE … RETURNING``) whose rows come back in ``ordering``, after
        the common table expressions ``ctes`` (``name AS (…), …``) it uses; ``after``:
        expressions that read its rows as ``claimed`` (PostgreSQL only)."""
        assert not after
        return f"WITH {ctes} {update}" if ctes else update

    def after(self, seconds: str) -> str:
        """The current time plus ``seconds`` (an SQL expression; NULL gives NULL)."""
        raise NotImplementedError

    def seconds_until(self, value: str) -> str:
        """Seconds from now until the datetime ``value`` (negative once it passed), as
        a float; NULL for NULL."""
        raise NotImplementedError

    def in_ids(self, name: str, pk_type: str) -> str:
        """``<key> IN`` the keys of parameter ``name`` (see ``ids``)."""
        raise NotImplementedError

    def in_uncounted_ids(self, name: str, pk_type: str) -> str:
        """``in_ids``, as a set the planner cannot count: a plan costs the same whatever
        their number (see ``limit_written``)."""
        return self.in_ids(name, pk_type)

    def ids(self, keys: Sequence[Any], integers: bool) -> Any:
        """The value of an ``in_ids`` parameter: keys already prepared for the database."""
        raise NotImplementedError

    def as_json(self, name: str) -> str:
        """Parameter ``name`` (a JSON document as text) as the JSON column type."""
        raise NotImplementedError

    def json_append(self, column: str, value: str, *, text: bool = False) -> str:
        """``column`` (a JSON list) with ``value`` appended: an SQL expression of JSON
        text, or (``text``) of a string the list gets as a JSON string."""
        raise NotImplementedError

    def json_member(self, name: str, key: str, pk_type: str) -> str:
        """The JSON value parameter ``name`` (a ``members_param``) gives for the row
        whose primary key (of type ``pk_type``) is the SQL expression ``key`` (qualified
        by its table); NULL if it gives none. Keys are compared for equality, never
        spliced into a JSON path: a key holding ``"`` would name another member there."""
        raise NotImplementedError

    def members_param(self, pairs: Sequence[tuple[Any, str]]) -> Any:
        """A ``json_member`` parameter: (key prepared for the database, JSON text) per
        row, each key once."""
        raise NotImplementedError

    def with_results(self, table: str, pk: str, column: str, pk_type: str) -> tuple[str, str]:
        """(extra ``FROM`` clause, ``SET`` value) that set ``column`` of each row from
        parameter ``results``: a value of ``results_param()``."""
        raise NotImplementedError

    def results_param(self, pairs: Sequence[tuple[Any, str]]) -> dict[str, Any]:
        """``results``: (key prepared for the database, JSON text) per row."""
        raise NotImplementedError

    def upsert(self, conflict: Sequence[str], replaced: Sequence[str]) -> str:
        """What follows ``INSERT … VALUES (…)`` so that a row that would break the unique
        key ``conflict`` has its columns ``replaced`` set from the new row instead."""
        return f"ON CONFLICT ({', '.join(conflict)}) DO UPDATE SET " + ", ".join(
            f"{c} = excluded.{c}" for c in replaced
        )

    def update_on_conflict(
        self, conflict: Sequence[str], assignments: Sequence[tuple[str, str]]
    ) -> str:
        """What follows ``INSERT … SELECT …`` so that a row that would break the unique
        key ``conflict`` is updated by ``assignments`` (column, expression) instead; the
        expressions read the new row's values as ``inserted(column)``."""
        sets = ", ".join(f"{column} = {value}" for column, value in assignments)
        return f"ON CONFLICT ({', '.join(conflict)}) DO UPDATE SET {sets}"

    def inserted(self, column: str) -> str:
        """The value the row being inserted has for ``column``, in ``update_on_conflict``."""
        return f"excluded.{column}"

    def keep_existing(self, conflict: Sequence[str]) -> str:
        """What follows ``INSERT … VALUES (…)`` so that a row that would break the unique
        key ``conflict`` is not inserted, and the row there is left as it is."""
        return f"ON CONFLICT ({', '.join(conflict)}) DO NOTHING"

    def lock_of(self, alias: str) -> str:
        """``skip_locked`` for the rows of ``alias`` only, in a query that joins others."""
        return ""

    def fenced(self, table: str, pk: str, match: str) -> str:
        """A WHERE clause for rows that ``match``; with row locks, without waiting for a
        row another transaction locks (the statement skips it instead)."""
        return match

    def estimated_rows(
        self, connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]
    ) -> int | None:
        """The rows the planner expects the query ``sql`` to return, from the table's
        statistics (the admin's counts at any size); None where there is no such
        estimate: counts are then exact."""
        return None

    def holders(self, name: str) -> str:
        """A derived table ``h(worker, age, resets)`` from parameter ``name``."""
        raise NotImplementedError

    def holders_params(
        self, name: str, holders: Sequence[tuple[str, float, int]]
    ) -> dict[str, Any]:
        """The parameters of ``holders(name)``: (worker id, age, resets) each."""
        raise NotImplementedError


def dialect_for(connection: BaseDatabaseWrapper) -> Dialect:
    """The dialect of a Django connection (``dbworker.E006`` refuses other vendors,
    ``dbworker.E030`` servers of a supported vendor we cannot run on)."""
    from .mysql import MySQLDialect
    from .postgresql import PostgresDialect
    from .sqlite import SQLiteDialect

    dialects: dict[str, type[Dialect]] = {
        "postgresql": PostgresDialect,
        "sqlite": SQLiteDialect,
        "mysql": MySQLDialect,
    }
    try:
        return dialects[connection.vendor]()
    except KeyError:
        raise NotImplementedError(
            f"database vendor {connection.vendor!r} is not supported"
        ) from None
