"""The waiting hub: the waiters of a process and the thread that releases them (see
``django_dbworker.waiting``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import threading
import time
from typing import Any

from django.db import connections
from django.db.models import Model

from ..sql.jobs import JobStatements, statements_for
from ..states import FINAL_STATES
from . import _link
from ._link import _Link

logger = logging.getLogger("django_dbworker.waiting")

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


class Hub:
    """The waiters of this process, and the thread that releases them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[tuple[str, type[Model]], _Table] = {}
        self._links: dict[str, _Link] = {}
        self._thread: threading.Thread | None = None
        self._stop = False
        #: The process it serves.
        self.pid = os.getpid()
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
                        self._drop_all()
                        self._end()
                        return
                    if busy:
                        idle_since = None
                    elif idle_since is None:
                        idle_since = now
                    elif now - idle_since >= IDLE_CLOSE:
                        self._tables.clear()
                        self._end()
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
                self._end()

    def _end(self) -> None:
        """(Lock held.) The thread ends: its connections close before another thread
        may start and open its own."""
        self._close()
        self._thread = None

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
        """Release the waiters a NOTIFY names with their states; mark the tables one
        names alone as due. Whether any table is due."""
        marked = False
        for alias, link in list(self._links.items()):
            try:
                payloads = link.notified()
            except Exception:
                logger.debug("reading notifications failed", exc_info=True)
                link.close()
                continue
            for text in payloads:
                name, ended = _link.parse(text)
                with self._lock:
                    tables = [
                        t
                        for t in self._tables.values()
                        if t.alias == alias and t.name == name and t.waiters
                    ]
                    if ended is None:
                        for table in tables:
                            table.due = marked = True
                if ended is None:
                    continue
                for table in tables:
                    with self._lock:
                        keys = [pk for pk in table.waiters if str(pk) in ended]
                    self._release(table, keys, {pk: ended[str(pk)] for pk in keys})
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
        table.poll_at = time.monotonic() + (LISTENING_POLL if link.listening else _link.POLL)

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
