"""Testing your handlers and tasks: run queued jobs here and now, assert what was enqueued.

``run_jobs(handler)`` runs the queued jobs of a handler synchronously, in the
test's own thread, connection and transaction, so it works inside Django's
``TestCase`` (and pytest-django's ``db`` fixture) on SQLite and PostgreSQL:
``self.attempt`` works, errors are retried (those due at once, or all with
``retries="now"``), outcomes and execution logs are written exactly as a worker
writes them, and the test's rollback takes everything away. ``run_tasks()``
does the same for the tasks of ``django.tasks`` (the ``django_dbworker.tasks``
app). ``enqueued()`` and ``assert_enqueued()`` tell what is waiting.

With pytest (and pytest-django), the ``dbworker`` fixture offers the same:
``dbworker.run(handler)``, ``dbworker.run_tasks()``, ``dbworker.enqueued(...)``
(django_dbworker.pytest_plugin, installed as a pytest plugin). See docs/testing.md.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Iterable
from typing import Any

from django.db import models, router

from .handler import Handler
from .models import WorkerJob
from .runtime.attempt import Attempt
from .runtime.completer import Completer
from .runtime.executor import InlineExecutor
from .runtime.lane import Lane, LaneCallbacks
from .runtime.outcome import Outcome
from .runtime.stager import stage_due
from .sql.django_connection import DjangoConnection
from .states import DEQUEUEABLE_STATES, JobState

__all__ = ["JobRun", "assert_enqueued", "enqueued", "run_jobs", "run_tasks"]


@dataclasses.dataclass
class JobRun:
    """What ``run_jobs`` did: the primary keys of the jobs, by the state they ended in
    (a job retried and then completed is in ``completed`` only)."""

    attempts: int = 0
    states: dict[Any, str] = dataclasses.field(default_factory=dict)

    def _with(self, state: str) -> list[Any]:
        return [pk for pk, s in self.states.items() if s == state]

    @property
    def completed(self) -> list[Any]:
        return self._with(JobState.COMPLETED)

    @property
    def failed(self) -> list[Any]:
        return self._with(JobState.FAILED)

    @property
    def errored(self) -> list[Any]:
        """Waiting for a retry that is not due yet (``retries="due"``)."""
        return self._with(JobState.ERRORED)

    @property
    def canceled(self) -> list[Any]:
        return self._with(JobState.CANCELED)

    @property
    def snoozed(self) -> list[Any]:
        """Snoozed (``raise Snooze``) and waiting for their time: queued again."""
        return self._with(JobState.QUEUED)


class _Inline:
    """A lane whose attempts run at once in this thread and write through the test's
    own connection."""

    def __init__(self, handler: Handler, report: JobRun) -> None:
        assert handler.model is not None
        self.worker_id = f"test:{os.getpid()}:{secrets.token_hex(3)}"
        self.completer = Completer(self.worker_id)
        self.report = report
        callbacks = LaneCallbacks(
            submit=self._submit,
            slot_free=lambda lane: None,
            released=lambda lane: None,
            held_ids=lambda model: list(self.lane.held),
            holds_reset_job=lambda: False,
            writing=lambda: True,
        )
        self.lane = Lane(handler, self.worker_id, callbacks, executor=InlineExecutor)
        self.lane.execution.recycle = False  # the caller's connection, in its transaction
        # One job at a time, each done before the next claim: concurrency limits hold
        # anyway, and a rate limit would only stop the run early.
        self.lane.claimer.limits = None
        self.conn = DjangoConnection(self.lane.alias)

    def _submit(self, attempt: Attempt, outcome: Outcome | None) -> None:
        lane, conn = self.lane, self.conn
        if attempt.logs_pending or outcome is None:
            self.completer.write_logs(conn, lane, attempt)
        if outcome is None:
            return
        if attempt.progress is not None:  # the last check-in, as a worker keeps it
            self.completer.write_progress(conn, lane, [attempt])
        written = self.completer.write(conn, lane, outcome.kind, [(attempt, outcome)])
        state = written.states.get(attempt.pk)
        self.report.attempts += 1
        self.report.states[attempt.pk] = state or "lost"
        attempt.mark_written(state)
        lane.release(attempt)


def run_jobs(
    handler: Handler | type[Handler],
    *,
    retries: str = "due",
    limit: int | None = None,
    **options: Any,
) -> JobRun:
    """Run the queued jobs of ``handler`` (an instance, or a class with ``options``)
    until none is claimable, in this thread and transaction.

    ``retries="due"`` retries an errored job when its ``retry_after`` has passed (at
    once with ``retry_after = 0``); ``retries="now"`` retries it at once, whatever the
    delay, until its budget is spent. Jobs scheduled for later (``process_after``) wait,
    as they would for a worker. ``limit``: stop after that many attempts.
    """
    if retries not in ("due", "now"):
        raise ValueError('retries is "due" or "now"')
    if isinstance(handler, type):
        handler = handler(**options)
    report = JobRun()
    inline = _Inline(handler, report)
    model = handler.model
    assert model is not None
    while limit is None or report.attempts < limit:
        if retries == "now":
            # NULL, not Now(): on PostgreSQL the claim's now() is the test transaction's
            # start, earlier than Django's Now() (the statement's).
            _queryset(handler).using(inline.lane.alias).filter(
                state=JobState.ERRORED, process_after__isnull=False
            ).update(process_after=None)
        stage_due(inline.conn, inline.lane.stmts)  # what a worker's stager would release
        if not inline.lane.claim(inline.conn, 1):
            break
    return report


def run_tasks(
    backend: str | None = None, queues: Iterable[str] | None = None, **run: Any
) -> JobRun:
    """``run_jobs`` for the tasks of ``django.tasks`` backends (all of
    ``django_dbworker.tasks.DatabaseBackend`` in ``TASKS``, or ``backend``)."""
    from .tasks.handler import task_handlers

    report = JobRun()
    for handler in task_handlers([backend] if backend else None, list(queues or []) or None):
        done = run_jobs(handler, **run)
        report.attempts += done.attempts
        report.states.update(done.states)
    return report


def _queryset(of: Any, **filters: Any) -> models.QuerySet[Any]:
    """Jobs waiting to run: of a job model (``QueuedJob``), a handler, or a task."""
    from django.apps import apps

    waiting = {"state__in": [s.value for s in DEQUEUEABLE_STATES]}
    if isinstance(of, type) and issubclass(of, WorkerJob):
        return of._base_manager.filter(**waiting, **filters)
    if isinstance(of, Handler) or (isinstance(of, type) and issubclass(of, Handler)):
        model = of.model
        assert model is not None
        queryset = model._base_manager.filter(**waiting, **filters)
        return queryset.filter(of.dequeue_filter) if of.dequeue_filter is not None else queryset
    if apps.is_installed("django_dbworker.tasks"):
        from .tasks.models import TaskJob

        path = getattr(of, "module_path", None)
        if path is not None:  # a django.tasks Task
            return TaskJob._base_manager.filter(**waiting, task_path=path, **filters)
    raise TypeError(f"enqueued() takes a job model, a handler or a task, not {of!r}")


def enqueued(of: Any, **filters: Any) -> list[Any]:
    """The jobs waiting to run (queued, or errored and to be retried) of a job model, a
    handler or a ``django.tasks`` task, oldest first, narrowed by ``filters``."""
    queryset = _queryset(of, **filters)
    return list(queryset.using(router.db_for_write(queryset.model)).order_by("pk"))


def assert_enqueued(of: Any, count: int | None = None, **filters: Any) -> list[Any]:
    """``enqueued()``, failing the test when nothing (or not ``count`` jobs) is there."""
    found = enqueued(of, **filters)
    if (count is None and not found) or (count is not None and len(found) != count):
        wanted = "some" if count is None else str(count)
        described = f" matching {filters}" if filters else ""
        raise AssertionError(
            f"expected {wanted} enqueued job(s) of {of!r}{described}, found {len(found)}"
        )
    return found
