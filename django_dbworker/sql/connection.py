"""Private database connections for the worker's own bookkeeping statements.

Each worker thread that writes bookkeeping (the dispatcher, the heartbeat, the
outcome writer) owns one of these: a connection of its own, never the thread's
Django connection, so a handler's transaction can never hold or hide a
heartbeat, an outcome or a log entry. What else runs in such a thread uses the
thread's connection too (the resetter in the dispatcher's, the statistics in
the writer's: ``Connections.bind``). On PostgreSQL the statements run with a
statement and lock timeout and an ``application_name`` that names the worker
thread: on a direct connection those are the session's and the statements are
prepared (server-side binding); through a pooler they are set in each
transaction, sent in one query with the statement (``sql.pooler``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from .. import conf
from . import pooler
from .drivers import (
    SQLITE_LOCK_WAIT,
    add_sqlite_functions,
    is_lock_timeout,
    mysql_disconnect,
    numbered,
    private_wrapper,
    sqlite_sql,
)
from .partitions import is_moved_row

#: Runs of a statement whose row moved to another partition (``sql.partitions``).
MOVED_TRIES = 5

if TYPE_CHECKING:
    from .limits import Pick

logger = logging.getLogger(__name__)

#: Prepared statements one connection of ours keeps (PostgreSQL: about 100 KB of the
#: server's memory each, once it has a generic plan).
PREPARED_MAX = 256


class Runner(Protocol):
    """What runs our statements: a private ``Connection``, or Django's own connection
    (``DjangoConnection``, the testing helpers)."""

    alias: str
    vendor: str
    lost: bool
    contended: bool

    @property
    def wrapper(self) -> BaseDatabaseWrapper: ...

    def execute(
        self, sql: str, params: Mapping[str, Any] | Sequence[Any] = ...
    ) -> list[tuple[Any, ...]]: ...

    def execute_locked(
        self,
        lock: tuple[int, int],
        sql: str,
        params: Mapping[str, Any],
        then: Callable[[list[tuple[Any, ...]]], Sequence[tuple[str, Mapping[str, Any]]]],
        pick: Pick | None = None,
    ) -> list[tuple[Any, ...]]: ...

    def notify(self, table: str) -> None: ...

    def close(self) -> None: ...


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
        #: SQLite: the last statement waited long for the write lock, or gave up on it.
        #: Heartbeats could not be written meanwhile either.
        self.contended = False
        #: PostgreSQL, once connected: a pooler sits between us and the server, so the
        #: settings statement (``_local``) runs first in each of our transactions.
        self.pooled = False
        self._local: tuple[str, list[Any]] | None = None
        self._local_prefix = ""

    # The wrapper's ops and quoting are needed to build statements before any I/O.
    @property
    def wrapper(self) -> BaseDatabaseWrapper:
        if self._wrapper is None:
            wrapper = private_wrapper(self.alias)
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
            if settings.USE_TZ:
                # Django's timestamptz loader is a Python subclass of psycopg's (to set
                # the zone); the connection's zone is Django's already, so psycopg's own
                # (C) loader gives the same aware datetimes, several times faster.
                from psycopg.types.datetime import TimestamptzLoader

                raw.adapters.register_loader("timestamptz", TimestamptzLoader)
            self.pooled = pooler.behind_pooler(raw)
            raw.prepare_threshold = pooler.prepare_threshold(self.alias, self.pooled)
            # A claim is one statement per size (``Dialect.limit_written``): room for
            # a lane's every size beside the rest, instead of psycopg's 100.
            raw.prepared_max = PREPARED_MAX
            name = f"dbworker {self.role}"
            timeout = pooler.timeout_text(conf.get("STATEMENT_TIMEOUT"))
            if self.pooled:
                self._local = pooler.local_settings(name, timeout)
                self._local_prefix = pooler.local_prefix(raw, name, timeout)
            else:
                self._local = None
                pooler.session_settings(raw, name, timeout)
        elif self.vendor == "sqlite":
            add_sqlite_functions(self.wrapper, raw)
        elif self.vendor == "mysql":
            from .mysql_session import setup_session

            cursor = raw.cursor()
            try:
                setup_session(cursor, conf.get("STATEMENT_TIMEOUT"))
            finally:
                cursor.close()

    def execute(
        self, sql: str, params: Mapping[str, Any] | Sequence[Any] = ()
    ) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit mode and return its rows. On a partitioned
        table a row may move to another partition between the statement's snapshot and
        its lock (PostgreSQL raises then, even with SKIP LOCKED): it runs again."""
        for _ in range(MOVED_TRIES - 1):
            try:
                return self._guarded(lambda raw: self._run(raw, sql, params))
            except Exception as exc:
                if self.vendor != "postgresql" or not is_moved_row(exc):
                    raise
        return self._guarded(lambda raw: self._run(raw, sql, params))

    def execute_locked(
        self,
        lock: tuple[int, int],
        sql: str,
        params: Mapping[str, Any],
        then: Callable[[list[tuple[Any, ...]]], Sequence[tuple[str, Mapping[str, Any]]]],
        pick: Pick | None = None,
    ) -> list[tuple[Any, ...]]:
        """Run ``sql`` in a transaction of its own that first takes a lock no other such
        transaction of the same ``lock`` holds at once: on PostgreSQL the advisory lock
        ``lock`` (taken in a statement of its own, so ``sql`` sees what the previous
        holder committed; BEGIN, lock, ``sql`` and COMMIT travel in one round trip),
        on SQLite the database's write lock, on MariaDB a named lock (``GET_LOCK``,
        taken before the transaction and released after its commit). The statements
        ``then(rows)`` returns run after ``sql`` in the same transaction (not on
        PostgreSQL: there ``sql`` must do it all); ``pick`` (MariaDB) runs before it
        (``LimitedClaim.pick``). Returns the rows of ``sql``."""
        if self.vendor == "postgresql":
            statement, names = numbered(sql)
            values = [params[name] for name in names]

            def run(raw: Any) -> list[tuple[Any, ...]]:
                from psycopg import RawCursor

                # BEGIN and COMMIT as statements of the pipeline: psycopg's transaction()
                # would wait for each, a round trip apiece. The statements go through
                # server-side binding cursors, as in ``_run``: prepared once, not parsed
                # and planned at each claim.
                try:
                    with raw.pipeline(), RawCursor(raw) as control, RawCursor(raw) as cursor:
                        control.execute("BEGIN")
                        if self._local is not None:
                            control.execute(*self._local)
                        control.execute("SELECT pg_advisory_xact_lock($1, $2)", lock)
                        cursor.execute(statement, values)
                        control.execute("COMMIT")
                        rows = cursor.fetchall()
                except BaseException:
                    if not raw.closed and raw.info.transaction_status != 0:  # not IDLE
                        raw.rollback()
                    raise
                return list(rows)

            # A row moved to another partition under the claim (``execute``): again.
            for _ in range(MOVED_TRIES - 1):
                try:
                    return self._guarded(run)
                except Exception as exc:
                    if not is_moved_row(exc):
                        raise
            return self._guarded(run)
        if self.vendor == "mysql":
            from . import mysql_locks

            name = mysql_locks.lock_name(self.wrapper.settings_dict["NAME"], lock)

            def run_mysql(raw: Any) -> list[tuple[Any, ...]]:
                cursor = raw.cursor()
                try:
                    with mysql_locks.named_lock(cursor, name, conf.get("STATEMENT_TIMEOUT")):
                        cursor.execute("START TRANSACTION")
                        try:
                            rows = mysql_locks.run_limited(
                                cursor, raw.literal, sql, params, then, pick
                            )
                        except BaseException:
                            raw.rollback()
                            raise
                        raw.commit()
                        return rows
                finally:
                    cursor.close()

            return self._guarded(run_mysql)

        def run_sqlite(raw: Any) -> list[tuple[Any, ...]]:
            self._run(raw, "BEGIN IMMEDIATE", ())
            try:
                rows = self._run(raw, sql, params)
                for follow, follow_params in then(rows):
                    self._run(raw, follow, follow_params)
            except BaseException:
                raw.rollback()
                raise
            self._run(raw, "COMMIT", ())
            return rows

        return self._guarded(run_sqlite)

    def _guarded(self, run: Callable[[Any], list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
        """``run(raw connection)``, noting whether a failure was an outage (``lost``) or
        a long wait for SQLite's write lock (``contended``)."""
        try:
            raw = self._raw()
        except Exception:
            # Could not connect, or the new connection broke while being configured:
            # drop it so the next call starts afresh (never runs unconfigured).
            self.lost = True
            self.close()
            raise
        started = time.monotonic()
        try:
            rows = run(raw)
        except Exception as exc:
            self.contended = self.vendor == "sqlite" and is_lock_timeout(exc)
            if (
                getattr(raw, "broken", False)
                or getattr(raw, "closed", False)
                or (self.vendor == "mysql" and mysql_disconnect(exc))
            ):
                self.lost = True
                self.close()
            else:
                self.lost = False
                if self.vendor == "postgresql" and pooler.note_pooler_error(exc, self.alias):
                    self.close()  # its prepared statements are not where it thinks
            raise
        self.lost = False
        self.contended = self.vendor == "sqlite" and time.monotonic() - started >= SQLITE_LOCK_WAIT
        return rows

    def _run(
        self, raw: Any, sql: str, params: Mapping[str, Any] | Sequence[Any]
    ) -> list[tuple[Any, ...]]:
        if self.vendor == "postgresql":
            from psycopg import ClientCursor, Cursor, RawCursor

            if self._local is None:
                with Cursor(raw) as cursor:
                    cursor.execute(sql, params)
                    return list(cursor.fetchall()) if cursor.description else []
            # Through a pooler, the settings and the statement in one implicit
            # transaction, one round trip. Not prepared: one query of two statements,
            # bound client-side (as Django binds by default), costs the client about
            # what the statement alone does; a pipeline costs more than the statement.
            if raw.prepare_threshold is None:
                with ClientCursor(raw) as cursor:
                    cursor.execute(self._local_prefix + sql, params)
                    cursor.nextset()
                    return list(cursor.fetchall()) if cursor.description else []
            # Prepared (a pooler that keeps prepared statements): pipelined, no Sync
            # between them.
            with RawCursor(raw) as setup, Cursor(raw) as cursor:
                with raw.pipeline():
                    setup.execute(*self._local)
                    cursor.execute(sql, params)
                return list(cursor.fetchall()) if cursor.description else []
        if self.vendor == "mysql":
            from . import mysql_script

            return mysql_script.run(raw, sql, params)
        in_style = self._sqlite_cache.get(sql)
        if in_style is None:
            in_style = self._sqlite_cache[sql] = sqlite_sql(sql)
        cursor = raw.cursor()
        try:
            cursor.execute(in_style, params)
            return list(cursor.fetchall())
        finally:
            cursor.close()

    def notify(self, table: str) -> None:
        """Wake the workers of ``table`` (see ``notify``); nothing off PostgreSQL."""
        from .notify import CHANNEL, NOTIFY_SQL, enabled

        if enabled(self.alias):
            self.execute(NOTIFY_SQL, {"channel": CHANNEL, "table": table})

    def close(self) -> None:
        wrapper, self._wrapper = self._wrapper, None
        if wrapper is not None:
            try:
                wrapper.close()
            except Exception:  # a dead connection may fail to close; it is gone either way
                logger.debug("closing the %s connection failed", self.role, exc_info=True)


class Connections:
    """The private connections of one role (a thread of the worker, the resetter),
    one per database alias, each opened on first use.

    A thread that owns one binds it (``bind``): what else runs in that thread and
    asks for ``Connections.of_thread`` (the resetter in the dispatcher's thread, the
    statistics in the writer's) then shares its connections instead of opening more.
    """

    _bound = threading.local()

    def __init__(self, role: str) -> None:
        self.role = role
        self._by_alias: dict[str, Connection] = {}

    def __call__(self, alias: str) -> Connection:
        conn = self._by_alias.get(alias)
        if conn is None:
            conn = self._by_alias[alias] = Connection(alias, self.role)
        return conn

    def __iter__(self) -> Iterator[Connection]:
        return iter(list(self._by_alias.values()))

    @contextlib.contextmanager
    def bind(self) -> Iterator[Connections]:
        """Within: the calling thread's connections are these."""
        previous = getattr(self._bound, "connections", None)
        self._bound.connections = self
        try:
            yield self
        finally:
            self._bound.connections = previous

    @classmethod
    def of_thread(cls, own: Connections) -> Connections:
        """The connections the calling thread bound, or ``own`` when it bound none."""
        bound: Connections | None = getattr(cls._bound, "connections", None)
        return own if bound is None else bound

    def close(self) -> None:
        for conn in self:
            conn.close()
        self._by_alias.clear()
