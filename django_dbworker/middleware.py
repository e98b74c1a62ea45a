"""Middleware around each attempt: an onion, in the style of Django's.

A middleware is a factory that takes the next callable and returns a callable of
``(job, attempt)``; what it returns is the attempt's result, what it raises is the
attempt's error. It may run code before and after ``next(job, attempt)``, or not call
it at all (a short circuit). ``DBWORKER["MIDDLEWARE"]`` (outermost first) wraps every
handler's attempts, ``Handler.middleware`` one handler's, inside the global ones::

    def timing(next_call):
        def middleware(job, attempt):
            started = time.monotonic()
            try:
                return next_call(job, attempt)
            finally:
                metrics.observe(attempt.lane.label, time.monotonic() - started)
        return middleware

The innermost callable runs ``pre_handle`` and ``handle``. Each factory is called once
per handler when a worker starts, like Django calls its middleware once.

Async handlers (``async def handle``) run on an event loop, and so does their onion. As
in Django, a factory marked ``async_capable = True`` is given an async ``next_call``
and must return an ``async def`` callable there (it can tell with
``asyncio.iscoroutinefunction(next_call)``); a plain factory keeps working, its
callable run in a thread of the loop's pool with ``next_call`` adapted for it. Each
attempt then holds a thread for its whole length, which caps the attempts in flight at
the pool's size: mark middleware that async handlers use ``async_capable``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync, sync_to_async
from django.db import close_old_connections
from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from .runtime.attempt import Attempt

#: What each layer calls: the next layer, and at the centre the handler's hooks.
Call = Callable[[Any, "Attempt"], Any]
Middleware = Callable[[Call], Call]
AsyncCall = Callable[[Any, "Attempt"], Awaitable[Any]]


def load(entries: Sequence[str | Middleware]) -> list[Middleware]:
    """The factories ``entries`` name (dotted paths) or are; ``ImportError`` or
    ``TypeError`` says which entry is wrong."""
    factories = []
    for entry in entries:
        factory = import_string(entry) if isinstance(entry, str) else entry
        if not callable(factory):
            raise TypeError(f"middleware {entry!r} is not callable")
        factories.append(factory)
    return factories


def chain(factories: Sequence[Middleware], inner: Call) -> Call:
    """``inner`` wrapped by ``factories``, the first outermost."""
    for factory in reversed(factories):
        inner = factory(inner)
        if not callable(inner):
            raise TypeError(f"middleware {factory!r} returned {inner!r}, not a callable")
    return inner


def chain_async(factories: Sequence[Middleware], inner: AsyncCall) -> AsyncCall:
    """``chain`` for an async centre: ``async_capable`` factories wrap it as they are,
    the others through asgiref's adapters."""
    call: Any = inner
    for factory in reversed(factories):
        if getattr(factory, "async_capable", False):
            call = factory(call)
            if not inspect.iscoroutinefunction(call):
                raise TypeError(
                    f"middleware {factory!r} is async_capable but returned {call!r}, "
                    "not an async def callable, for an async handler"
                )
        else:
            wrapped = factory(async_to_sync(call))
            if not callable(wrapped):
                raise TypeError(f"middleware {factory!r} returned {wrapped!r}, not a callable")
            call = sync_to_async(_in_pool_thread(wrapped), thread_sensitive=False)
    return call  # type: ignore[no-any-return]


def _in_pool_thread(call: Call) -> Call:
    """``call`` for a pool thread: its Django connections closed after each attempt
    as after a request (the threads outlive attempts, and failovers)."""

    def run(job: Any, attempt: Attempt) -> Any:
        try:
            return call(job, attempt)
        finally:
            close_old_connections()

    return run
