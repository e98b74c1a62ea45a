"""MariaDB's statements with ``RETURNING``, each run as a script of three.

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

import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .jobs import ERRORED, QUEUED

LOCKING = (" FOR UPDATE SKIP LOCKED", " FOR UPDATE")


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
