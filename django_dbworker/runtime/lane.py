"""A lane: one handler inside a worker process. It claims that handler's jobs, holds
them until their outcome is written, and hands them to its executor."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import InterfaceError, OperationalError, connections, models, router

from ..exceptions import CancelReason
from ..handler import Handler, seconds
from ..sql import superseding
from ..sql.connection import Runner
from ..sql.jobs import statements_for
from ..states import JobState
from .attempt import Attempt
from .claim import Claimer
from .execution import Execution
from .executor import Executor, ThreadExecutor
from .logs import extra
from .loop import AsyncioExecutor
from .outcome import Outcome, failure_message
from .pool import Pool

logger = logging.getLogger("django_dbworker.lane")


@dataclasses.dataclass(frozen=True)
class LaneCallbacks:
    """What a lane may ask of the worker that runs it (it never holds the worker)."""

    #: Write an attempt's outcome, or (None) its changed execution log.
    submit: Callable[[Attempt, Outcome | None], None]
    #: A handler thread is free again: the dispatcher may claim.
    slot_free: Callable[[Lane], None]
    #: An outcome of the lane was written (or refused) and its job let go.
    released: Callable[[Lane], None]
    #: Ids of a model that any lane of this process holds.
    held_ids: Callable[[type[models.Model]], list[Any]]
    #: Whether this process holds a job the resetter brought back.
    holds_reset_job: Callable[[], bool]
    #: Whether outcomes are still being written (the writer thread is alive).
    writing: Callable[[], bool]
    #: A claim took these jobs in this many seconds (dispatcher thread).
    claimed: Callable[[Lane, list[Any], float], None] = lambda lane, jobs, seconds: None
    #: An attempt begins, and ends (the thread that runs it).
    started: Callable[[Attempt], None] = lambda attempt: None
    ended: Callable[[Attempt], None] = lambda attempt: None


class Lane:
    def __init__(
        self,
        handler: Handler,
        worker_id: str,
        callbacks: LaneCallbacks,
        executor: Callable[[Callable[[Attempt], None]], Executor] | None = None,
        pool: Pool | None = None,
    ) -> None:
        """``executor`` builds the executor from the function that runs an attempt (by
        default ``num_handlers`` threads). ``pool``: the process's shared pool, whose
        threads (``executor``) this lane shares with the others unless its ``handle``
        is ``async def``; its ``num_handlers`` is then its ceiling in the pool."""
        assert handler.model is not None
        self.handler = handler
        self.worker_id = worker_id
        self.callbacks = callbacks
        self.model: type[models.Model] = handler.model
        self.label = handler.get_name()
        self.alias = router.db_for_write(self.model)
        self.stmts = statements_for(self.model, connections[self.alias].vendor, self.alias)
        self.order_by = self.stmts.order_by(handler.ordering)
        self.pool = pool
        self.num_handlers = (
            handler.num_handlers if pool is None else handler.pool_ceiling(pool.size)
        )
        self.weight = handler.weight
        self.pre_dequeue = handler.uses_pre_dequeue()
        self.prefetch = 0 if self.pre_dequeue else handler.prefetch
        self.table = self.model._meta.db_table
        self.interval = seconds(handler.interval) or 1.0
        self.max_interval = seconds(handler.max_interval) or 5 * self.interval
        #: The current idle delay: ``interval``, doubled by each empty claim.
        self.idle_interval = self.interval
        #: Wake-up notifications received for this lane's table (see runtime.listener).
        self.notifications = 0
        self.heartbeat_interval = seconds(handler.heartbeat_interval) or 1.0
        self.max_runtime = seconds(handler.maximum_runtime_per_job)
        self.max_runtime_grace = seconds(handler.maximum_runtime_grace) or 0.0
        self.runtime_per_job = type(handler).maximum_runtime is not Handler.maximum_runtime
        self.stalled_max_age = seconds(handler.stalled_max_age) or 30.0
        self.lock = threading.Lock()
        #: Claimed jobs whose outcome is not written yet (heartbeated, never re-claimed).
        self.held: dict[Any, Attempt] = {}
        #: How many of them the resetter brought back (``holds_reset_job``).
        self.resets_held = 0
        #: Attempts handed to the executor and not finished.
        self.busy = 0
        #: Of those, attempts written off past their maximum runtime whose handler has
        #: not returned yet (``runtime.overtime``): they keep their slots, and nothing
        #: waits for them.
        self.abandoned = 0
        #: Finished attempts whose ``post_handle`` waits for its turn in a handler thread.
        self.posting = 0
        #: With ``pre_dequeue``: attempts whose ``pre_handle`` has not run yet. No claim
        #: is made meanwhile, so each ``pre_dequeue`` sees what every earlier job took in
        #: its ``pre_handle`` (a budget holds across the claims).
        self.starting = 0
        self.claimed = 0
        self.releases = 0
        self.next_claim_at = 0.0
        #: When the last claim began (monotonic): the heartbeat of the jobs it took.
        self.claim_began = 0.0
        self.drained = False
        self.claimer = Claimer(self)
        #: A claim's connection broke before its reply came back: the claim may have
        #: committed, leaving rows of ours that no lane holds (see ``requeue_unheld``).
        self.unanswered = False
        #: ``async def handle``: its attempts run as coroutines on an event loop.
        self.asynchronous = executor is None and inspect.iscoroutinefunction(handler.handle)
        self.execution = Execution(self)
        if self.asynchronous:
            self.executor: Executor = AsyncioExecutor(
                self.label, self.num_handlers, self.execution.run_async
            )
        elif executor is None:
            self.executor = ThreadExecutor(self.label, self.num_handlers, self.execution.run)
        else:
            self.executor = executor(self.execution.run)
        if isinstance(self.executor, ThreadExecutor):
            # A thread does not wait for the outcome to be written: post_handle is
            # handed back to the threads once it is.
            self.execution.post_later = self.executor.call_soon

    def job_label(self, pk: Any) -> str:
        return f"{self.model._meta.label}:{pk}"

    def max_runtime_of(self, job: Any) -> float | None:
        """``Handler.maximum_runtime(job)``, called only when the handler overrides it."""
        if self.runtime_per_job:
            return self.handler.maximum_runtime(job)
        return self.max_runtime

    # -- what attempts report --------------------------------------------------------

    def submit(self, attempt: Attempt, outcome: Outcome | None) -> None:
        self.callbacks.submit(attempt, outcome)

    def logs_changed(self, attempt: Attempt) -> None:
        """The execution log of ``attempt`` changed: the writer writes it at once."""
        self.callbacks.submit(attempt, None)

    def started(self, attempt: Attempt) -> None:
        """``pre_handle`` of ``attempt`` is done (or will never run)."""
        if not attempt.starting:  # once false it stays so: no lock needed to see it
            return
        with self.lock:
            counted, attempt.starting = attempt.starting, False
            if counted:
                self.starting -= 1
        self.callbacks.slot_free(self)

    def post_later(self) -> None:
        """A finished attempt's ``post_handle`` will run once its outcome is written."""
        with self.lock:
            self.posting += 1

    def post_done(self) -> None:
        """A deferred ``post_handle`` ended. Its slot was freed when its attempt ended:
        the dispatcher is woken only when this may change what it does (the last one
        ended: --burst and --max-jobs wait for it; ``pre_dequeue`` may allow more)."""
        with self.lock:
            self.posting -= 1
            last = self.posting == 0
        if last or self.pre_dequeue:
            self.callbacks.slot_free(self)

    def slot_free(self) -> None:
        """An executor slot finished its attempt (and its post_handle, unless deferred)."""
        with self.lock:
            self.busy -= 1
            busy = self.busy
        # Wake the dispatcher only when it may claim again: while prefetched jobs still
        # wait for a thread it would not. A slot of a shared pool may go to any lane.
        if busy < self.num_handlers or self.pool is not None:
            self.callbacks.slot_free(self)

    def wait_written(self, attempt: Attempt) -> None:
        while not attempt.wait_written(1.0):
            if not self.callbacks.writing():
                return

    async def wait_written_async(self, attempt: Attempt) -> None:
        """``wait_written`` for a coroutine: the event loop runs on meanwhile."""
        written = attempt.written_future()
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(written), 1.0)
                return
            except TimeoutError:
                if not self.callbacks.writing():
                    return

    def release(self, *attempts: Attempt) -> None:
        """The outcomes of ``attempts`` are written (or refused): stop holding their
        jobs."""
        held = self.held
        with self.lock:
            for attempt in attempts:
                if held.get(attempt.pk) is attempt:
                    del held[attempt.pk]
                    if attempt.was_reset:
                        self.resets_held -= 1
        self.callbacks.released(self)

    # -- slots -----------------------------------------------------------------------

    def free_slots(self) -> int:
        """How many jobs to claim now: 0 while every handler thread has a job, else the
        free threads plus ``prefetch``."""
        if self.busy >= self.num_handlers or self.starting:
            return 0
        return self.num_handlers + self.prefetch - self.busy

    def running(self) -> list[Attempt]:
        with self.lock:
            return [a for a in self.held.values() if not a.finished]

    def holds_reset_job(self) -> bool:
        """Whether this lane holds a job the resetter brought back: from its claim until
        its outcome is written, not only while it runs. A crash before that write resets
        it again, so for the quarantine it is still running."""
        return self.resets_held > 0

    def has_unfinished(self) -> bool:
        """Whether a job of this handler is still to run: queued (also for later),
        running, or errored with retries left (``runworker --until-done``)."""
        handler = self.handler
        retried = models.Q(state=JobState.ERRORED, num_failures__lte=handler.max_num_retries)
        rows = self.model._base_manager.using(self.alias).filter(
            models.Q(state__in=(JobState.QUEUED, JobState.PROCESSING)) | retried
        )
        if handler.dequeue_filter is not None:
            rows = rows.filter(handler.dequeue_filter)
        return rows.exists()

    # -- claims ----------------------------------------------------------------------

    def claim(self, conn: Runner, limit: int) -> int:
        """Claim up to ``limit`` jobs and hand them to the executor; return how many rows
        the claim took (some may have ended at once: unloadable, cancelled)."""
        if self.unanswered:
            self.requeue_unheld(conn)
        conditions = self.claimer.conditions(conn)
        if conditions is None:  # pre_dequeue: not now
            return 0
        where, params = conditions
        if self.pre_dequeue:
            limit = 1
        # Quarantine: a job the resetter brought back may be what crashed its worker,
        # so a process holds at most one such job at a time (until its outcome is
        # written). A crash then takes each neighbour down with it once at most,
        # instead of every time it runs.
        may_take_reset = not self.callbacks.holds_reset_job()
        # Never an id any lane of this process holds: the fence is the worker id, so two
        # lanes of one process must never hold one job (after a reset, say) at once.
        held = self.callbacks.held_ids(self.model)
        began = self.claim_began = time.monotonic()
        params = {
            **params,
            "worker": self.worker_id,
            "max_retries": self.handler.max_num_retries,
            "held": self.stmts.ids_param(held),
            "limit": limit,
        }
        try:
            rows = self.claimer.run(conn, where, params, limit, fresh_only=not may_take_reset)
        except Exception:
            # A connection that broke (a pooler or a server restarting) may have taken
            # the reply of a claim that committed with it.
            self.unanswered = self.unanswered or conn.lost
            raise
        if not rows:
            return 0
        # From here on the rows are ours: whatever fails, each one is held and gets an
        # outcome, or it would sit in processing until the resetter took it.
        jobs = self._build(rows)
        if jobs and self.handler.uses_custom_queryset():
            jobs = self._reload(conn, jobs)
        keep, give_back = [], []
        for job in jobs:
            if job.num_resets > 0:
                if not may_take_reset:
                    give_back.append(job)
                    continue
                may_take_reset = False
            keep.append(job)
        if give_back:
            # Before any job of this batch starts: the reset job kept may crash the
            # process at once, and the others must not be reset again with it.
            self._give_back(conn, give_back, "given back: this worker runs a reset job")
        self.callbacks.claimed(self, keep, time.monotonic() - began)
        self._dispatch(keep)
        return len(rows)

    def _build(self, rows: list[tuple[Any, ...]]) -> list[Any]:
        rows_ = self.stmts.rows
        wrapper = connections[self.alias]
        plain = rows_.plain_instances()
        jobs = []
        for row in rows:
            try:
                jobs.append(rows_.build_row(row, self.alias, wrapper, plain))
            except Exception as exc:
                self._unloadable(rows_.key(row[rows_.pk_index]), exc)
        if not self.stmts.dialect.ordered_claims:
            jobs = rows_.sort(jobs, self.handler.ordering)
        return jobs

    def _reload(self, conn: Runner, jobs: list[Any]) -> list[Any]:
        """Fetch claimed rows through the handler's queryset (eager loading), from the
        database they were claimed on (never a read replica a router would pick).

        Should the database fail here, the jobs go back to the queue unrun; should
        ``get_queryset()`` itself be broken, their attempts error (retried as usual).
        """
        try:
            queryset = self.handler.get_queryset().using(self.alias)
            loaded = queryset.in_bulk([job.pk for job in jobs])
        except (OperationalError, InterfaceError) as exc:
            logger.warning(
                "%s: loading claimed jobs through get_queryset() failed (%s); giving them back",
                self.label,
                exc,
            )
            self._give_back(conn, jobs, "given back unrun: the database failed loading it")
            return []
        except Exception as exc:
            logger.exception("%s: get_queryset() raised", self.label)
            for job in jobs:
                self._fail_unrun(
                    job.pk, exc, failure_message(exc, prefix="get_queryset() raised: ")
                )
            return []
        result = []
        for job in jobs:
            if job.pk in loaded:
                result.append(loaded[job.pk])
            else:
                logger.warning(
                    "%s: get_queryset() does not return claimed job %s; handling the plain row",
                    self.label,
                    job.pk,
                )
                result.append(job)
        return result

    def _hold(self, job: Any) -> Attempt:
        attempt = Attempt(job, self)
        with self.lock:
            self._held(attempt)
        return attempt

    def _held(self, attempt: Attempt) -> None:
        """Hold ``attempt``'s job (the caller holds ``lock``)."""
        self.held[attempt.pk] = attempt
        if attempt.job.num_resets > 0:
            attempt.was_reset = True  # as claimed: a hook may change the job's fields
            self.resets_held += 1

    def _dispatch(self, jobs: list[Any]) -> None:
        """Hold the claimed ``jobs`` and hand them to the executor (one lock for all)."""
        attempts = [Attempt(job, self) for job in jobs]
        run = [attempt for attempt in attempts if not attempt.job.cancel]
        with self.lock:
            for attempt in attempts:
                self._held(attempt)
            self.busy += len(run)
            if self.pre_dequeue:
                self.starting += len(run)
                for attempt in run:
                    attempt.starting = True
        self.claimed += len(attempts)
        if len(run) < len(attempts):
            for attempt in attempts:
                if attempt.job.cancel:
                    attempt.cancel_reason = CancelReason.CANCELED
                    attempt.finished = True
                    self.submit(attempt, Outcome.canceled("canceled before it started"))
        submit = self.executor.submit
        for attempt in run:
            submit(attempt)

    def _unloadable(self, pk: Any, error: Exception) -> None:
        """A claimed row that cannot be turned into a model instance (a column its field
        cannot convert): the attempt errors at once, like a handler that raised."""
        logger.error(
            "job %s: its row could not be loaded: %s: %s",
            self.job_label(pk),
            type(error).__name__,
            error,
            extra=extra("unloadable", worker=self.worker_id, job=pk, handler=self.label),
        )
        self._fail_unrun(pk, error, failure_message(error, prefix="could not load the job row: "))

    def _fail_unrun(self, pk: Any, error: BaseException, message: str) -> None:
        """Error a claimed job before any hook ran (counted as a failure)."""
        attempt = self._hold(self.model(pk=pk))  # a stand-in: only the key is known
        attempt.finished = True
        self.claimed += 1
        handler = self.handler
        retry = Outcome.errored(error, message, handler.retry_delay(1), handler.max_num_retries)
        self.submit(attempt, retry)

    def requeue_unheld(self, conn: Runner) -> None:
        """Requeue, unrun, the rows of this worker that no lane of the process holds: a
        claim whose reply was lost. Left alone, they would wait for the resetter (and
        spend a reset each)."""
        message = "requeued unrun: the reply of the claim that took it was lost"
        notes: dict[Any, str] = {}
        held = self.callbacks.held_ids(self.model)
        states = superseding.requeue_unheld(conn, self.stmts, self.worker_id, held, message, notes)
        self.unanswered = False
        for pk in states:
            logger.info(
                "job %s: %s",
                self.job_label(pk),
                notes.get(pk, message),
                extra=extra("given_back", worker=self.worker_id, job=pk, handler=self.label),
            )

    def _give_back(self, conn: Runner, jobs: list[Any], message: str) -> None:
        """Requeue claimed jobs without running them, now; through the writer (held, and
        retried) if that fails."""
        ids = [job.pk for job in jobs]
        try:
            # (A job whose waiting-only key another job holds meanwhile is superseded.)
            notes: dict[Any, str] = {}
            states = superseding.requeue(conn, self.stmts, ids, self.worker_id, message, notes)
        except Exception as exc:
            logger.warning("%s: could not give back jobs %s now (%s)", self.label, ids, exc)
            states = {}
        done = set(states)
        for job in jobs:
            if job.pk in done:
                logger.info(
                    "job %s: %s",
                    self.job_label(job.pk),
                    notes.get(job.pk, message),
                    extra=extra(
                        "given_back", worker=self.worker_id, job=job.pk, handler=self.label
                    ),
                )
                continue
            attempt = self._hold(job)  # locked by another transaction, or a failure
            attempt.finished = True
            self.submit(attempt, Outcome.requeued(message))
