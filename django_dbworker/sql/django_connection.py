"""Our statements on Django's own connection of the calling thread (the testing
helpers' runner)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from .drivers import add_sqlite_functions

if TYPE_CHECKING:
    from .limits import Pick


class DjangoConnection:
    """Our statements on Django's own connection of the calling thread, inside whatever
    transaction it has open: what the testing helpers run jobs with (a ``TestCase``
    then sees, and rolls back, everything they did). The connection is the
    application's: on MariaDB each statement carries the session settings it needs
    (``mysql_session``), and the session keeps its own."""

    role = "django"
    lost = False
    contended = False

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.vendor = connections[alias].vendor
        self._configured: Any = None

    @property
    def wrapper(self) -> BaseDatabaseWrapper:
        return connections[self.alias]

    def execute(
        self, sql: str, params: Mapping[str, Any] | Sequence[Any] = ()
    ) -> list[tuple[Any, ...]]:
        wrapper = self.wrapper
        with wrapper.cursor() as cursor:
            if self.vendor == "sqlite" and self._configured is not wrapper.connection:
                add_sqlite_functions(wrapper, wrapper.connection)
                self._configured = wrapper.connection
            if self.vendor == "mysql":
                return self._execute_mysql(wrapper, cursor, sql, params)
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []

    def _execute_mysql(
        self,
        wrapper: BaseDatabaseWrapper,
        cursor: Any,
        sql: str,
        params: Mapping[str, Any] | Sequence[Any],
    ) -> list[tuple[Any, ...]]:
        from . import mysql_script, mysql_session

        scoped = mysql_session.ScopedCursor(cursor)
        if mysql_script.script(sql) is None:
            scoped.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []
        with mysql_session.transaction(wrapper):
            return mysql_script.run_script(scoped, wrapper.connection.literal, sql, params) or []

    def execute_locked(
        self,
        lock: tuple[int, int],
        sql: str,
        params: Mapping[str, Any],
        then: Callable[[list[tuple[Any, ...]]], Sequence[tuple[str, Mapping[str, Any]]]],
        pick: Pick | None = None,
    ) -> list[tuple[Any, ...]]:
        """``Connection.execute_locked`` inside the caller's transaction (on MariaDB the
        named lock is released before that transaction ends: the testing helpers run
        one claim at a time)."""
        if self.vendor == "mysql":
            from . import mysql_locks, mysql_session

            wrapper = self.wrapper
            name = mysql_locks.lock_name(wrapper.settings_dict["NAME"], lock)
            with wrapper.cursor() as cursor, mysql_locks.named_lock(cursor, name, None):
                scoped = mysql_session.ScopedCursor(cursor)
                return mysql_locks.run_limited(
                    scoped, wrapper.connection.literal, sql, params, then, pick
                )
        if self.vendor == "postgresql":
            self.execute("SELECT pg_advisory_xact_lock(%s, %s)", lock)
        rows = self.execute(sql, params)
        for follow, follow_params in then(rows):
            self.execute(follow, follow_params)
        return rows

    def notify(self, table: str) -> None:
        from .notify import CHANNEL, NOTIFY_SQL, enabled

        if enabled(self.alias):
            self.execute(NOTIFY_SQL, {"channel": CHANNEL, "table": table})

    def close(self) -> None:
        """Django's connection is Django's to close."""
