"""The asyncio executor: the attempts of an ``async def handle`` run as coroutines on
one event loop (a thread of its own), up to ``num_handlers`` of them at once.

No handler thread per job: a job waiting on I/O costs a coroutine, so thousands can
be in flight. Sync work the attempt does (sync hooks, Django's async ORM) goes
through asgiref's ``sync_to_async`` to its one shared thread, whose Django
connections this executor looks after between jobs (failovers, pools, max age).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections

from ..exceptions import WorkerStartError
from ..sql.orm import orm_used

if TYPE_CHECKING:
    from .attempt import Attempt

logger = logging.getLogger("django_dbworker.lane")

#: Seconds between two looks at the Django connections of asgiref's sync thread while
#: no attempt has used the ORM there.
RECYCLE_INTERVAL = 1.0


def _recycle() -> bool:
    """Between attempts, as at the end of a request (the threaded path does the same
    after each job): a connection past ``CONN_MAX_AGE`` (0: every time) is closed, a
    pooled one given back, a broken one closed, so a failover never fails the next
    attempt. Whether the ORM is used in this thread at all."""
    if not orm_used():
        return False
    close_old_connections()
    return True


def _close() -> None:
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


recycle_sync_thread = sync_to_async(_recycle, thread_sensitive=True)
#: When the loop ends: a stopping worker leaves no connection open behind it (the
#: thread is the process's: another loop's next call opens a new one).
close_sync_thread = sync_to_async(_close, thread_sensitive=True)


class AsyncioExecutor:
    """One event-loop thread running each submitted attempt as a task."""

    def __init__(self, name: str, size: int, run: Callable[[Attempt], Awaitable[None]]) -> None:
        self.name = name
        self.size = size
        self._run = run
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        # Submissions wait here; one ``call_soon_threadsafe`` takes a whole batch.
        self._pending: collections.deque[Attempt] = collections.deque()
        self._scheduled = False
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._recycle_due = 0.0
        self._recycling = False
        #: Attempts use the ORM in the sync thread: look after it after each attempt.
        self._orm = False

    # -- from other threads ------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._main, name=f"dbworker-{self.name}-loop", daemon=True
        )
        try:
            self._thread.start()
        except RuntimeError as exc:
            raise WorkerStartError(f"{self.name}: could not start its event loop ({exc})") from None
        self._ready.wait()

    def submit(self, attempt: Attempt) -> None:
        self._pending.append(attempt)
        if not self._scheduled:
            self._scheduled = True
            self._call(self._take)

    def stop(self) -> None:
        """The loop ends once what runs and what is submitted has finished."""
        self._call(self._stop)

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _call(self, callback: Callable[[], None]) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile: nothing runs
                loop.call_soon_threadsafe(callback)

    # -- on the loop ---------------------------------------------------------------------

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._ready.set()
        try:
            loop.run_forever()
            if self._tasks:  # only after a forced end: cancel what is left
                for task in self._tasks:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
            loop.run_until_complete(close_sync_thread())
            loop.run_until_complete(loop.shutdown_asyncgens())
        except BaseException:
            logger.exception("%s: the event loop failed", self.name)
        finally:
            loop.close()
            connections.close_all()

    def _take(self) -> None:
        self._scheduled = False  # before taking: a submit after this schedules again
        pending = self._pending
        while pending:
            attempt = pending.popleft()
            task = asyncio.ensure_future(self._guarded(attempt))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    async def _guarded(self, attempt: Attempt) -> None:
        try:
            await self._run(attempt)
        except BaseException:
            # The outcome was handed over already (see ThreadExecutor._main).
            logger.exception(
                "job %s: error after the attempt; the event loop carries on", attempt.label
            )

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        now = time.monotonic()
        if not self._recycling and (self._orm or now >= self._recycle_due):
            # After attempts that use the ORM (one pass for all that end meanwhile: it
            # is one thread for every coroutine), else once a second to find out.
            self._recycling = True
            self._recycle_due = now + RECYCLE_INTERVAL
            recycle = asyncio.ensure_future(recycle_sync_thread())
            recycle.add_done_callback(self._recycled)
        elif self._stopping and not self._tasks and not self._pending:
            self._finish()

    def _recycled(self, future: asyncio.Future[Any]) -> None:
        self._recycling = False
        error = None if future.cancelled() else future.exception()
        if error is not None:
            logger.warning("%s: looking after connections failed: %s", self.name, error)
        elif not future.cancelled():
            self._orm = bool(future.result())
        if self._stopping and not self._tasks and not self._pending:
            self._finish()

    def _stop(self) -> None:
        self._stopping = True
        if not self._tasks and not self._pending and not self._recycling:
            self._finish()

    def _finish(self) -> None:
        assert self._loop is not None
        self._loop.stop()
