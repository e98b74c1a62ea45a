"""Executors: where attempts run. One per lane.

The seam between claiming jobs and running them: a lane hands each claimed
attempt to ``submit()`` and learns nothing more of it from the executor (the
attempt reports through its callbacks). ``ThreadExecutor`` runs each attempt
in one of ``size`` handler threads; an asyncio executor (async handlers on an
event loop) will sit beside it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from queue import SimpleQueue
from typing import TYPE_CHECKING, Protocol

from django.db import connections

from ..exceptions import WorkerStartError

if TYPE_CHECKING:
    from .attempt import Attempt

logger = logging.getLogger("django_dbworker.lane")


class Executor(Protocol):
    def start(self) -> None: ...
    def submit(self, attempt: Attempt) -> None: ...
    def stop(self) -> None: ...
    def join(self, timeout: float) -> None: ...


#: What wakes a handler thread to run the calls handed to ``call_soon``.
_CALLS = object()


class ThreadExecutor:
    """``size`` handler threads taking attempts from one queue, in claim order, and
    the calls handed to ``call_soon`` (a ``post_handle`` once its outcome is written).

    A call does not wake a thread of its own: a thread that finishes an attempt runs
    the calls waiting before it takes its next attempt, and one thread at a time is
    woken for them; while calls are left, the thread running them wakes one more
    (so slow calls spread over the threads, and a burst of quick ones costs a
    wake-up or two instead of one each: a thread's wake-up costs about as much as a
    no-op job)."""

    def __init__(self, name: str, size: int, run: Callable[[Attempt], None]) -> None:
        self.name = name
        self.size = size
        self._run = run
        self._queue: SimpleQueue[Attempt | object | None] = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._calls: deque[Callable[[], None]] = deque()
        self._calls_lock = threading.Lock()
        #: A wake-up for the calls is in the queue, no thread has taken it yet.
        self._woken = False
        self._stopped = False

    def start(self) -> None:
        """Start the threads (once: lanes on a shared pool share them);
        ``WorkerStartError`` if the machine cannot."""
        if self._threads:
            return
        for i in range(self.size):
            try:
                thread = threading.Thread(
                    target=self._main, name=f"dbworker-{self.name}-{i}", daemon=True
                )
                thread.start()
            # "can't start new thread"; or, with the address space nearly all mapped,
            # no memory left for the thread's own objects.
            except (RuntimeError, MemoryError) as exc:
                self.stop()
                raise WorkerStartError(
                    f"{self.name}: could only start {i} of {self.size} handler threads "
                    f"({exc or type(exc).__name__}); lower num_handlers (--num-handlers)"
                ) from None
            self._threads.append(thread)

    def submit(self, attempt: Attempt) -> None:
        self._queue.put(attempt)

    def call_soon(self, call: Callable[[], None]) -> None:
        """Run ``call()`` in a handler thread, after the calls handed over before it."""
        with self._calls_lock:
            self._calls.append(call)
            if self._woken:
                return
            self._woken = True
        self._queue.put(_CALLS)

    def stop(self) -> None:
        """Each thread ends once it has finished what it runs and what is queued (asked
        once, however many lanes share the threads)."""
        if self._stopped:
            return
        self._stopped = True
        for _ in self._threads:
            self._queue.put(None)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0))

    def _main(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                if item is _CALLS:
                    with self._calls_lock:
                        self._woken = False
                else:
                    try:
                        self._run(item)  # type: ignore[arg-type]
                    except BaseException:
                        # The attempt's outcome was handed over already. A hook that
                        # raised SystemExit (or a bug of ours) must not cost the worker
                        # this thread: without it, claimed jobs would wait here forever.
                        logger.exception(
                            "job %s: error after an attempt; the handler thread carries on",
                            item.label,  # type: ignore[attr-defined]
                        )
                self._run_calls()
        finally:
            self._run_calls()
            connections.close_all()

    def _run_calls(self) -> None:
        """Run the calls waiting until none is; while more wait, one more thread is
        woken to help."""
        if not self._calls:
            # Read without the lock (each attempt passes here): a call appended after
            # this read has a wake-up in the queue for it (``_woken``).
            return
        while True:
            with self._calls_lock:
                if not self._calls:
                    return
                call = self._calls.popleft()
                helper = bool(self._calls) and not self._woken
                if helper:
                    self._woken = True
            if helper:
                self._queue.put(_CALLS)
            try:
                call()
            except BaseException:
                logger.exception("%s: error in a call after an attempt", self.name)


class InlineExecutor:
    """Runs each attempt at once, in the thread that claims it (the testing helpers)."""

    def __init__(self, run: Callable[[Attempt], None]) -> None:
        self._run = run

    def start(self) -> None:
        pass

    def submit(self, attempt: Attempt) -> None:
        self._run(attempt)

    def stop(self) -> None:
        pass

    def join(self, timeout: float) -> None:
        pass
