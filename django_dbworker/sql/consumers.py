"""The ordered consumers' statements that differ by database (``consumers`` above
this layer never asks which one it runs on):

- ``leading``: a transaction in which this process leads the consumers' assignment
  if no other process does now, not waited for: PostgreSQL's advisory transaction
  lock; MariaDB's named lock (``GET_LOCK``, the session's: taken before the
  transaction, released after its commit); SQLite has one process, which leads;
- ``lock_wait``: how long the statements of the current transaction wait for a row
  lock (PostgreSQL's ``lock_timeout``; MariaDB's ``innodb_lock_wait_timeout``, whole
  seconds, set for the session and put back after);
- ``take_turn``: the guard of a transactional batch (the checkpoint row touched if
  it is still ours, locked to the end of the batch, and read), which also bounds the
  batch's statements and idle time by its ``batch_timeout`` where the server can:
  PostgreSQL's ``statement_timeout`` and ``idle_in_transaction_session_timeout``
  (for the transaction), MariaDB's ``max_statement_time`` and
  ``idle_transaction_timeout`` (set for the session, put back after the batch).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from django.db import DatabaseError, connections, transaction

from .mysql_session import UTCNow

#: (position, paused, head, failures) of a checkpoint row.
Turn = tuple[int, bool, int, int]


@contextlib.contextmanager
def lock_wait(alias: str, seconds: float | None) -> Iterator[None]:
    """Within a transaction on ``alias``: its statements wait at most ``seconds`` for a
    row lock (then fail); None: as long as the connection's settings say."""
    wrapper = connections[alias]
    if seconds is None:
        yield
    elif wrapper.vendor == "postgresql":
        with wrapper.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('lock_timeout', %s, true)", [f"{int(seconds * 1000)}ms"]
            )
        yield
    elif wrapper.vendor == "mysql":
        with wrapper.cursor() as cursor:
            cursor.execute(
                "SET @dbw_lock_wait = @@SESSION.innodb_lock_wait_timeout, "
                "SESSION innodb_lock_wait_timeout = %s",
                [max(1, math.ceil(seconds))],
            )
        try:
            yield
        finally:
            with wrapper.cursor() as cursor:
                cursor.execute("SET SESSION innodb_lock_wait_timeout = @dbw_lock_wait")
    else:
        yield


@contextlib.contextmanager
def leading(alias: str, lock: tuple[int, int], wait: float) -> Iterator[bool]:
    """A transaction on ``alias`` that holds ``lock`` if no other session holds it now
    (True: this process leads) and waits at most ``wait`` seconds for row locks."""
    wrapper = connections[alias]
    if wrapper.vendor == "mysql":
        from .mysql_locks import lock_name, named_lock

        name = lock_name(wrapper.settings_dict["NAME"], lock)
        with wrapper.cursor() as cursor, named_lock(cursor, name, None, try_only=True) as held:
            if not held:
                yield False
                return
            with transaction.atomic(using=alias), lock_wait(alias, wait):
                yield True
        return
    with transaction.atomic(using=alias), lock_wait(alias, wait):
        if wrapper.vendor != "postgresql":
            yield True
            return
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", list(lock))
            held = bool(cursor.fetchone()[0])
        yield held


@contextlib.contextmanager
def take_turn(
    model: Any, alias: str, fence: dict[str, Any], timeout: float
) -> Iterator[Turn | None]:
    """In a transaction on ``alias``: touch and read the checkpoint row (of ``model``)
    that matches ``fence`` (field name → value), None if none does; the statements and
    idle time within bounded by ``timeout`` seconds."""
    wrapper = connections[alias]
    if wrapper.vendor == "postgresql":
        yield _take_turn_postgresql(model, wrapper, fence, timeout)
        return
    if wrapper.vendor != "mysql":
        yield _take_turn(model, alias, fence)
        return
    with wrapper.cursor() as cursor:
        cursor.execute(
            "SET @dbw_statement_time = @@SESSION.max_statement_time, "
            "@dbw_idle_time = @@SESSION.idle_transaction_timeout, "
            "SESSION max_statement_time = %s, SESSION idle_transaction_timeout = %s",
            [float(timeout), max(1, math.ceil(timeout))],
        )
    try:
        yield _take_turn(model, alias, fence)
    finally:
        with contextlib.suppress(DatabaseError), wrapper.cursor() as cursor:
            # Not after the server ended the connection (idle too long): it is replaced.
            cursor.execute(
                "SET SESSION max_statement_time = @dbw_statement_time, "
                "SESSION idle_transaction_timeout = @dbw_idle_time"
            )


def _take_turn(model: Any, alias: str, fence: dict[str, Any]) -> Turn | None:
    guarded = model._default_manager.using(alias).filter(**fence)
    if not guarded.update(updated_at=UTCNow()):
        return None
    position, paused, head, failures = guarded.values_list(
        "position", "paused", "head", "failures"
    ).get()
    return int(position), bool(paused), int(head), int(failures)


def _take_turn_postgresql(
    model: Any, wrapper: Any, fence: dict[str, Any], timeout: float
) -> Turn | None:
    """One statement, whose limits last to the end of the transaction."""
    qn = wrapper.ops.quote_name
    col = {field.name: qn(str(field.column)) for field in model._meta.fields}
    limit = f"{max(int(timeout * 1000), 1)}ms"
    with wrapper.cursor() as cursor:
        cursor.execute(
            f"UPDATE {qn(model._meta.db_table)} SET {col['updated_at']} = "
            "statement_timestamp() FROM (SELECT "
            "set_config('statement_timeout', %s, true), "
            "set_config('idle_in_transaction_session_timeout', %s, true)) AS dbw_limits "
            f"WHERE {' AND '.join(f'{col[name]} = %s' for name in fence)} "
            f"RETURNING {col['position']}, {col['paused']}, {col['head']}, {col['failures']}",
            [limit, limit, *fence.values()],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return int(row[0]), bool(row[1]), int(row[2]), int(row[3])
