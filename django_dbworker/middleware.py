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

The innermost callable runs ``pre_handle`` and ``handle`` (an ``async def`` one on its
own event loop, so middleware is plain code for async handlers too). Each factory is
called once per handler when a worker starts, like Django calls its middleware once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from .runtime.attempt import Attempt

#: What each layer calls: the next layer, and at the centre the handler's hooks.
Call = Callable[[Any, "Attempt"], Any]
Middleware = Callable[[Call], Call]


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
