"""The statements of a partitioned job table (PostgreSQL declarative partitioning).

A partitioned job table is ``PARTITION BY RANGE (finished_on)``:

- ``<table>_active``: ``FROM ('9999-12-31') TO (MAXVALUE)``, every job not finished
  (``finished_on`` is ``ACTIVE_DAY`` while a job is queued, processing or errored), so
  a unique key over the active states holds in one partition;
- ``<table>_dYYYYMMDD``: ``FROM (day) TO (day + 1)``, the jobs that finished that day
  (UTC): the outcome that finishes a job writes ``finished_on`` and PostgreSQL moves
  the row;
- ``<table>_default``: the ``DEFAULT`` partition, a safety net for a finished job whose
  day has no partition (none made ahead): an outcome never fails for lack of one;
- ``<table>_legacy``, when an existing table was converted: its finished jobs, where
  they were, ``FROM (MINVALUE) TO ('0001-01-02')``.

Its ``PRIMARY KEY`` is ``(id, finished_on)`` (PostgreSQL wants the partition key in
every unique constraint); Django's model keeps ``id`` as its primary key. Nothing here
runs on another vendor.
"""

from __future__ import annotations

import datetime
import hashlib
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..states import FINAL_STATES

#: ``finished_on`` of every job not finished: the active partition's only value.
ACTIVE_DAY = datetime.date(9999, 12, 31)
#: ``finished_on`` of the finished jobs a converted table held (the legacy partition).
LEGACY_DAY = datetime.date(1, 1, 1)
#: The column (and field name) of the partition key.
KEY = "finished_on"
#: The longest identifier PostgreSQL keeps.
MAX_NAME = 63
#: The SQLSTATE and message of a row moved to another partition under a statement
#: that waited for its lock (PostgreSQL raises it even in READ COMMITTED).
MOVED_SQLSTATE = "40001"
MOVED_MESSAGE = "already moved to another partition"

_BOUND = re.compile(r"FROM \('(\d{4}-\d{2}-\d{2})'\) TO \('(\d{4}-\d{2}-\d{2})'\)")


def is_moved_row(exc: BaseException) -> bool:
    """Whether ``exc`` (a driver's or Django's) says a row this statement waited for
    moved to another partition meanwhile: the statement may run again."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    return code == MOVED_SQLSTATE and MOVED_MESSAGE in str(exc)


def is_partitioned_model(model: Any) -> bool:
    """Whether ``model`` declares a partition key field (``partitions.FinishedOnField``)."""
    try:
        field = model._meta.get_field(KEY)
    except Exception:  # FieldDoesNotExist
        return False
    return bool(getattr(field, "dbworker_partition_key", False))


def partition_name(table: str, suffix: str) -> str:
    """``<table><suffix>`` cut to PostgreSQL's 63 bytes (with a digest of the table's
    name when cut, so two long tables never share a partition's name)."""
    name = f"{table}{suffix}"
    if len(name.encode()) <= MAX_NAME:
        return name
    digest = hashlib.md5(table.encode(), usedforsecurity=False).hexdigest()[:8]
    keep = MAX_NAME - len(suffix) - len(digest) - 1
    return f"{table.encode()[:keep].decode(errors='ignore')}_{digest}{suffix}"


def day_name(table: str, day: datetime.date) -> str:
    return partition_name(table, f"_d{day:%Y%m%d}")


def day_of(finished_at: datetime.datetime | None, state: str) -> datetime.date:
    """``finished_on`` of a job in ``state`` that finished at ``finished_at``."""
    if state not in {str(s) for s in FINAL_STATES}:
        return ACTIVE_DAY
    when = finished_at or datetime.datetime.now(datetime.UTC)
    if when.tzinfo is not None:
        when = when.astimezone(datetime.UTC)
    return when.date()


def finished_on_sql(state: str, now: str) -> str:
    """SQL for ``finished_on`` of a row whose (new) state is the expression ``state``,
    finishing at ``now`` (an expression)."""
    final = ", ".join(f"'{s.value}'" for s in sorted(FINAL_STATES, key=str))
    return (
        f"CASE WHEN ({state}) IN ({final}) "
        f"THEN CAST(({now}) AT TIME ZONE 'UTC' AS date) ELSE DATE '{ACTIVE_DAY}' END"
    )


class Partition(NamedTuple):
    name: str
    #: The day it holds (None: the active, default or legacy partition).
    day: datetime.date | None


def partitions(cursor: Any, table: str) -> list[Partition]:
    """The partitions of ``table`` (unquoted name), day partitions with their day."""
    cursor.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
        [quote(table)],
    )
    found = []
    for name, bound in cursor.fetchall():
        day = None
        match = _BOUND.search(bound or "")
        if match:
            low, high = (datetime.date.fromisoformat(g) for g in match.groups())
            if high - low == datetime.timedelta(days=1) and low != ACTIVE_DAY:
                day = low
        found.append(Partition(name, day))
    return sorted(found, key=lambda p: (p.day or datetime.date.max, p.name))


def is_partitioned(cursor: Any, table: str) -> bool:
    cursor.execute(
        "SELECT c.relkind = 'p' FROM pg_class c WHERE c.oid = to_regclass(%s)", [quote(table)]
    )
    row = cursor.fetchone()
    return bool(row and row[0])


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def lock_timeout(seconds: float) -> str:
    return f"SET LOCAL lock_timeout = '{max(1, int(seconds * 1000))}ms'"


def statement_timeout(seconds: float) -> str:
    return f"SET LOCAL statement_timeout = '{max(1, int(seconds * 1000))}ms'"


def create_day(table: str, day: datetime.date) -> str:
    """A day's partition (takes a short ACCESS EXCLUSIVE lock on ``table``)."""
    after = day + datetime.timedelta(days=1)
    return (
        f"CREATE TABLE IF NOT EXISTS {quote(day_name(table, day))} PARTITION OF {quote(table)} "
        f"FOR VALUES FROM ('{day}') TO ('{after}')"
    )


def detach(table: str, partition: str) -> str:
    return f"ALTER TABLE {quote(table)} DETACH PARTITION {quote(partition)}"


def drop(partition: str) -> str:
    return f"DROP TABLE IF EXISTS {quote(partition)}"


def convert_head(table: str, pk: str, columns: Sequence[str], has_rows: bool) -> list[str]:
    """The first statements that make plain job table ``table`` (primary key column
    ``pk``, ``columns`` in order, ``finished_on`` among them) partitioned, in one
    transaction: the table becomes ``<table>_legacy`` (its indexes and key are dropped
    by the caller first: their names pass to the new table); a partitioned ``<table>``
    takes its columns, defaults and identity (numbering on from where it was), the
    active and default partitions; the active jobs move into the active partition.
    The caller then adds the model's indexes and constraints, and ``convert_tail``."""
    legacy = partition_name(table, "_legacy")
    t, lg, key = quote(table), quote(legacy), quote(KEY)
    active = quote(partition_name(table, "_active"))
    default = quote(partition_name(table, "_default"))
    statements = [
        f"CREATE TABLE {t} (LIKE {lg} INCLUDING DEFAULTS INCLUDING IDENTITY "
        f"INCLUDING GENERATED INCLUDING STORAGE INCLUDING COMMENTS) PARTITION BY RANGE ({key})",
        f"ALTER TABLE {t} ALTER COLUMN {key} SET DEFAULT DATE '{ACTIVE_DAY}'",
        f"ALTER TABLE {t} ADD PRIMARY KEY ({quote(pk)}, {key})",
        f"CREATE TABLE {active} PARTITION OF {t} FOR VALUES FROM ('{ACTIVE_DAY}') TO (MAXVALUE)",
        f"CREATE TABLE {default} PARTITION OF {t} DEFAULT",
        # Number on from the old table's identity (or serial sequence).
        f"SELECT setval(pg_get_serial_sequence('{t}', '{pk}'), "
        f"GREATEST((SELECT COALESCE(MAX({quote(pk)}), 0) FROM {lg}), "
        f"(SELECT COALESCE(MAX(last_value), 0) FROM pg_sequences "
        f"WHERE format('%I.%I', schemaname, sequencename) = "
        f"pg_get_serial_sequence('{lg}', '{pk}')), 1))",
    ]
    if not has_rows:
        return statements
    final = ", ".join(f"'{s.value}'" for s in sorted(FINAL_STATES, key=str))
    names = ", ".join(quote(c) for c in columns)
    values = ", ".join(f"DATE '{ACTIVE_DAY}'" if c == KEY else quote(c) for c in columns)
    return [
        *statements,
        f"INSERT INTO {t} ({names}) SELECT {values} FROM {lg} WHERE state NOT IN ({final})",
        f"DELETE FROM {lg} WHERE state NOT IN ({final})",
    ]


def convert_tail(table: str, pk: str, has_rows: bool) -> list[str]:
    """The last statements of a conversion: the legacy table (its finished jobs) becomes
    the legacy partition, ``finished_on`` = ``LEGACY_DAY`` (a new column: no rewrite;
    PostgreSQL scans the rows once to attach it and builds the table's indexes on it),
    or is dropped when the table had no rows."""
    lg, key = quote(partition_name(table, "_legacy")), quote(KEY)
    if not has_rows:
        return [f"DROP TABLE {lg}"]
    return [
        f"ALTER TABLE {lg} ALTER COLUMN {quote(pk)} DROP IDENTITY IF EXISTS",
        f"ALTER TABLE {lg} ALTER COLUMN {quote(pk)} DROP DEFAULT",
        f"ALTER TABLE {lg} DROP COLUMN {key}",
        f"ALTER TABLE {lg} ADD COLUMN {key} date NOT NULL DEFAULT DATE '{LEGACY_DAY}'",
        f"ALTER TABLE {lg} ALTER COLUMN {key} DROP DEFAULT",
        f"ALTER TABLE {quote(table)} ATTACH PARTITION {lg} FOR VALUES FROM (MINVALUE) TO "
        f"('{LEGACY_DAY + datetime.timedelta(days=1)}')",
    ]


def unconvert(table: str, pk: str) -> list[str]:
    """The statements that make partitioned ``table`` a plain table again (every row
    copied: for going back a migration on a small table)."""
    t, old = quote(table), quote(partition_name(table, "_partitioned"))
    return [
        f"LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE",
        f"ALTER TABLE {t} RENAME TO {old}",
        f"CREATE TABLE {t} (LIKE {old} INCLUDING DEFAULTS INCLUDING IDENTITY "
        "INCLUDING GENERATED INCLUDING STORAGE INCLUDING COMMENTS)",
        f"INSERT INTO {t} SELECT * FROM {old}",
        f"SELECT setval(pg_get_serial_sequence('{t}', '{pk}'), "
        f"(SELECT COALESCE(MAX({quote(pk)}), 0) + 1 FROM {t}), false)",
        f"DROP TABLE {old}",
        f"ALTER TABLE {t} ADD PRIMARY KEY ({quote(pk)})",
    ]


def days_to_make(today: datetime.date, ahead: int) -> Sequence[datetime.date]:
    """Today and the ``ahead`` days after it."""
    return [today + datetime.timedelta(days=n) for n in range(ahead + 1)]
