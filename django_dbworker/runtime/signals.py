"""Process signal handlers a worker or a supervisor installs, and gives back."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

logger = logging.getLogger("django_dbworker.worker")

Handler = Callable[[int, FrameType | None], None]

#: SIGTERM/SIGINT that arrived while ``runworker`` started (checks, waiting for the
#: database, the metrics server), before the worker or supervisor had its handlers.
_early: list[int] = []


#: Seconds after a first SIGTERM/SIGINT within which another one is a copy of it, not
#: a second request (which stops the running jobs instead of draining them). Copies
#: come milliseconds apart: a process manager or ``kill`` signals the whole process
#: group (or cgroup) and the supervisor forwards it too, ``timeout -s INT`` signals
#: the command and then its group, a terminal's Ctrl-C reaches a parent and a child.
REPEAT_WINDOW = 1.0


class StopRequests:
    """Tells a second stop request (a second Ctrl-C: stop the jobs now) from a copy of
    the first one that arrived by another way within ``REPEAT_WINDOW``."""

    def __init__(self, window: float = REPEAT_WINDOW) -> None:
        self.window = window
        self.first_at: float | None = None

    def is_copy(self, signum: int, who: str, log: logging.Logger = logger) -> bool:
        """Note a stop signal; whether it is a copy of the first one (within the
        window), which ``who`` (``worker …``, ``supervisor``) then logs."""
        now = time.monotonic()
        if self.first_at is None:
            self.first_at = now
            return False
        since = now - self.first_at
        if since >= self.window:
            return False
        log.info(
            "%s: %s received %.0f ms after the first signal: the same stop (sent again "
            "after %gs, it stops the running jobs)",
            who,
            signal.Signals(signum).name,
            since * 1000,
            self.window,
        )
        return True


def hold_early_signals() -> SignalHandlers:
    """From a command's start until a worker or supervisor installs its own handlers:
    SIGTERM and SIGINT are noted instead of ending the process by their default action
    (or a ``KeyboardInterrupt`` traceback), and handed over by ``take_early_signals()``.
    Restore the returned handlers when the command ends."""
    _early.clear()  # a signal an earlier command of this process never took
    held = SignalHandlers()
    held.install(
        lambda signum, frame: _early.append(signum),  # no lock: safe in a signal handler
        (signal.SIGTERM, signal.SIGINT),
        in_thread=False,
    )
    return held


def early_signal() -> int | None:
    """The first signal held since the command started, if any (not taken)."""
    return _early[0] if _early else None


def take_early_signals() -> list[int]:
    """The signals held since the command started (once: they are forgotten)."""
    taken = list(_early)
    _early.clear()
    return taken


class SignalHandlers:
    """Installs ``handler`` for some signals and restores the previous handlers (tests
    run several workers in one process). Only from the main thread: elsewhere (a worker
    embedded in a thread) nothing is installed.

    With ``in_thread`` (the default) ``handler`` runs in a relay thread, not in the
    interrupted main thread: a Python signal handler runs between two bytecodes of
    whatever the main thread was doing, so one that sets a ``threading.Event`` or logs
    deadlocks when the main thread held that event's lock (inside ``Event.wait``) or the
    log stream's. The signal handler proper only writes the signal number to a pipe.
    """

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self._pipe: tuple[int, int] | None = None
        self._relay: threading.Thread | None = None

    def install(
        self,
        handler: Handler,
        signals: Iterable[signal.Signals],
        *,
        unless_ignored: Iterable[signal.Signals] = (),
        in_thread: bool = True,
    ) -> None:
        """``unless_ignored``: signals left ignored if they were (``nohup``)."""
        if threading.current_thread() is not threading.main_thread():
            logger.debug("not in the main thread: signal handlers not installed")
            return
        installed: Handler = handler
        if in_thread:
            read_end, write_end = os.pipe()
            os.set_blocking(write_end, False)
            self._pipe = (read_end, write_end)
            self._relay = threading.Thread(
                target=_relay, args=(read_end, handler), name="dbworker-signals", daemon=True
            )
            self._relay.start()

            def installed(signum: int, frame: FrameType | None) -> None:
                with contextlib.suppress(OSError):  # a full pipe: signals already wait
                    os.write(write_end, bytes([signum]))

        keep = set(unless_ignored)
        for sig in signals:
            if sig in keep and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            self._previous[sig] = signal.signal(sig, installed)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        if self._pipe is not None:
            read_end, write_end = self._pipe
            os.close(write_end)  # the relay reads end-of-file and returns
            if self._relay is not None:
                self._relay.join(timeout=5)
            os.close(read_end)
            self._pipe = self._relay = None


def _relay(read_end: int, handler: Handler) -> None:
    while data := os.read(read_end, 64):
        for signum in data:
            try:
                handler(signum, None)
            except Exception:
                logger.exception("signal handler failed")
