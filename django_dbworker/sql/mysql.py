"""MariaDB (>= 10.6) through Django's MySQL backend: row locks with ``SKIP LOCKED``,
the server's UTC clock, keys as JSON arrays read with ``JSON_TABLE``.

Neither MariaDB nor MySQL has ``UPDATE … RETURNING`` (MariaDB has it on DELETE and
INSERT only), and neither takes ``LIMIT`` in an ``IN (subquery)``. The statements are
written once for every vendor (``jobs``, ``registry``) as ``UPDATE … WHERE <key> IN
(<pick>) RETURNING …``; here each one becomes a ``Script`` of three statements run
in one transaction:

1. the pick: ``SELECT <key> … FOR UPDATE SKIP LOCKED`` (``FOR UPDATE`` when the
   statement skipped nothing), which locks the rows it returns;
2. the write: the ``UPDATE`` of exactly those keys (locked: nobody changed them since);
3. the read: the ``RETURNING`` columns of those keys, as the write left them.

What the write sees is what the pick locked, so the statement keeps its fencing
(``state = 'processing' AND worker = %(worker)s``) and its skipping of rows another
transaction holds. ``UPDATE`` assignments are made standard (each one reads the row
as it was) with MariaDB's ``SIMULTANEOUS_ASSIGNMENT`` (``mysql_session``): MySQL has
no such mode and assigns left to right, which is why MySQL is refused for now
(``dbworker.E030``).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import re
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import OperationalError
from django.db.backends.utils import truncate_name
from django.utils import timezone

from .dialects import Dialect, param
from .jobs import ERRORED, QUEUED

if TYPE_CHECKING:
    from .limits import Pick

LOCKING = (" FOR UPDATE SKIP LOCKED", " FOR UPDATE")

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


# -- UPDATE/DELETE … RETURNING as a script ------------------------------------------


@dataclass(frozen=True)
class Script:
    """A statement with ``RETURNING`` as three (see the module's docstring): ``pick``
    and the statements after it take the statement's parameters; ``write`` and
    ``read`` also take the picked keys where ``KEYS`` stands."""

    pick: str
    write: str
    read: str | None  # None: the pick's rows are what it returns


KEYS = "/*dbw_keys*/"
#: The index hint of a write by key.
PRIMARY = "FORCE INDEX (PRIMARY)"


def _scan(sql: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """(index, character, depth) of each character outside string literals and quoted
    names, from ``start``."""
    depth = 0
    quote = ""
    i = start
    while i < len(sql):
        ch = sql[i]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'`\"":
            quote = ch
        else:
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            yield i, ch, depth
        i += 1


def _top_level(sql: str, word: str) -> int:
    """Where ``word`` first stands at parenthesis depth 0, or -1."""
    for i, _ch, depth in _scan(sql):
        if depth == 0 and sql.startswith(word, i):
            return i
    return -1


def _closing(sql: str, opening: int) -> int:
    """The index of the parenthesis that closes the one at ``opening``."""
    for i, ch, depth in _scan(sql, opening):
        if ch == ")" and depth == 0:
            return i
    raise ValueError(f"unbalanced parentheses: {sql!r}")


@functools.lru_cache(maxsize=512)
def script(sql: str) -> Script | None:
    """The script of a statement with ``RETURNING``; None for any other statement."""
    stripped = sql.strip()
    head = stripped[:7].upper()
    if head not in ("UPDATE ", "DELETE ") or " RETURNING " not in stripped:
        return None
    body, returning = stripped.rsplit(" RETURNING ", 1)
    at = _top_level(body, " WHERE ")
    if at < 0:
        raise ValueError(f"a statement with RETURNING but no WHERE: {sql!r}")
    before, where = body[:at], body[at + len(" WHERE ") :]
    words = before.split()
    table = words[1] if head == "UPDATE " else words[2]
    pk, pick, rest = _picked(where)
    if pick is None:
        pk = returning.split(",")[0].strip().split(".")[-1]
        pick = f"SELECT {pk} FROM {table} WHERE {where}{LOCKING[1]}"
        rest = ""
    if head == "UPDATE ":
        # By the primary key only. The partial indexes WorkerJob declares are plain
        # indexes on the key here (no partial indexes): through one of those the write
        # locked its entry after the pick had locked the row, while a handler's
        # job.save() locked them the other way round, and InnoDB found a deadlock.
        before = before.replace(f"UPDATE {table} ", f"UPDATE {table} {PRIMARY} ", 1)
    write = f"{before} WHERE {table}.{pk} IN {KEYS}{rest}"
    columns = [c.strip() for c in _split_columns(returning)]
    names = [c.split(".")[-1] for c in columns]
    if head == "DELETE " and names == [pk]:
        return Script(pick, write, None)
    if head == "UPDATE " and not rest and names[0] == pk and not set(names) & _assigned(before):
        # It returns only what it does not write: the pick reads that, under its lock
        # (the write changes exactly the rows it locked). A round trip less.
        return Script(
            f"SELECT {', '.join(columns)}{pick[_top_level(pick, ' FROM ') :]}", write, None
        )
    read = f"SELECT {', '.join(columns)} FROM {table} WHERE {table}.{pk} IN {KEYS}"
    return Script(pick, write, read)


def _assigned(update: str) -> set[str]:
    """The columns the ``SET`` of ``update`` (up to its WHERE) assigns."""
    assignments = update[_top_level(update, " SET ") + len(" SET ") :]
    return {part.split("=")[0].strip().split(".")[-1] for part in _split_columns(assignments)}


def _picked(where: str) -> tuple[str, str | None, str]:
    """(key column, the locking subquery, the rest) of ``<key> IN (SELECT … FOR UPDATE
    …) <rest>``; (…, None, …) for a WHERE clause of another shape."""
    key, sep, after = where.partition(" IN (")
    if not sep or " " in key.strip() or not after.startswith("SELECT "):
        return "", None, ""
    opening = len(key) + len(" IN ")
    closing = _closing(where, opening)
    inner = where[opening + 1 : closing]
    if not inner.endswith(LOCKING):
        return "", None, ""
    return key.strip().split(".")[-1], inner, where[closing + 1 :]


# -- a pick that sorts: candidates first, then locks ---------------------------------


@dataclass(frozen=True)
class RankedPick:
    """``SELECT <key> FROM <table> WHERE <match> ORDER BY … LIMIT <n> FOR UPDATE SKIP
    LOCKED`` taken apart. InnoDB sorts such a pick after reading, and keeps a lock on
    every row it read: a claim of 3 rows locked every claimable row, and the claims of
    other workers, skipping them all, found the queue empty. So the candidates are read
    first, without locks (``candidates``: a few more than wanted, up to ``CANDIDATES``
    per row wanted while other claims hold those read), then locked in
    their order a few at a time by key (``lock``: the match checked again on the rows
    as they are now), until enough are locked or the candidates run out."""

    candidates: str
    lock: str
    limit: str  # a parameter (``%(limit)s``) or a number


#: Candidates read per row a sorted pick wants at most, and this many more at least.
CANDIDATES, CANDIDATES_EXTRA = 4, 16


@functools.lru_cache(maxsize=256)
def ranked_pick(pick: str) -> RankedPick | None:
    """The ``RankedPick`` of a locking pick that sorts and limits; None for others."""
    if not pick.endswith(LOCKING[0]) or not pick.startswith("SELECT "):
        return None
    body = pick[: -len(LOCKING[0])]
    order = _top_level(body, " ORDER BY ")
    limit = _top_level(body, " LIMIT ")
    where = _top_level(body, " WHERE ")
    if min(order, limit, where) < 0 or not where < order < limit:
        return None
    head = body[:where]  # SELECT <key> FROM <table>
    key = head[len("SELECT ") :].split(" FROM ")[0].strip()
    match = body[where + len(" WHERE ") : order]
    return RankedPick(
        candidates=_candidates(head, key, match, body[order + len(" ORDER BY ") : limit]),
        # By the primary key only: through the state index the lock took entries of
        # rows it did not claim, and the claims' writes of those rows deadlocked.
        lock=f"{head} {PRIMARY} WHERE {key} IN {KEYS} AND ({match}){LOCKING[0]}",
        limit=body[limit + len(" LIMIT ") :].strip(),
    )


#: How a claim's match begins (``JobStatements.claimable``): the two states it takes.
_BOTH_STATES = re.compile(rf"^(\S+) IN \({QUEUED}, {ERRORED}\) ")


def _candidates(head: str, key: str, match: str, ordering: str) -> str:
    """The unlocked read of a sorted pick's candidates (``RankedPick``). A claim's
    (queued or errored rows) reads each state apart, each through the state index in
    the claim's order, and keeps the first of both: one read of both states went
    through the primary key from the lowest key instead, past every finished job
    below the first claimable one (900,000 rows read for a claim, measured at 1M)."""
    both = _BOTH_STATES.match(match)
    if both is None:
        return f"{head} WHERE {match} ORDER BY {ordering} LIMIT {KEYS}"
    items = [item.strip() for item in _split_columns(ordering)]
    columns = [item.removesuffix(" DESC") for item in items]
    aliases = [f"dbw_o{i}" for i in range(len(items))]
    selected = ", ".join([key, *(f"{c} AS {a}" for c, a in zip(columns, aliases, strict=True))])
    source = head[head.index(" FROM ") :]
    branches = " UNION ALL ".join(
        f"(SELECT {selected}{source} WHERE {both.group(1)} = {state} {match[both.end() :]} "
        f"ORDER BY {ordering} LIMIT {KEYS})"
        for state in (QUEUED, ERRORED)
    )
    order = ", ".join(
        a + (" DESC" if i.endswith(" DESC") else "") for a, i in zip(aliases, items, strict=True)
    )
    return f"SELECT {key} FROM ({branches}) AS dbw_u ORDER BY {order} LIMIT {KEYS}"


def _pick_ranked(cursor: Any, literal: Any, ranked: RankedPick, values: Any) -> list[Any]:
    """Read candidates, lock them in order; read more while others held those read.
    Alone on the queue a claim reads as many candidates as it wants and a few more;
    where other workers claim at once (the same first candidates, locked by them) it
    reads four times more, then up to ``CANDIDATES`` per row wanted."""
    limit = ranked.limit
    if limit.startswith("%(") and isinstance(values, Mapping):
        wanted = int(values[limit[2:-2]])
    else:
        wanted = int(limit)
    keys: list[Any] = []
    tried: set[Any] = set()
    size = wanted + CANDIDATES_EXTRA
    most = wanted * CANDIDATES + CANDIDATES_EXTRA
    while True:
        cursor.execute(ranked.candidates.replace(KEYS, str(size)), values)
        read = [row[0] for row in cursor.fetchall()]
        candidates = [key for key in read if key not in tried]
        tried.update(candidates)
        while candidates and len(keys) < wanted:
            batch, candidates = candidates[: wanted - len(keys)], candidates[wanted - len(keys) :]
            cursor.execute(ranked.lock.replace(KEYS, _keys(literal, batch)), values)
            locked = {row[0] for row in cursor.fetchall()}
            keys += [key for key in batch if key in locked]
        if len(keys) >= wanted or len(read) < size or size >= most:
            return keys
        size = min(size * 4, most)


def _keys(literal: Any, keys: Sequence[Any]) -> str:
    """``keys`` as an SQL list (``(1,2,3)``) to write into a statement that takes
    parameters (``%`` doubled); integers directly, anything else through ``literal``."""
    if all(type(key) is int for key in keys):
        return f"({','.join(map(str, keys))})"
    written = literal(tuple(keys))
    return (written.decode() if isinstance(written, bytes) else written).replace("%", "%%")


def _split_columns(columns: str) -> list[str]:
    parts, start = [], 0
    for i, ch, depth in _scan(columns):
        if ch == "," and depth == 0:
            parts.append(columns[start:i])
            start = i + 1
    parts.append(columns[start:])
    return parts


def run(raw: Any, sql: str, params: Mapping[str, Any] | Sequence[Any]) -> list[tuple[Any, ...]]:
    """Run ``sql`` on a raw MySQLdb connection in autocommit mode: a script in a
    transaction of its own, any other statement alone."""
    cursor = raw.cursor()
    try:
        if script(sql) is None:
            cursor.execute(sql, _params(params))
            return list(cursor.fetchall()) if cursor.description else []
        cursor.execute("START TRANSACTION")
        try:
            rows = run_script(cursor, raw.literal, sql, params)
        except BaseException:
            raw.rollback()
            raise
        raw.commit()
        return rows or []
    finally:
        cursor.close()


def _params(params: Mapping[str, Any] | Sequence[Any]) -> Any:
    # Always a mapping or a tuple, never None: MySQLdb formats the statement (``%%``
    # becomes ``%``) only when it has parameters.
    return params if isinstance(params, Mapping) else tuple(params)


def run_script(
    cursor: Any, literal: Any, sql: str, params: Mapping[str, Any] | Sequence[Any]
) -> list[tuple[Any, ...]] | None:
    """Run ``sql`` with ``cursor`` if it is a script (the caller holds a transaction
    open); None if it is an ordinary statement. ``literal``: the connection's
    ``literal()`` (the keys are written into the statement, escaped)."""
    parts = script(sql)
    if parts is None:
        return None
    values = _params(params)
    ranked = ranked_pick(parts.pick)
    if ranked is None:
        cursor.execute(parts.pick, values)
        picked = list(cursor.fetchall())
    else:
        picked = [(key,) for key in _pick_ranked(cursor, literal, ranked, values)]
    if not picked:
        return []
    written = _keys(literal, [row[0] for row in picked])
    cursor.execute(parts.write.replace(KEYS, written), values)
    if parts.read is None:
        return picked
    cursor.execute(parts.read.replace(KEYS, written), values)
    return list(cursor.fetchall())


# -- a limited claim under its handler's named lock -----------------------------------

#: How long a limited claim waits for its handler's lock at most (seconds), when no
#: STATEMENT_TIMEOUT says.
LOCK_WAIT = 30.0


def lock_name(database: str, lock: tuple[int, int]) -> str:
    """The ``GET_LOCK`` name of ``lock`` (a ``LimitedClaim.lock``) in ``database``: named
    locks are the server's, not a database's."""
    return f"dbworker:{zlib.crc32(database.encode()):08x}:{lock[0]:x}:{lock[1]}"


@contextlib.contextmanager
def named_lock(
    cursor: Any, name: str, timeout: float | None, *, try_only: bool = False
) -> Iterator[bool]:
    """Hold the named lock ``name`` (waiting ``timeout`` seconds at most) within; with
    ``try_only``, not waited for: within is told whether it holds it. It is the
    session's, not a transaction's: released here, or by the server when the
    connection goes (a failed release closes the connection, so it goes)."""
    wait = 0 if try_only else timeout or LOCK_WAIT
    cursor.execute("SELECT GET_LOCK(%s, %s)", (name, wait))
    if cursor.fetchone()[0] != 1:
        if not try_only:
            raise OperationalError(f"waited {wait:g} s for lock {name!r}: giving up")
        yield False
        return
    try:
        yield True
    finally:
        try:
            cursor.execute("DO RELEASE_LOCK(%s)", (name,))
        except BaseException:
            cursor.connection.close()
            raise


def run_limited(
    cursor: Any,
    literal: Any,
    sql: str,
    params: Mapping[str, Any],
    then: Callable[[list[tuple[Any, ...]]], Sequence[tuple[str, Mapping[str, Any]]]],
    pick: Pick | None,
) -> list[tuple[Any, ...]]:
    """A limited claim (``LimitedClaim``) in the caller's transaction, under its lock:
    the pick's count and keys first, then ``sql`` of those keys, then what ``then`` of
    its rows says."""
    values = dict(params)
    if pick is not None:
        cursor.execute(pick.count_sql, values)
        allowed = int(cursor.fetchone()[0] or 0)
        if allowed <= 0:
            return []
        values["dbw_allowed"] = allowed
        cursor.execute(pick.keys_sql, values)
        keys = [row[0] for row in cursor.fetchall()]
        if not keys:
            return []
        integers = all(isinstance(key, int) for key in keys)
        values["ids"] = MySQLDialect().ids(keys, integers)
    rows = _statement(cursor, literal, sql, values)
    for follow, follow_params in then(rows):
        _statement(cursor, literal, follow, follow_params)
    return rows


def _statement(
    cursor: Any, literal: Any, sql: str, params: Mapping[str, Any] | Sequence[Any]
) -> list[tuple[Any, ...]]:
    rows = run_script(cursor, literal, sql, params)
    if rows is not None:
        return rows
    cursor.execute(sql, _params(params))
    return list(cursor.fetchall()) if cursor.description else []


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
