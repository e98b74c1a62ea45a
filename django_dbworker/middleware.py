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

The innermost callable runs the attempt's phases: ``pre_handle``, ``handle`` and the
complete phase. Each factory is called once per handler when a worker starts, like
Django calls its middleware once.

Phase middleware wraps one phase only, as Queuert's ``wrapPrepare``/``wrapHandler``/
``wrapComplete`` do: an entry (a class, instantiated once without arguments, or an
object) with any of ``wrap_prepare``, ``wrap_handle``, ``wrap_complete`` (and
``wrap_attempt``, the classic wrap of the whole attempt), each a factory as above::

    class Tenant:
        def wrap_prepare(self, next_call):
            def middleware(job, attempt):
                attempt.context["tenant"] = load_tenant(job)   # the handler reads it
                return next_call(job, attempt)
            return middleware

        def wrap_complete(self, next_call):     # inside the completion's transaction
            def middleware(job, attempt):
                AuditEntry.objects.create(job_id=job.pk, result=attempt.returned)
                return next_call(job, attempt)
            return middleware

*prepare* wraps ``pre_handle``; *handle* wraps ``handle``; *complete* runs after
``handle`` returned (``attempt.returned``) and wraps ``complete()`` and, for a
transactional handler, the write of the completion, inside its transaction
(docs/transactions.md). ``attempt.context`` (a dict, one per attempt) carries what a
middleware hands to the handler (``self.attempt.context``) and to the later phases.

Async handlers (``async def handle``) run on an event loop, and so does their onion. As
in Django, a factory marked ``async_capable = True`` is given an async ``next_call``
and must return an ``async def`` callable there (it can tell with
``asyncio.iscoroutinefunction(next_call)``); a plain factory keeps working, its
callable run in a thread of the loop's pool with ``next_call`` adapted for it. Each
attempt then holds a thread for its whole length, which caps the attempts in flight at
the pool's size: mark middleware that async handlers use ``async_capable``.
"""

from __future__ import annotations

import dataclasses
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


#: The phases phase middleware may wrap (``wrap_<phase>``).
PHASES = ("prepare", "handle", "complete")


@dataclasses.dataclass
class Phases:
    """The factories of each wrap, outermost first: ``attempt`` (the classic onion)
    and one list per phase."""

    attempt: list[Middleware] = dataclasses.field(default_factory=list)
    prepare: list[Middleware] = dataclasses.field(default_factory=list)
    handle: list[Middleware] = dataclasses.field(default_factory=list)
    complete: list[Middleware] = dataclasses.field(default_factory=list)


def split(factories: Sequence[Any]) -> Phases:
    """``factories`` (``load``'s) sorted by what they wrap: phase middleware (an entry
    with ``wrap_prepare``, ``wrap_handle``, ``wrap_complete`` or ``wrap_attempt``;
    a class is instantiated once) into its phases, the others around the attempt."""
    phases = Phases()
    names = ("attempt", *PHASES)
    for entry in factories:
        if not any(hasattr(entry, f"wrap_{name}") for name in names):
            phases.attempt.append(entry)
            continue
        instance = entry() if isinstance(entry, type) else entry
        for name in names:
            method = getattr(instance, f"wrap_{name}", None)
            if method is None:
                continue
            if not callable(method):
                raise TypeError(f"middleware {entry!r}: wrap_{name} is not callable")
            getattr(phases, name).append(_factory(method, instance))
    return phases


def _factory(method: Any, instance: Any) -> Middleware:
    """A bound ``wrap_<phase>`` as a factory, ``async_capable`` if it or its object is."""

    def factory(next_call: Call) -> Call:
        return method(next_call)  # type: ignore[no-any-return]

    factory.async_capable = bool(  # type: ignore[attr-defined]
        getattr(method, "async_capable", False) or getattr(instance, "async_capable", False)
    )
    factory.__qualname__ = getattr(method, "__qualname__", repr(method))
    return factory


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
