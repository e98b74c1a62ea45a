"""``runworker --processes N``: N worker processes under one supervisor.

Threads only overlap I/O; to use several cores a machine runs several worker
processes. The supervisor starts N children, each a plain ``runworker`` with the
same options (and its own worker id), and:

- forwards SIGTERM/SIGINT: the first makes every child drain, a second makes
  them stop their jobs now. A second one within ``REPEAT_WINDOW`` (1 s) of the first
  is a copy of it (a process manager that signals the process group, or the cgroup,
  and then the supervisor; ``timeout``) and is not forwarded; a child, signalled both
  directly and by the supervisor, tells the same. Children run in their own
  session, so a Ctrl-C in a terminal reaches only the supervisor, which forwards
  it once. A signal that arrives while a child is being started reaches
  it too, once it exists.
- treats SIGHUP (the terminal went away) as SIGTERM, unless SIGHUP was ignored
  when it started (``nohup``): children in their own session get no SIGHUP of
  their own and would otherwise run on, orphaned, after the supervisor died.
- never leaves a child behind: after a signal it waits for every child, and
  kills what is still running ``grace`` seconds later (logged). Only a supervisor
  killed with SIGKILL leaves its children running (they are not in its process
  group): stop it with SIGTERM, or let the service manager kill the whole
  cgroup (systemd's default) or container.
- restarts a child that crashed (non-zero exit or killed) while not stopping,
  after a delay that grows on repeated crashes (1 s doubling to 30 s; back to
  1 s once a child ran for a minute). A child that exits 0 (``--burst``,
  ``--max-jobs``, ``--max-time``) is done and not restarted.

It exits when every child has: 0 if each one's last exit was 0, else 1 (with one
child: its own exit code).

The same supervisor, with one child, serves two more cases:

- a ``runworker`` in the foreground of a terminal: the terminal sends Ctrl-C to its
  whole foreground process group, which would include the processes handlers start
  (``git clone``) and kill them in the middle of the jobs the drain means to finish.
  The child and everything it starts live in a session of their own; the supervisor
  forwards the Ctrl-C (``restart=False``: a child that exits ends it, with its code);
- ``runworker --reload``: ``watch`` says when a file changed; the child is then
  drained (SIGTERM) and started again, and a child that exits on its own (a syntax
  error) is started again at the next change; with ``--burst`` or ``--until-done``
  (``finishes``) a child that fails ends the supervisor with its exit code instead.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType

from .signals import SignalHandlers, StopRequests, take_early_signals

logger = logging.getLogger("django_dbworker.supervisor")

#: Restart delays for a crashing child: first, cap, and how long a run must last
#: to count as healthy (the delay then starts over).
RESTART_DELAY = 1.0
RESTART_DELAY_MAX = 30.0
HEALTHY_RUN = 60.0
POLL = 0.1
#: Seconds between two looks for changed files (``--reload``).
WATCH_EVERY = 1.0
#: Set in the environment of a supervisor's worker processes.
CHILD = "DBWORKER_SUPERVISED"


@dataclass
class Child:
    slot: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restart_at: float | None = None
    delay: float = RESTART_DELAY
    code: int | None = None  # the last exit code once done
    signalled: int = 0  # how many of the supervisor's signals it was sent
    killed: bool = False
    reloading: bool = False  # drained for a reload: started again once it exits


class Supervisor:
    """Runs ``command`` (a runworker command line) ``processes`` times over.

    ``grace`` bounds how long children get after the first signal before they are
    killed (the command's shutdown timeout plus a margin).
    """

    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        grace: float,
        env: dict[str, str] | None = None,
        install_signal_handlers: bool = True,
        on_exit: Callable[[int], None] | None = None,
        restart: bool = True,
        watch: Callable[[], str | None] | None = None,
        finishes: bool = False,
    ) -> None:
        """``on_exit(pid)``: a worker process ended (it may be restarted). ``restart``:
        start a crashed child again. ``watch()``: the path of a file that changed since
        the last call, if any (``--reload``). ``finishes``: the children end on their
        own (``--burst``, ``--until-done``), so with ``watch`` a child that fails ends
        the supervisor, with its exit code, instead of waiting for a change."""
        self.command = list(command)
        self.on_exit = on_exit
        self.restart = restart
        self.watch = watch
        self.finishes = finishes
        self._watched_at = 0.0
        self.children = [Child(slot) for slot in range(processes)]
        self.grace = grace
        self.env = env
        self.install_signal_handlers = install_signal_handlers
        self.received: list[int] = []  # signals to forward, in order
        self.kill_at: float | None = None
        self._signals = SignalHandlers()
        self._stop_requests = StopRequests()  # a signal's copies are not forwarded

    @property
    def signals(self) -> int:
        return len(self.received)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Forward ``signum`` to every child; the first call starts the grace period."""
        self.received.append(signum)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace
        for child in self.children:
            child.restart_at = None
            self._forward(child)

    def _forward(self, child: Child) -> None:
        """Send ``child`` the signals it has not had yet (one may have arrived while
        it was being started, before ``child.proc`` was set)."""
        if child.proc is None or child.proc.poll() is not None:
            return
        while child.signalled < len(self.received):
            child.proc.send_signal(self.received[child.signalled])
            child.signalled += 1

    def run(self) -> int:
        if self.install_signal_handlers:
            self._signals.install(
                self._on_signal,
                (signal.SIGTERM, signal.SIGINT, signal.SIGHUP),
                unless_ignored=(signal.SIGHUP,),  # nohup: keep ignoring it
                in_thread=False,  # the main loop forwards signals: no second forwarder
            )
            for signum in take_early_signals()[:1]:  # sent while it started: start none
                self._on_signal(signum, None)
        try:
            for child in self.children:
                if self.signals:
                    child.code = 0  # stopped before it started: nothing failed
                else:
                    self._start(child)
            while any(
                c.proc is not None or c.restart_at is not None or self._waits_for_change(c)
                for c in self.children
            ):
                self._tick(time.monotonic())
                time.sleep(POLL)
        finally:
            self._signals.restore()
        codes = [child.code for child in self.children]
        logger.info("supervisor: all %d worker processes exited (%s)", len(codes), codes)
        if len(codes) == 1 and codes[0] is not None and codes[0] >= 0:
            return codes[0]
        return 0 if all(code == 0 for code in codes) else 1

    def _tick(self, now: float) -> None:
        if self.watch is not None and not self.signals and now - self._watched_at >= WATCH_EVERY:
            self._watched_at = now
            changed = self.watch()
            if changed is not None:
                self._reload(changed)
        for child in self.children:
            if child.proc is not None:
                code = child.proc.poll()
                if code is not None:
                    self._exited(child, code, now)
                    continue
                self._forward(child)
                if self.kill_at is not None and now > self.kill_at and not child.killed:
                    logger.error(
                        "supervisor: worker process %d did not stop within %gs; killing it",
                        child.proc.pid,
                        self.grace,
                    )
                    child.proc.kill()
                    child.killed = True
            elif child.restart_at is not None and now >= child.restart_at and not self.signals:
                self._start(child)

    def _reload(self, changed: str) -> None:
        """A file changed: drain every child, to start it again once it exits."""
        logger.info("supervisor: %s changed; restarting the worker process", changed)
        for child in self.children:
            if child.proc is None:
                self._start(child)  # it had exited: waiting for this change
            elif not child.reloading and child.proc.poll() is None:
                child.reloading = True
                child.proc.send_signal(signal.SIGTERM)

    def _exited(self, child: Child, code: int, now: float) -> None:
        assert child.proc is not None
        pid, child.proc, child.code = child.proc.pid, None, code
        if self.on_exit is not None:
            self.on_exit(pid)
        if self.signals and code in (-signal.SIGTERM, -signal.SIGINT):
            # Our signal arrived before the child installed its handlers: it was still
            # starting and held no job.
            child.code = 0
        if child.reloading and not self.signals:
            self._start(child)
            return
        if self.watch is not None and code != 0 and not self.signals and self.finishes:
            logger.error(
                "supervisor: worker process %d exited with %d; not waiting for a file to "
                "change (--burst/--until-done)",
                pid,
                code,
            )
            return
        if self.watch is not None and code != 0 and not self.signals:
            logger.info(
                "supervisor: worker process %d exited with %d; waiting for a file to change",
                pid,
                code,
            )
            child.code = None  # not done: started again at the next change
            return
        if code == 0 or self.signals or not self.restart:
            logger.info("supervisor: worker process %d exited with %d", pid, code)
            return
        if now - child.started >= HEALTHY_RUN:
            child.delay = RESTART_DELAY
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        logger.error(
            "supervisor: worker process %d %s; restarting it in %.0fs", pid, how, child.delay
        )
        child.restart_at = now + child.delay
        child.delay = min(child.delay * 2, RESTART_DELAY_MAX)

    def _start(self, child: Child) -> None:
        child.restart_at = None
        child.code = None
        child.signalled = 0
        child.killed = False
        child.reloading = False
        child.started = time.monotonic()
        child.proc = subprocess.Popen(self.command, env=self.env, start_new_session=True)
        logger.info(
            "supervisor: started worker process %d (%d of %d)",
            child.proc.pid,
            child.slot + 1,
            len(self.children),
        )

    def _waits_for_change(self, child: Child) -> bool:
        """``--reload``: an exited child is started again at the next change."""
        return self.watch is not None and not self.signals and child.code is None

    # -- signals ---------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._stop_requests.is_copy(signum, "supervisor", logger) and self.signals:
            return  # not forwarded: each worker would take it for a second request
        action = "draining" if not self.signals else "stopping their jobs now"
        logger.info("supervisor: %s received; worker processes are %s", name, action)
        self.stop(signal.SIGTERM if signum == signal.SIGHUP else signum)


def child_command(args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one child ``runworker`` with ``args``.

    The child runs ``python -m django`` with the settings module this process
    uses (whether it came from ``DJANGO_SETTINGS_MODULE`` or ``--settings``) and
    this process's import path, so it finds the same project.
    """
    from django.conf import settings

    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = settings.SETTINGS_MODULE
    env[CHILD] = "1"
    paths = [p or os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return [sys.executable, "-m", "django", "runworker", *args], env


def in_terminal_foreground() -> bool:
    """Whether this process is in the foreground process group of the terminal on its
    standard input (what a Ctrl-C there reaches), and not a supervisor's child."""
    if os.environ.get(CHILD):
        return False
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def changed_files() -> Callable[[], str | None]:
    """A ``watch`` for ``Supervisor``: the Python files Django's autoreloader watches
    (those of the modules this process imported, and the ``autoreload_started``
    receivers' globs), compared with their last modification times."""
    from django.utils import autoreload

    reloader = autoreload.StatReloader()
    seen = dict(reloader.snapshot_files())

    def watch() -> str | None:
        nonlocal seen
        now = dict(reloader.snapshot_files())
        changed = next((str(p) for p, t in now.items() if seen.get(p) not in (None, t)), None)
        seen = now
        return changed

    return watch
