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
import os
import threading
import time
from typing import Any

from django.db import router
from django.db.models import Model

from ..exceptions import WaitTimeout
from ._hub import GONE, IDLE_CLOSE, LISTENING_POLL, Hub, _Waiter
from ._link import CHANNEL, POLL, SESSION_NAME

__all__ = [
    "CHANNEL",
    "IDLE_CLOSE",
    "LISTENING_POLL",
    "POLL",
    "SESSION_NAME",
    "Hub",
    "await_for",
    "hub",
    "wait_for",
]

_instance: Hub | None = None
_hub_lock = threading.Lock()


def hub() -> Hub:
    """This process's hub (one for every waiter)."""
    global _instance
    with _hub_lock:
        # A forked child (a pre-forking web server) gets a hub of its own: the
        # parent's thread did not follow it.
        if _instance is None or _instance.pid != os.getpid():
            _instance = Hub()
        return _instance


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
    """The state a wait ended with, or its error (``timeout``: as the caller asked)."""
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


def wait_for(job: Model, timeout: float | None = None, asked: float | None = None) -> str:
    """Block until ``job`` is completed, failed or canceled: the state it took.
    ``WaitTimeout`` past ``timeout`` seconds (its message says ``asked``, when given);
    ``DoesNotExist`` if it was deleted."""
    _check_timeout(timeout)
    model, alias = _where(job)
    waiter = _Waiter(job.pk)
    the_hub = hub()
    the_hub.add(model, alias, waiter)
    assert waiter.event is not None
    if not waiter.event.wait(timeout):
        the_hub.discard(model, alias, waiter)
    return _ended(model, job.pk, waiter.state, timeout if asked is None else asked)


async def await_for(job: Model, timeout: float | None = None, asked: float | None = None) -> str:
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
    return _ended(model, job.pk, state, timeout if asked is None else asked)


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (monotonic; None: no limit), at least 0."""
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def deadline_of(timeout: float | None) -> float | None:
    _check_timeout(timeout)
    return None if timeout is None else time.monotonic() + timeout
