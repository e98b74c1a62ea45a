"""Waiting for jobs to finish: ``job.wait()``, ``await job.await_done()``, and the
``django.tasks`` results' ``wait()`` / ``await_done()``.

Every waiter of a process shares one hub: a thread with one connection per database
it waits on (its own, outside Django's per-thread connections), started by the first
waiter and closed a few seconds after the last one is done. A thousand waiters cost
that one connection, not a thousand.

- The hub reads the state of every job waited on in a table with one statement
  (``JobStatements.states_of``): at once for the jobs of new waiters, then at each
  poll and each wake-up. A job in a final state (completed, failed, canceled)
  releases its waiters; a job gone (deleted) makes them raise ``DoesNotExist``.
  Nothing else is read: a waiter reads the row it gets back itself
  (``refresh_from_db``), on its own connection.
- On PostgreSQL the hub's connection also LISTENs on ``dbworker_done``: a worker's
  writer sends ``pg_notify('dbworker_done', <table>)`` after each statement that ended
  jobs there (one per group of completions), so a waiter wakes a moment after the
  outcome commits, and the hub polls only every ``LISTENING_POLL`` seconds for what
  no worker writes (the resetter's failures, an operator's cancel, a row deleted).
  Workers send it only while some process waits: they look every ``PROBE_EVERY``
  seconds for a session named ``dbworker waiting`` in ``pg_stat_activity`` (the hub's
  ``application_name``), so a fresh hub is polled for at first. LISTEN needs a
  session of its own: behind a pooler the hub LISTENs through
  ``DBWORKER["LISTEN_DATABASE"]`` (as workers do), and without it polls.
- On SQLite and MariaDB (or with ``DBWORKER["NOTIFY"] = False``) it polls every
  ``POLL`` seconds.

The hub never takes a lock and never writes: a waiter survives its job's worker
being killed and the job reset; it returns when some attempt ends the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import threading
import time
from typing import Any

from django.db import connections, router
from django.db.models import Model

from .exceptions import WaitTimeout
from .sql.connection import Connection
from .sql.jobs import JobStatements, statements_for
from .sql.notify import enabled, listen_alias, listen_alias_set
from .states import FINAL_STATES

logger = logging.getLogger("django_dbworker.waiting")

#: The channel of the outcome NOTIFYs (payload: the job table's name).
CHANNEL = "dbworker_done"
#: The hub's ``application_name``: what workers look for before they NOTIFY.
SESSION_NAME = "dbworker waiting"
#: Seconds between two polls without LISTEN (SQLite, MariaDB, a pooler).
POLL = 0.25
#: Seconds between two polls while LISTENing: for outcomes no worker NOTIFYs.
LISTENING_POLL = 1.0
#: Seconds the hub keeps its connections after its last waiter is done.
IDLE_CLOSE = 5.0
#: Keys per statement of a poll.
CHUNK = 5000
#: Seconds before the hub connects again after a failure.
RETRY = 1.0

_FINAL = frozenset(str(state) for state in FINAL_STATES)
#: What a waiter of a deleted job is released with.
GONE = ""


class _Waiter:
    __slots__ = ("event", "future", "loop", "pk", "state")

    def __init__(self, pk: Any, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.pk = pk
        self.state: str | None = None
        self.loop = loop
        self.event = threading.Event() if loop is None else None
        self.future: asyncio.Future[str] | None = loop.create_future() if loop else None

    def release(self, state: str) -> None:
        self.state = state
        if self.event is not None:
            self.event.set()
        elif self.loop is not None and self.future is not None:
            with contextlib.suppress(RuntimeError):  # its loop closed: no one waits
                self.loop.call_soon_threadsafe(_settle, self.future, state)


def _settle(future: asyncio.Future[str], state: str) -> None:
    if not future.done():
        future.set_result(state)


class _Table:
    """The waiters of one job table on one database."""

    def __init__(self, alias: str, model: type[Model]) -> None:
        self.alias = alias
        self.model = model
        self.name = model._meta.db_table
        self.stmts: JobStatements = statements_for(model, connections[alias].vendor, alias)
        self.waiters: dict[Any, list[_Waiter]] = {}
        #: Read now: new waiters, or a NOTIFY named it.
        self.due = True
        self.poll_at = 0.0


class _Link:
    """The hub's connection to one database, LISTENing where it can."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.listening = False
        self.conn: Connection | None = None
        self.failed_at = 0.0

    def connect(self) -> Connection:
        if self.conn is not None:
            return self.conn
        through = self.alias
        listen = enabled(self.alias)
        if listen:
            through = listen_alias(self.alias)
        conn = Connection(through, "waiting")
        try:
            if listen:
                raw = conn._raw()
                if conn.pooled and not listen_alias_set(self.alias):
                    _say_once(
                        f"waiting on database {self.alias!r} polls every {POLL:g}s: it is "
                        "reached through a connection pooler, and LISTEN needs a session of "
                        "its own (set DBWORKER['LISTEN_DATABASE'])"
                    )
                else:
                    with raw.cursor() as cursor:
                        cursor.execute(f"SET application_name = '{SESSION_NAME}'")
                        cursor.execute(f"LISTEN {CHANNEL}")
                    self.listening = True
            else:
                conn.execute("SELECT 1")
        except Exception:
            conn.close()
            self.listening = False
            raise
        self.conn = conn
        return conn

    def fileno(self) -> int | None:
        if not self.listening or self.conn is None or self.conn._wrapper is None:
            return None
        raw = self.conn._wrapper.connection
        return None if raw is None else int(raw.fileno())

    def notified(self) -> set[str]:
        """The tables named by the NOTIFYs that arrived (non-blocking)."""
        if not self.listening or self.conn is None or self.conn._wrapper is None:
            return set()
        raw = self.conn._wrapper.connection
        return {note.payload for note in raw.notifies(timeout=0)}

    def close(self) -> None:
        conn, self.conn = self.conn, None
        self.listening = False
        if conn is not None:
            conn.close()


_said: set[str] = set()


def _say_once(text: str) -> None:
    if text not in _said:
        _said.add(text)
        logger.warning(text, extra={"action": "waiting_polls"})


class Hub:
    """The waiters of this process, and the thread that releases them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[tuple[str, type[Model]], _Table] = {}
        self._links: dict[str, _Link] = {}
        self._thread: threading.Thread | None = None
        self._stop = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    # -- waiters' side ---------------------------------------------------------------

    def add(self, model: type[Model], alias: str, waiter: _Waiter) -> None:
        with self._lock:
            key = (alias, model)
            table = self._tables.get(key)
            if table is None:
                table = self._tables[key] = _Table(alias, model)
            table.waiters.setdefault(waiter.pk, []).append(waiter)
            table.due = True
            if self._thread is None:
                # Not "dbworker-…": it is no worker's thread, and lives on between workers.
                self._thread = threading.Thread(
                    target=self._run, name="dbworker.waiting", daemon=True
                )
                self._thread.start()
        self._wake()

    def discard(self, model: type[Model], alias: str, waiter: _Waiter) -> None:
        with self._lock:
            table = self._tables.get((alias, model))
            waiting = table.waiters.get(waiter.pk) if table else None
            if table is not None and waiting is not None and waiter in waiting:
                waiting.remove(waiter)
                if not waiting:
                    del table.waiters[waiter.pk]

    def close(self, timeout: float = 10.0) -> None:
        """Release every waiter (they time out at once) and end the thread, closing its
        connections (tests, before their database is dropped). A later waiter starts
        it again."""
        with self._lock:
            thread = self._thread
            self._stop = True
        self._wake()
        if thread is not None:
            thread.join(timeout)
        with self._lock:
            self._stop = False

    def waiters(self) -> int:
        with self._lock:
            return sum(len(w) for t in self._tables.values() for w in t.waiters.values())

    def _wake(self) -> None:
        # A full pipe: the hub has wake-ups to read already.
        with contextlib.suppress(BlockingIOError):
            os.write(self._write, b"w")

    # -- the hub's thread ------------------------------------------------------------

    def _run(self) -> None:
        idle_since: float | None = None
        try:
            while True:
                now = time.monotonic()
                with self._lock:
                    busy = [t for t in self._tables.values() if t.waiters]
                    if self._stop:
                        self._thread = None
                        self._drop_all()
                        return
                    if busy:
                        idle_since = None
                    elif idle_since is None:
                        idle_since = now
                    elif now - idle_since >= IDLE_CLOSE:
                        self._thread = None
                        self._tables.clear()
                        return
                    due = [t for t in busy if t.due or t.poll_at <= now]
                    for table in due:
                        table.due = False
                for table in due:
                    self._check(table, now)
                if self._notified():
                    continue
                self._sleep(busy, idle_since)
        except Exception:
            logger.exception("the waiting hub stopped", extra={"action": "waiting_failed"})
            with self._lock:
                self._thread = None
        finally:
            self._close()

    def _sleep(self, busy: list[_Table], idle_since: float | None) -> None:
        now = time.monotonic()
        ends = [t.poll_at for t in busy]
        if idle_since is not None:
            ends.append(idle_since + IDLE_CLOSE)
        timeout = max(min(ends, default=now + IDLE_CLOSE) - now, 0.0)
        fds = [self._read] + [fd for link in self._links.values() if (fd := link.fileno())]
        try:
            select.select(fds, [], [], timeout)
        except (OSError, ValueError):  # a connection closed under us: read again
            time.sleep(min(timeout, 0.05))
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass

    def _notified(self) -> bool:
        """Mark the tables NOTIFYs named as due; whether any."""
        marked = False
        for alias, link in list(self._links.items()):
            try:
                names = link.notified()
            except Exception:
                logger.debug("reading notifications failed", exc_info=True)
                link.close()
                continue
            if not names:
                continue
            with self._lock:
                for table in self._tables.values():
                    if table.alias == alias and table.name in names and table.waiters:
                        table.due = marked = True
        return marked

    def _check(self, table: _Table, now: float) -> None:
        """One statement per ``CHUNK`` waited jobs: release those that ended."""
        link = self._links.get(table.alias)
        if link is None:
            link = self._links[table.alias] = _Link(table.alias)
        if link.conn is None and now - link.failed_at < RETRY:
            table.poll_at = link.failed_at + RETRY
            return
        with self._lock:
            keys = list(table.waiters)
        stmts = table.stmts
        try:
            conn = link.connect()
            for start in range(0, len(keys), CHUNK):
                chunk = keys[start : start + CHUNK]
                rows = conn.execute(stmts.states_of, {"ids": stmts.ids_param(chunk)})
                found = {stmts.key(key): state for key, state in rows}
                self._release(table, chunk, found)
        except Exception as exc:
            logger.warning(
                "waiting: reading the jobs of %s failed (%s); trying again in %gs",
                table.name,
                exc,
                RETRY,
                extra={"action": "waiting_failed"},
            )
            link.close()
            link.failed_at = time.monotonic()
            table.poll_at = link.failed_at + RETRY
            return
        table.poll_at = time.monotonic() + (LISTENING_POLL if link.listening else POLL)

    def _release(self, table: _Table, keys: list[Any], found: dict[Any, str]) -> None:
        released: list[tuple[_Waiter, str]] = []
        with self._lock:
            for pk in keys:
                state = found.get(pk, GONE)
                if state != GONE and state not in _FINAL:
                    continue
                released += [(w, state) for w in table.waiters.pop(pk, [])]
        for waiter, state in released:
            waiter.release(state)

    def _drop_all(self) -> None:
        """(Lock held.) Every waiter gives up (as on its timeout)."""
        for table in self._tables.values():
            for waiters in table.waiters.values():
                for waiter in waiters:
                    waiter.state = None
                    if waiter.event is not None:
                        waiter.event.set()
                    elif waiter.loop is not None and waiter.future is not None:
                        with contextlib.suppress(RuntimeError):
                            waiter.loop.call_soon_threadsafe(waiter.future.cancel)
        self._tables.clear()

    def _close(self) -> None:
        links, self._links = self._links, {}
        for link in links.values():
            link.close()


_hub: Hub | None = None
_hub_lock = threading.Lock()


def hub() -> Hub:
    """This process's hub (one for every waiter)."""
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = Hub()
        return _hub


def _where(job: Model) -> tuple[type[Model], str]:
    model = type(job)
    model = model._meta.concrete_model or model
    if job.pk is None:
        raise ValueError(f"{model.__name__}.wait(): the job has no primary key (not saved)")
    alias = job._state.db or router.db_for_write(model, instance=job)
    return model, alias


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and (isinstance(timeout, bool) or not timeout >= 0):
        raise ValueError(f"timeout must be None or a number of seconds >= 0, not {timeout!r}")


def _ended(model: type[Model], pk: Any, state: str | None, timeout: float | None) -> str:
    if state is None:
        within = "before the hub closed" if timeout is None else f"within {timeout:g}s"
        raise WaitTimeout(
            f"{model.__name__} {pk} did not finish {within} "
            "(it is not completed, failed or canceled)"
        )
    if state == GONE:
        raise model.DoesNotExist(  # type: ignore[attr-defined]
            f"{model.__name__} {pk} does not exist for the waiting hub: deleted, or not "
            "committed yet (a wait inside the transaction that enqueued it sees nothing)"
        )
    return state


def wait_for(job: Model, timeout: float | None = None) -> str:
    """Block until ``job`` is completed, failed or canceled: the state it took.
    ``WaitTimeout`` past ``timeout`` seconds; ``DoesNotExist`` if it was deleted."""
    _check_timeout(timeout)
    model, alias = _where(job)
    waiter = _Waiter(job.pk)
    the_hub = hub()
    the_hub.add(model, alias, waiter)
    assert waiter.event is not None
    if not waiter.event.wait(timeout):
        the_hub.discard(model, alias, waiter)
    return _ended(model, job.pk, waiter.state, timeout)


async def await_for(job: Model, timeout: float | None = None) -> str:
    """``wait_for`` for coroutines: the event loop is never blocked."""
    _check_timeout(timeout)
    model, alias = _where(job)
    waiter = _Waiter(job.pk, asyncio.get_running_loop())
    assert waiter.future is not None
    the_hub = hub()
    the_hub.add(model, alias, waiter)
    state: str | None = None
    try:
        state = await asyncio.wait_for(waiter.future, timeout)
    except TimeoutError:
        pass
    finally:
        if state is None:  # timed out, or the caller was cancelled
            the_hub.discard(model, alias, waiter)
    return _ended(model, job.pk, state, timeout)
