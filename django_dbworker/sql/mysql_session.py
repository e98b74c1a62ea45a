"""MariaDB's session settings our statements need, and where they are set.

The statements need three things of the session: READ COMMITTED (each statement
sees what committed before it, and InnoDB takes no gap locks: a claim never blocks
an enqueue), standard ``UPDATE`` assignments (``SIMULTANEOUS_ASSIGNMENT``: each
assignment reads the row as it was; the statements read columns they also set), and
a clock in UTC (``UNIX_TIMESTAMP(SYSDATE(6))`` without a local hour that comes twice).

- The worker's own connections are its: ``setup_session`` sets them for the session.
- Django's connections are the application's (the operator's operations, the
  testing helpers): what the project chose for them (``OPTIONS["isolation_level"]``,
  a ``time_zone`` or ``sql_mode`` in ``init_command``) must stay as it was for its
  next request. There each statement carries what it needs (``scoped``: ``SET
  STATEMENT … FOR``, that statement only), and a transaction of our own is READ
  COMMITTED (``transaction``: ``SET TRANSACTION``, that transaction only).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from django.db import transaction as django_transaction
from django.db.models.functions import Now

#: What every private connection of the worker sets for its session.
SESSION_SETUP = (
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    "SET SESSION time_zone = '+00:00'",
    "SET SESSION sql_mode = CONCAT(@@SESSION.sql_mode, ',SIMULTANEOUS_ASSIGNMENT')",
)

#: The same settings (but the isolation level, which no ``SET STATEMENT`` takes) for
#: one statement: ``SCOPED + sql``.
SCOPED = (
    "SET STATEMENT time_zone = '+00:00', "
    "sql_mode = CONCAT(@@SESSION.sql_mode, ',SIMULTANEOUS_ASSIGNMENT') FOR "
)


def setup_session(cursor: Any, timeout: float | None = None) -> None:
    """``SESSION_SETUP`` on the connection of ``cursor`` (a private connection of the
    worker); with ``timeout`` (seconds), no statement runs longer
    (``max_statement_time``) nor waits longer for a row lock
    (``innodb_lock_wait_timeout``, whole seconds)."""
    for statement in SESSION_SETUP:
        cursor.execute(statement)
    if timeout:
        cursor.execute(
            "SET SESSION max_statement_time = %s, innodb_lock_wait_timeout = %s",
            (float(timeout), max(1, math.ceil(timeout))),
        )


def scoped(sql: str) -> str:
    """``sql`` with the settings it needs, for itself only."""
    return SCOPED + sql


class ScopedCursor:
    """A cursor of a connection that is not ours: each statement it executes carries
    ``SCOPED``. Anything else is the cursor's."""

    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor

    def execute(self, sql: str, params: Any = None) -> Any:
        return self.cursor.execute(SCOPED + sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cursor, name)


class UTCNow(Now):
    """Django's ``Now()``, but on MariaDB the clock in UTC (``UTC_TIMESTAMP(6)``, the
    workers' ``now``), as Django stores datetimes: ``Now()`` is ``CURRENT_TIMESTAMP``,
    in the session's time zone, five hours ahead of what Django stored where a project
    runs its sessions at +05:00."""

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template="UTC_TIMESTAMP(6)", **extra_context)


@contextlib.contextmanager
def transaction(wrapper: Any, *, savepoint: bool = True) -> Iterator[None]:
    """An atomic block on Django's connection ``wrapper``: within the caller's
    transaction if one is open (its isolation level is the caller's; ``savepoint``:
    Django's), else a transaction of its own, READ COMMITTED on MariaDB. ``SET
    TRANSACTION`` before its first statement sets the level of that transaction only
    (its commit or rollback ends it): the session's stays."""
    ours = not wrapper.in_atomic_block and wrapper.get_autocommit()
    with django_transaction.atomic(using=wrapper.alias, savepoint=savepoint):
        if ours and wrapper.vendor == "mysql":
            with wrapper.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        yield
