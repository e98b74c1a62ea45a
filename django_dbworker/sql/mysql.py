"""MariaDB (>= 10.6) through Django's MySQL backend: row locks with ``SKIP LOCKED``,
the server's UTC clock, keys as JSON arrays read with ``JSON_TABLE``; MySQLdb's
converters and disconnects.

Statements with ``RETURNING`` run as a script of three (``mysql_script``), a limited
claim under its handler's named lock (``mysql_locks``).
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from django.conf import settings
from django.db.backends.utils import truncate_name
from django.utils import timezone

from .dialects import Dialect, param
from .mysql_script import LOCKING, PRIMARY

#: The error InnoDB ends a transaction with to break a deadlock.
ER_LOCK_DEADLOCK = 1213

#: The longest name of a column or an index.
MAX_NAME = 64

#: The oldest MariaDB: JSON_TABLE (10.6), SKIP LOCKED (10.6).
MARIADB_MIN = (10, 6)


def server_problem(connection: Any) -> str | None:
    """Why the server of a MySQL-backend ``connection`` cannot hold job tables (it
    connects), or None: MySQL itself (no SIMULTANEOUS_ASSIGNMENT: an UPDATE assigns
    left to right, and our statements read columns they also set; not tested either),
    or a MariaDB older than ``MARIADB_MIN``."""
    if not connection.mysql_is_mariadb:
        return (
            "MySQL is not supported yet (MariaDB >= 10.6 is): its UPDATE assigns columns "
            "left to right, which the job statements do not allow for"
        )
    if tuple(connection.mysql_version[:2]) < MARIADB_MIN:
        version = ".".join(map(str, connection.mysql_version[:3]))
        return f"MariaDB {version} is too old: the job statements need MariaDB >= 10.6"
    return None


def key_column(constraint: str) -> str:
    """The generated column whose unique index is unique constraint ``constraint``
    (``MySQLDialect.add_unique_where``): a digest of the key while a row holds it."""
    return truncate_name(f"{constraint}__key", MAX_NAME)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class MySQLDialect(Dialect):
    vendor = "mysql"
    row_locks = True
    update_returning = False
    partial_unique = False
    partial_indexes = False

    def server_problem(self, connection: Any) -> str | None:
        return server_problem(connection)

    now = "UTC_TIMESTAMP(6)"
    skip_locked = LOCKING[0]
    epoch = "UNIX_TIMESTAMP(SYSDATE(6))"

    def clock(self, connection: Any) -> datetime.datetime:
        # Naive datetimes come back: UTC_TIMESTAMP is ``now``'s clock, in UTC.
        with connection.cursor() as cursor:
            cursor.execute("SELECT UTC_TIMESTAMP(6)")
            now: datetime.datetime = cursor.fetchone()[0]
        if settings.USE_TZ:
            return now.replace(tzinfo=datetime.UTC)
        return timezone.localtime(now.replace(tzinfo=datetime.UTC)).replace(tzinfo=None)

    def add_unique_where(
        self, table: str, name: str, columns: Sequence[str], condition: str
    ) -> str:
        # An invisible generated column holds a digest of the key while the row
        # matches, else NULL (as when a field of the key is NULL: NULLs never collide).
        # The key as a JSON array first: ("a", "bc") and ("ab", "c") stay apart.
        fields = ", ".join(map(_quote, columns))
        holds = " AND ".join([f"({condition})", *(f"{_quote(c)} IS NOT NULL" for c in columns)])
        key = _quote(key_column(name))
        return (
            f"ALTER TABLE {_quote(table)} ADD COLUMN {key} BINARY(32) AS (IF({holds}, "
            f"UNHEX(SHA2(JSON_ARRAY({fields}), 256)), NULL)) STORED INVISIBLE, "
            f"ADD CONSTRAINT {_quote(name)} UNIQUE ({key})"
        )

    def drop_unique_where(self, table: str, name: str) -> str:
        key = _quote(key_column(name))
        return f"ALTER TABLE {_quote(table)} DROP INDEX {_quote(name)}, DROP COLUMN {key}"

    def deadlocked(self, error: BaseException) -> bool:
        # InnoDB's ER_LOCK_DEADLOCK: inserts of one unique key waiting on a row that
        # changes deadlock among themselves (PostgreSQL makes them wait in turn).
        return bool(error.args) and error.args[0] == ER_LOCK_DEADLOCK

    def least(self, *values: str) -> str:
        return f"LEAST({', '.join(values)})"

    def estimated_rows(self, connection: Any, sql: str, params: Sequence[Any]) -> int | None:
        # The rows the plan reads from the table (index dives on a range of the state
        # index; InnoDB's statistics for a whole scan) times the share it keeps.
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN FORMAT=JSON {sql}", params)
            plan = json.loads(cursor.fetchone()[0])
        table = _first_table(plan)
        if table is None or "rows" not in table:
            return None
        return int(float(table["rows"]) * float(table.get("filtered", 100)) / 100)

    def greatest(self, *values: str) -> str:
        return f"GREATEST({', '.join(values)})"

    def floor_int(self, value: str) -> str:
        return f"CAST(FLOOR({value}) AS SIGNED)"

    def json_object(self, pairs: Sequence[tuple[str, str]]) -> str:
        return "JSON_OBJECT(" + ", ".join(f"'{k}', {v}" for k, v in pairs) + ")"

    def iso_time(self, value: str) -> str:
        # Django stores naive datetime(6), in UTC when USE_TZ.
        offset = "+00:00" if settings.USE_TZ else ""
        return f"DATE_FORMAT({value}, '%%Y-%%m-%%dT%%H:%%i:%%s.%%f{offset}')"

    def log_summary(self, column: str, most: int) -> str:
        return (
            "(SELECT COALESCE(JSON_ARRAYAGG(JSON_OBJECT('key', JSON_EXTRACT(dbw_e.v, '$.key'), "
            "'exit_code', JSON_EXTRACT(dbw_e.v, '$.exit_code'))), JSON_ARRAY()) FROM "
            f"JSON_TABLE(COALESCE({column}, '[]'), '$[*]' COLUMNS (n FOR ORDINALITY, "
            f"v JSON PATH '$')) AS dbw_e WHERE dbw_e.n <= {int(most)})"
        )

    def json_append_bounded(self, column: str, value: str, most: int) -> str:
        return (
            f"JSON_ARRAY_APPEND(CASE WHEN JSON_LENGTH({column}) >= {int(most)} THEN "
            f"JSON_REMOVE({column}, '$[0]') ELSE {column} END, '$', {value})"
        )

    def concat(self, *values: str) -> str:
        # || is OR here (unless sql_mode has PIPES_AS_CONCAT).
        return f"CONCAT({', '.join(values)})"

    def key_text(self, value: str) -> str:
        return self.exact(value)

    def same_unique_key(
        self, name: str, columns: Sequence[str], other: str, this: str, held: str
    ) -> str:
        # The digest the generated column of ``other`` holds while it holds the key
        # (``add_unique_where``), against the one ``this`` would hold: byte for byte,
        # through the unique index, whatever the collations.
        fields = ", ".join(f"{this}.{c}" for c in columns)
        return f"{other}.{_quote(key_column(name))} = UNHEX(SHA2(JSON_ARRAY({fields}), 256))"

    def exact(self, value: str) -> str:
        # The bytes of the text in utf8mb4: a binary string compares byte for byte with
        # any other string. Compared as text, a column's collation and another's (or the
        # connection's, which CAST(… AS CHAR) takes) may differ, and MariaDB refuses to
        # choose (error 1267, "Illegal mix of collations"); equal they compare
        # case-insensitively and ignore trailing spaces (utf8mb4_general_ci, _unicode_ci).
        return f"CAST(CONVERT({value} USING utf8mb4) AS BINARY)"

    def after(self, seconds: str) -> str:
        return f"DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ROUND(({seconds}) * 1000000) MICROSECOND)"

    def seconds_until(self, value: str) -> str:
        return f"TIMESTAMPDIFF(MICROSECOND, {self.now}, {value}) / 1000000.0"

    def in_ids(self, name: str, pk_type: str) -> str:
        return (
            f"IN (SELECT dbw_id FROM JSON_TABLE({param(name)}, '$[*]' COLUMNS "
            f"(dbw_id {_json_table_type(pk_type)} PATH '$')) AS dbw_ids)"
        )

    def ids(self, keys: Sequence[Any], integers: bool) -> Any:
        return json.dumps([int(pk) for pk in keys] if integers else [str(pk) for pk in keys])

    def as_json(self, name: str) -> str:
        return param(name)

    def json_append(self, column: str, value: str, *, text: bool = False) -> str:
        item = value if text else f"JSON_EXTRACT({value}, '$')"
        return f"JSON_ARRAY_APPEND(COALESCE({column}, JSON_ARRAY()), '$', {item})"

    def json_member(self, name: str, key: str, pk_type: str) -> str:
        # The value travels as a JSON string of its JSON text: read as text, unquoted.
        # Keys compared byte for byte, whatever the collations of the table and the
        # connection (both sides are the exact text of a key the worker read).
        return (
            f"(SELECT dbw_m.v FROM JSON_TABLE({param(name)}, '$[*]' COLUMNS "
            f"(k {_json_key_type(pk_type)} PATH '$[0]', v LONGTEXT PATH '$[1]')) AS dbw_m "
            f"WHERE dbw_m.k = {key})"
        )

    def members_param(self, pairs: Sequence[tuple[Any, str]]) -> Any:
        return json.dumps([[key if isinstance(key, int) else str(key), v] for key, v in pairs])

    def with_results(self, table: str, pk: str, column: str, pk_type: str) -> tuple[str, str]:
        return "", self.json_member("results", f"{table}.{pk}", pk_type)

    def results_param(self, pairs: Sequence[tuple[Any, str]]) -> dict[str, Any]:
        return {"results": self.members_param(pairs)}

    def lock_of(self, alias: str) -> str:
        return LOCKING[0]

    def fenced(self, table: str, pk: str, match: str) -> str:
        # Rows named by key: looked up by the primary key only. Through the state index
        # the pick locked a row's index entry, then waited for its row (another
        # transaction's lock, which SKIP LOCKED did not skip there), and every other
        # pick of the worker's rows waited on that entry: heartbeats stopped.
        hint = f" {PRIMARY}" if match.startswith(f"{pk} ") else ""
        return f"{pk} IN (SELECT {pk} FROM {table}{hint} WHERE {match}{LOCKING[0]})"

    def upsert(self, conflict: Sequence[str], replaced: Sequence[str]) -> str:
        return "ON DUPLICATE KEY UPDATE " + ", ".join(f"{c} = VALUES({c})" for c in replaced)

    def update_on_conflict(
        self, conflict: Sequence[str], assignments: Sequence[tuple[str, str]]
    ) -> str:
        sets = ", ".join(f"{column} = {value}" for column, value in assignments)
        return f"ON DUPLICATE KEY UPDATE {sets}"

    def inserted(self, column: str) -> str:
        return f"VALUES({column})"

    def keep_existing(self, conflict: Sequence[str]) -> str:
        return f"ON DUPLICATE KEY UPDATE {conflict[0]} = {conflict[0]}"

    def holders(self, name: str) -> str:
        # Worker ids as bytes (``exact``): a text column of JSON_TABLE takes the
        # database's default collation, which a job table's need not share (error 1267).
        return (
            f"JSON_TABLE({param(name)}, '$[*]' COLUMNS (worker VARBINARY(1020) PATH '$[0]', "
            "age DOUBLE PATH '$[1]', resets INT PATH '$[2]')) AS h"
        )

    def holders_params(
        self, name: str, holders: Sequence[tuple[str, float, int]]
    ) -> dict[str, Any]:
        return {name: json.dumps([list(holder) for holder in holders])}


def _first_table(plan: Any) -> dict[str, Any] | None:
    """The first ``table`` of an ``EXPLAIN FORMAT=JSON`` plan, however deep."""
    if isinstance(plan, dict):
        table = plan.get("table")
        if isinstance(table, dict):
            return table
        children: Any = plan.values()
    elif isinstance(plan, list):
        children = plan
    else:
        return None
    for child in children:
        found = _first_table(child)
        if found is not None:
            return found
    return None


def _json_key_type(pk_type: str) -> str:
    """``_json_table_type``, text compared byte for byte (``utf8mb4_bin``)."""
    kind = _json_table_type(pk_type)
    return f"{kind} COLLATE utf8mb4_bin" if kind.lower().startswith(("char", "varchar")) else kind


def _json_table_type(pk_type: str) -> str:
    """A column type ``JSON_TABLE`` takes for keys of ``pk_type`` (no AUTO_INCREMENT;
    MariaDB's uuid type as the text it compares with; text keys as their bytes, as
    ``exact`` compares them: a text column of JSON_TABLE takes the database's default
    collation, which the table's need not share, error 1267)."""
    kind = pk_type.split()[0]
    if kind.lower() == "uuid":
        return "CHAR(36)"
    text = re.fullmatch(r"(?:var)?char\((\d+)\)", kind, re.IGNORECASE)
    return f"VARBINARY({int(text.group(1)) * 4})" if text else kind


def conversions(given: Mapping[Any, Any] | None) -> dict[Any, Any]:
    """MySQLdb's converters for the worker's own connections: ``given`` (a database's
    ``OPTIONS["conv"]``) or Django's, with DATETIME and TIMESTAMP values read by
    ``datetime.fromisoformat`` (in C) instead of MySQLdb's Python parser: the same
    naive datetimes (None for a zero date), a sixth of a claim's Python time less."""
    from django.db.backends.mysql.base import django_conversions
    from MySQLdb.constants import FIELD_TYPE

    converters = dict(given if given is not None else django_conversions)
    converters[FIELD_TYPE.DATETIME] = converters[FIELD_TYPE.TIMESTAMP] = _datetime
    return converters


def _datetime(value: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(value)
    except ValueError:  # '0000-00-00 00:00:00', as MySQLdb reads it
        return None


#: MySQLdb's error codes of a connection that is gone (server gone away, lost during
#: a query, killed, …): an outage, not a statement's fault.
DISCONNECTED = frozenset({2006, 2013, 2055, 1927, 4031})


def is_disconnect(exc: BaseException) -> bool:
    args: tuple[Any, ...] = getattr(exc, "args", ())
    return bool(args) and args[0] in DISCONNECTED
