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


class ThreadExecutor:
    """``size`` handler threads taking attempts from one queue, in claim order, and
    the calls handed to ``call_soon`` (a ``post_handle`` once its outcome is written)."""

    def __init__(self, name: str, size: int, run: Callable[[Attempt], None]) -> None:
        self.name = name
        self.size = size
        self._run = run
        self._queue: SimpleQueue[Attempt | Callable[[], None] | None] = SimpleQueue()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the threads; ``WorkerStartError`` if the machine cannot."""
        for i in range(self.size):
            thread = threading.Thread(
                target=self._main, name=f"dbworker-{self.name}-{i}", daemon=True
            )
            try:
                thread.start()
            except RuntimeError as exc:  # "can't start new thread"
                self.stop()
                raise WorkerStartError(
                    f"{self.name}: could only start {i} of {self.size} handler threads "
                    f"({exc}); lower num_handlers (--num-handlers)"
                ) from None
            self._threads.append(thread)

    def submit(self, attempt: Attempt) -> None:
        self._queue.put(attempt)

    def call_soon(self, call: Callable[[], None]) -> None:
        """Run ``call()`` in a handler thread, after what is queued already."""
        self._queue.put(call)

    def stop(self) -> None:
        """Each thread ends once it has finished what it runs and what is queued."""
        for _ in self._threads:
            self._queue.put(None)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0))

    def _main(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                try:
                    if callable(item):
                        item()
                    else:
                        self._run(item)
                except BaseException:
                    # The attempt's outcome was handed over already. A hook that raised
                    # SystemExit (or a bug of ours) must not cost the worker this thread:
                    # without it, claimed jobs would wait here forever.
                    logger.exception(
                        "%s: error after an attempt; the handler thread carries on",
                        self.name if callable(item) else f"job {item.label}",
                    )
        finally:
            connections.close_all()


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
