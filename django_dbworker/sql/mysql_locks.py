"""MariaDB's limited claim: under its handler's named lock (``GET_LOCK``), the pick's
count and keys, then the claim of those keys."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import OperationalError

from .mysql import MySQLDialect
from .mysql_script import _params, run_script

if TYPE_CHECKING:
    from .limits import Pick

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
