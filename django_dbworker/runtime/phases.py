"""The centre of the middleware onion: an attempt's phases, each in its own onion.

An attempt runs three phases, as Queuert's do: *prepare* (``pre_handle``),
*handle* (``handle``) and *complete* (``complete(job, result)``, and for a
transactional handler the fenced write of the completion). Phase middleware
(``wrap_prepare``, ``wrap_handle``, ``wrap_complete``: ``django_dbworker.middleware``)
wraps one phase; classic middleware wraps them all. A transactional handler runs
*handle* and *complete* (``atomic``) or *complete* alone in one transaction on the
job's database (``runtime.atomic``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import middleware
from ..handler import Handler
from . import atomic

if TYPE_CHECKING:
    from .attempt import Attempt
    from .execution import Execution


class Phases:
    """The phases of one lane's attempts (``run``, or ``run_async`` for async handlers).
    A phase nobody asked for (no hook, no middleware) is not called at all: the default
    attempt is one call of ``handle``."""

    def __init__(self, execution: Execution, wraps: middleware.Phases) -> None:
        self.execution = execution
        handler = self.handler = execution.handler
        self.transactional = handler.transactional()
        self._uses_complete = handler.uses_complete()
        self._pre_handle = type(handler).pre_handle is not Handler.pre_handle
        #: ``is_atomic(job)`` decides job by job (the tasks backend): ask it each time.
        self._per_job = type(handler).is_atomic is not Handler.is_atomic and not (
            execution.lane.asynchronous
        )
        asynchronous = execution.lane.asynchronous
        if asynchronous and self.transactional:
            raise TypeError(
                f"{handler.get_name()}: atomic handlers and complete() need a sync handle(): "
                "Django's transactions do not work in async code (dbworker.E040)"
            )
        chain: Any = middleware.chain_async if asynchronous else middleware.chain
        sync = not asynchronous
        self.prepare: Any = None
        if self._pre_handle or wraps.prepare:
            centre = self._prepare if sync else self._prepare_async
            self.prepare = chain(wraps.prepare, centre) if wraps.prepare else centre
        handle = self._handle if sync else self._handle_async
        self.handle: Any = chain(wraps.handle, handle) if wraps.handle else handle
        self.complete: Any = None
        if self.transactional or self._per_job or self._uses_complete or wraps.complete:
            centre = self._complete if sync else self._complete_async
            self.complete = chain(wraps.complete, centre) if wraps.complete else centre

    # -- sync ------------------------------------------------------------------------

    def run(self, job: Any, attempt: Attempt) -> Any:
        """The centre of the classic onion: the phases in order."""
        if self.prepare is not None:
            try:
                self.prepare(job, attempt)
            finally:
                self.execution.lane.started(attempt)
        atomic_now = self.handler.is_atomic(job) if self._per_job else self.handler.atomic
        if not (self.transactional or atomic_now):
            result = self.handle(job, attempt)
            if self.complete is not None:
                attempt.returned = result
                self.complete(job, attempt)
            return result
        execution = self.execution
        if atomic_now:
            attempt.atomic = True
            with atomic.atomic(execution, attempt):
                result = attempt.returned = self.handle(job, attempt)
                self.complete(job, attempt)
            return result
        result = attempt.returned = self.handle(job, attempt)
        if attempt.completion is None:  # else completing() in handle() did it
            with atomic.atomic(execution, attempt):
                self.complete(job, attempt)
        return result

    def _prepare(self, job: Any, attempt: Attempt) -> Any:
        if self._pre_handle:
            return self.execution.call(attempt, self.handler.pre_handle, job)
        return None

    def _handle(self, job: Any, attempt: Attempt) -> Any:
        return self.execution.call(attempt, self.handler.handle, job)

    def _complete(self, job: Any, attempt: Attempt) -> None:
        if self._uses_complete and attempt.completion is None:  # else completing() did it
            self.execution.call(attempt, self.handler.complete, job, attempt.returned)
        if self.transactional or attempt.atomic:
            atomic.write(self.execution, attempt, attempt.returned)

    # -- async -----------------------------------------------------------------------

    async def run_async(self, job: Any, attempt: Attempt) -> Any:
        if self.prepare is not None:
            try:
                await self.prepare(job, attempt)
            finally:
                self.execution.lane.started(attempt)
        result = await self.handle(job, attempt)
        if self.complete is not None:
            attempt.returned = result
            await self.complete(job, attempt)
        return result

    async def _prepare_async(self, job: Any, attempt: Attempt) -> Any:
        if self._pre_handle:
            return await self.execution.acall(self.handler.pre_handle, job)
        return None

    async def _handle_async(self, job: Any, attempt: Attempt) -> Any:
        return await self.execution.acall(self.handler.handle, job)

    async def _complete_async(self, job: Any, attempt: Attempt) -> None:
        pass  # async handlers have no complete() (refused above): the middleware's only
