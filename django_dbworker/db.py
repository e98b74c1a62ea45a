"""Private database connections for the worker's own bookkeeping statements.

Each worker thread that writes bookkeeping (the dispatcher, the heartbeat, the
outcome writer, the resetter) owns one of these: a connection of its own,
never the thread's Django connection, so a handler's transaction can never
hold or hide a heartbeat, an outcome or a log entry. On PostgreSQL the
statements run with server-side binding (prepared once), a statement and lock
timeout, and an ``application_name`` that names the worker thread.
"""

from __future__ import annotations

import datetime
import logging
import re
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from . import conf

logger = logging.getLogger(__name__)

_QMARK = re.compile(r"(?<!%)%s")


def _sqlite_sql(sql: str) -> str:
    return _QMARK.sub("?", sql).replace("%%", "%")


class Connection:
    """One private connection to the database ``alias``, opened on first use."""

    def __init__(self, alias: str, role: str) -> None:
        self.alias = alias
        self.role = role
        self.vendor = connections[alias].vendor
        self._wrapper: BaseDatabaseWrapper | None = None
        self._sqlite_cache: dict[str, str] = {}
        #: The last statement failed because the database could not be reached or the
        #: connection broke (an outage), not because of the statement itself.
        self.lost = False

    # The wrapper's ops and quoting are needed to build statements before any I/O.
    @property
    def wrapper(self) -> BaseDatabaseWrapper:
        if self._wrapper is None:
            wrapper = connections.create_connection(self.alias)
            wrapper.inc_thread_sharing()  # closed by whoever stops the worker
            self._wrapper = wrapper
        return self._wrapper

    def _raw(self) -> Any:
        wrapper = self.wrapper
        if wrapper.connection is None:
            wrapper.ensure_connection()
            self._configure(wrapper.connection)
        return wrapper.connection

    def _configure(self, raw: Any) -> None:
        if self.vendor == "postgresql":
            timeout = conf.get("STATEMENT_TIMEOUT")
            raw.prepare_threshold = 0 if conf.get("PREPARED_STATEMENTS") else None
            if settings.USE_TZ:
                # Django's timestamptz loader is a Python subclass of psycopg's (to set
                # the zone); the connection's zone is Django's already, so psycopg's own
                # (C) loader gives the same aware datetimes, several times faster.
                from psycopg.types.datetime import TimestamptzLoader

                raw.adapters.register_loader("timestamptz", TimestamptzLoader)
            with raw.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('application_name', %s, false)", [f"dbworker {self.role}"]
                )
                if timeout:
                    ms = f"{int(timeout * 1000)}ms"
                    cursor.execute("SELECT set_config('statement_timeout', %s, false)", [ms])
                    cursor.execute("SELECT set_config('lock_timeout', %s, false)", [ms])
        elif self.vendor == "sqlite":
            adapt = self.wrapper.ops.adapt_datetimefield_value

            def dbworker_time(offset: float) -> Any:
                return adapt(timezone.now() + datetime.timedelta(seconds=offset or 0))

            raw.create_function("dbworker_time", 1, dbworker_time)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit mode and return its rows."""
        try:
            raw = self._raw()
        except Exception:
            # Could not connect, or the new connection broke while being configured:
            # drop it so the next call starts afresh (never runs unconfigured).
            self.lost = True
            self.close()
            raise
        try:
            rows = self._run(raw, sql, params)
        except Exception:
            if getattr(raw, "broken", False) or getattr(raw, "closed", False):
                self.lost = True
                self.close()
            else:
                self.lost = False
            raise
        self.lost = False
        return rows

    def _run(self, raw: Any, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        if self.vendor == "postgresql":
            from psycopg import Cursor

            with Cursor(raw) as cursor:
                cursor.execute(sql, params)
                return list(cursor.fetchall()) if cursor.description else []
        sqlite_sql = self._sqlite_cache.get(sql)
        if sqlite_sql is None:
            sqlite_sql = self._sqlite_cache[sql] = _sqlite_sql(sql)
        cursor = raw.cursor()
        try:
            cursor.execute(sqlite_sql, params)
            return list(cursor.fetchall())
        finally:
            cursor.close()

    def notify(self, table: str) -> None:
        """Wake the workers of ``table`` (see ``notify.py``); nothing off PostgreSQL."""
        from .notify import CHANNEL, NOTIFY_SQL, enabled

        if enabled(self.alias):
            self.execute(NOTIFY_SQL, [CHANNEL, table])

    def close(self) -> None:
        wrapper, self._wrapper = self._wrapper, None
        if wrapper is not None:
            try:
                wrapper.close()
            except Exception:  # a dead connection may fail to close; it is gone either way
                logger.debug("closing the %s connection failed", self.role, exc_info=True)
