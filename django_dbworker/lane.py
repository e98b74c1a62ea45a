"""A lane: one handler inside a worker process, with its handler threads and held jobs."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import time
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any

from django.core.exceptions import EmptyResultSet, FieldError, FullResultSet
from django.db import NotSupportedError, close_old_connections, connections, models, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from .attempt import Attempt, LogEntry, Outcome, failure_message
from .db import Connection
from .exceptions import CancelReason, JobCanceled
from .handler import Handler, seconds, set_current_attempt
from .statements import statements_for
from .states import JobState

if TYPE_CHECKING:
    from .worker import Worker

logger = logging.getLogger(__name__)

NOT_NOW = object()

#: ``opened`` is set in each thread that opened a Django database connection: only
#: those have one for ``close_old_connections`` to look at after a job (which costs
#: a fifth of a no-op job's time in the handler thread).
_orm = threading.local()


def _note_connection(sender: Any, **kwargs: Any) -> None:
    _orm.opened = True


connection_created.connect(_note_connection, dispatch_uid="django_dbworker.lane")


#: What compiling a bad ``Q`` raises (an unknown field, a lookup the database lacks):
#: a mistake in the handler, not a database failure.
FILTER_ERRORS = (FieldError, NotSupportedError, TypeError, ValueError)


def compile_filter(
    model: type[models.Model], q: models.Q, wrapper: BaseDatabaseWrapper, pk_column: str
) -> tuple[str, list[Any]] | None:
    """A ``Q`` as a WHERE fragment with parameters; None if it matches nothing.

    Conditions on the job table's own columns are inlined; conditions that need
    joins become ``pk IN (subquery)``. Values stay parameters. Raises one of
    ``FILTER_ERRORS`` for a ``Q`` the model or the database cannot take.
    """
    query = model._base_manager.filter(q).query
    try:
        if len(query.alias_map) <= 1:
            sql, params = query.get_compiler(connection=wrapper).compile(query.where)
        else:
            sub = model._base_manager.filter(q).order_by().values("pk").query
            sql, params = sub.get_compiler(connection=wrapper).as_sql()
            sql = f"{pk_column} IN ({sql})"
    except EmptyResultSet:
        return None
    except FullResultSet:
        return "", []
    return sql, list(params)


class Lane:
    def __init__(self, handler: Handler, worker: Worker) -> None:
        assert handler.model is not None
        self.handler = handler
        self.worker = worker
        self.model: type[models.Model] = handler.model
        self.label = handler.get_name()
        self.alias = router.db_for_write(self.model)
        self.stmts = statements_for(self.model, connections[self.alias].vendor, self.alias)
        self.order_by = self.stmts.order_by(handler.ordering)
        self.num_handlers = handler.num_handlers
        self.prefetch = 0 if handler.uses_pre_dequeue() else handler.prefetch
        self.table = self.model._meta.db_table
        self.interval = seconds(handler.interval) or 1.0
        self.max_interval = seconds(handler.max_interval) or 5 * self.interval
        #: The current idle delay: ``interval``, doubled by each empty claim.
        self.idle_interval = self.interval
        #: Wake-up notifications received for this lane's table (see notify.py).
        self.notifications = 0
        self.heartbeat_interval = seconds(handler.heartbeat_interval) or 1.0
        self.max_runtime = seconds(handler.maximum_runtime_per_job)
        self.lock = threading.Lock()
        #: Claimed jobs whose outcome is not written yet (heartbeated, never re-claimed).
        self.held: dict[int, Attempt] = {}
        #: Attempts handed to handler threads and not finished.
        self.busy = 0
        self.claimed = 0
        self.releases = 0
        self.next_claim_at = 0.0
        self.drained = False
        self._static: tuple[str, list[Any]] | None = None
        self._queue: SimpleQueue[Attempt | None] = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._warned_return = False

    def job_label(self, pk: Any) -> str:
        return f"{self.model._meta.label}:{pk}"

    # -- handler threads -------------------------------------------------------------

    def start(self) -> None:
        for i in range(self.num_handlers):
            thread = threading.Thread(
                target=self._slot_main, name=f"dbworker-{self.label}-{i}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop_threads(self) -> None:
        for _ in self._threads:
            self._queue.put(None)

    def join_threads(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0))

    def free_slots(self) -> int:
        """How many jobs to claim now: 0 while every handler thread has a job, else the
        free threads plus ``prefetch``."""
        if self.busy >= self.num_handlers:
            return 0
        return self.num_handlers + self.prefetch - self.busy

    def give_back_waiting(self) -> None:
        """Stop prefetched jobs no thread has begun: they go back to the queue."""
        for attempt in self.running():
            attempt.withdraw()

    def running(self) -> list[Attempt]:
        with self.lock:
            return [a for a in self.held.values() if not a.finished]

    def _slot_main(self) -> None:
        try:
            while (attempt := self._queue.get()) is not None:
                try:
                    self._run(attempt)
                except BaseException:
                    # _run has handed the outcome to the writer already. A hook that raised
                    # SystemExit (or a bug of ours) must not cost the worker this thread:
                    # without it, claimed jobs would wait here forever.
                    logger.exception(
                        "job %s: error after the attempt; the handler thread carries on",
                        self.job_label(attempt.pk),
                    )
        finally:
            connections.close_all()

    # -- claims ----------------------------------------------------------------------

    def claim(self, conn: Connection, limit: int) -> int:
        """Claim up to ``limit`` jobs and hand them to handler threads; return how many."""
        if self._static is None:
            q = self.handler.dequeue_filter
            try:
                compiled = (
                    compile_filter(self.model, q, conn.wrapper, self.stmts.col["pk"])
                    if q
                    else ("", [])
                )
            except FILTER_ERRORS as exc:  # the system check dbworker.E004 says so at start
                logger.error(
                    "%s: dequeue_filter cannot be used (%s: %s); this handler claims nothing.",
                    self.label,
                    type(exc).__name__,
                    exc,
                )
                compiled = None
            self._static = compiled if compiled is not None else ("FALSE", [])
        where, params = self._static
        if self.handler.uses_pre_dequeue():
            extra = self._pre_dequeue(conn)
            if extra is NOT_NOW:
                return 0
            if extra is not None:
                assert isinstance(extra, tuple)
                where = f"({where}) AND ({extra[0]})" if where else extra[0]
                params = [*params, *extra[1]]
            limit = 1
        # Quarantine: a job the resetter brought back may be what crashed its worker,
        # so a process runs at most one such job at a time. A crash then takes each
        # neighbour down with it once at most, instead of every time it runs.
        may_take_reset = not self.worker.running_reset_job()
        if not may_take_reset:
            quarantine = f"{self.stmts.col['num_resets']} = 0"
            where = f"({where}) AND {quarantine}" if where else quarantine
        with self.lock:
            held = list(self.held)
        rows = conn.execute(
            self.stmts.claim(self.order_by, where),
            [
                self.worker.worker_id,
                self.handler.max_num_retries,
                self.stmts.ids_param(held),
                *params,
                limit,
            ],
        )
        if not rows:
            return 0
        # From here on the rows are ours: whatever fails, each one is held and gets an
        # outcome, or it would sit in processing until the resetter took it.
        jobs = []
        wrapper = connections[self.alias]
        plain = self.stmts.plain_instances()
        for row in rows:
            try:
                jobs.append(self.stmts.build_row(row, self.alias, wrapper, plain))
            except Exception as exc:
                self._unloadable(row[self.stmts.pk_index], exc)
        if jobs and self.handler.uses_custom_queryset():
            jobs = self._reload(jobs)
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
            self._give_back(conn, give_back)
        for job in keep:
            self._dispatch(job)
        return len(keep)

    def _pre_dequeue(self, conn: Connection) -> Any:
        try:
            verdict = self.handler.pre_dequeue()
        except Exception:
            logger.exception("%s: pre_dequeue raised; not claiming this round", self.label)
            return NOT_NOW
        if verdict is False:
            return NOT_NOW
        if verdict is True or verdict is None:
            return None
        if isinstance(verdict, models.Q):
            try:
                compiled = compile_filter(self.model, verdict, conn.wrapper, self.stmts.col["pk"])
            except FILTER_ERRORS as exc:
                logger.error(
                    "%s: pre_dequeue returned a Q that cannot be used (%s: %s); not claiming.",
                    self.label,
                    type(exc).__name__,
                    exc,
                )
                return NOT_NOW
            return NOT_NOW if compiled is None else (compiled if compiled[0] else None)
        logger.error(
            "%s: pre_dequeue returned %r; expected True, False, None or a Q. Not claiming.",
            self.label,
            verdict,
        )
        return NOT_NOW

    def _reload(self, jobs: list[Any]) -> list[Any]:
        """Fetch claimed rows through the handler's queryset (eager loading)."""
        try:
            loaded = self.handler.get_queryset().in_bulk([job.pk for job in jobs])
        except Exception:
            logger.exception(
                "%s: get_queryset() raised; handling the plain rows of jobs %s",
                self.label,
                ", ".join(str(job.pk) for job in jobs),
            )
            return jobs
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

    def _dispatch(self, job: Any) -> None:
        attempt = Attempt(job, self)
        with self.lock:
            self.held[attempt.pk] = attempt
        self.claimed += 1
        if job.cancel:
            attempt.cancel_reason = CancelReason.CANCELED
            attempt.finished = True
            outcome = Outcome(JobState.CANCELED, message="canceled before it started")
            self.worker.writer.submit(attempt, outcome)
            return
        with self.lock:
            self.busy += 1
        self._queue.put(attempt)

    def _unloadable(self, pk: Any, error: Exception) -> None:
        """A claimed row that cannot be turned into a model instance (a column its field
        cannot convert): the attempt errors at once, like a handler that raised."""
        logger.error(
            "job %s: its row could not be loaded: %s: %s",
            self.job_label(pk),
            type(error).__name__,
            error,
        )
        attempt = Attempt(self.model(pk=pk), self)  # a stand-in: only the key is known
        attempt.finished = True
        with self.lock:
            self.held[attempt.pk] = attempt
        self.claimed += 1
        outcome = Outcome(
            JobState.ERRORED,
            error,
            failure_message(error, prefix="could not load the job row: "),
            retry_delay=self.handler.retry_delay(1),
        )
        self.worker.writer.submit(attempt, outcome)

    def _give_back(self, conn: Connection, jobs: list[Any]) -> None:
        """Requeue claimed jobs without running them, now; through the writer (held, and
        retried) if that fails."""
        message = "given back: this worker runs a reset job"
        ids = [job.pk for job in jobs]
        try:
            rows = conn.execute(
                self.stmts.requeue, [self.stmts.ids_param(ids), self.worker.worker_id]
            )
        except Exception as exc:
            logger.warning("%s: could not give back jobs %s now (%s)", self.label, ids, exc)
            rows = []
        done = {row[0] for row in rows}
        for job in jobs:
            if job.pk in done:
                logger.info("job %s: %s", self.job_label(job.pk), message)
                continue
            attempt = Attempt(job, self)  # locked by another transaction, or a failure
            attempt.finished = True
            with self.lock:
                self.held[attempt.pk] = attempt
            self.worker.writer.submit(attempt, Outcome(JobState.QUEUED, message=message))

    def release(self, attempt: Attempt) -> None:
        """The outcome of ``attempt`` is written (or refused): stop holding its job."""
        with self.lock:
            if self.held.get(attempt.pk) is attempt:
                del self.held[attempt.pk]
        self.worker.on_released(self)

    # -- running an attempt ----------------------------------------------------------

    def _run(self, attempt: Attempt) -> None:
        handler, job = self.handler, attempt.job
        if not attempt.begin():  # withdrawn while it waited (prefetch): never run
            self._skip(attempt)
            return
        set_current_attempt(attempt)
        error: BaseException | None = None
        # Should our own code fail below, write nothing: the resetter brings the job back.
        outcome = Outcome("lost")
        try:
            try:
                with attempt.interruptible():
                    handler.pre_handle(job)
                    result = handler.handle(job)
                    if inspect.iscoroutine(result):
                        result = asyncio.run(result)
                if isinstance(result, BaseException):
                    error = result
                elif result is not None and not self._warned_return:
                    self._warned_return = True
                    logger.warning(
                        "%s: handle() returned %r; return values are ignored",
                        self.label,
                        type(result).__name__,
                    )
            except BaseException as exc:
                error = exc
            outcome = self.decide(attempt, error)
            outcome.duration = time.monotonic() - attempt.started
            with attempt._lock:
                attempt.finished = True
            try:
                handler.post_handle(job, outcome)
            except Exception:
                logger.exception("job %s: post_handle raised", self.job_label(attempt.pk))
        finally:
            set_current_attempt(None)
            attempt.finished = True
            try:
                if getattr(_orm, "opened", False):
                    close_old_connections()
            finally:
                self._done(attempt, outcome)

    def _skip(self, attempt: Attempt) -> None:
        attempt.finished = True
        self._done(attempt, self.decide(attempt, JobCanceled(attempt.cancel_reason)))

    def _done(self, attempt: Attempt, outcome: Outcome) -> None:
        self.worker.writer.submit(attempt, outcome)
        with self.lock:
            self.busy -= 1
            busy = self.busy
        # Wake the dispatcher only when it may claim again: while prefetched jobs still
        # wait for a thread it would not.
        if busy < self.num_handlers:
            self.worker.wake()

    def decide(self, attempt: Attempt, error: BaseException | None) -> Outcome:
        reason = attempt.cancel_reason
        if reason is CancelReason.LOST:
            return Outcome("lost", error)
        if error is None:
            return Outcome(JobState.COMPLETED)
        if reason is CancelReason.CANCELED:
            return Outcome(JobState.CANCELED, error, "canceled while running")
        if reason is CancelReason.SHUTDOWN:
            return Outcome(JobState.QUEUED, error, "requeued: the worker shut down")
        message = failure_message(error)
        non_retryable = False
        if reason is CancelReason.TIMEOUT:
            message = (
                f"exceeded the maximum runtime of {self.max_runtime:g}s "
                f"(maximum_runtime_per_job)\n\n{message}"
            )
        else:
            try:
                non_retryable = not self.handler.is_retryable(error)
            except Exception:
                logger.exception("%s: is_retryable raised; retrying", self.label)
        job = attempt.job
        final = non_retryable or job.num_failures >= self.handler.max_num_retries
        return Outcome(
            JobState.FAILED if final else JobState.ERRORED,
            error,
            message,
            retry_delay=self.handler.retry_delay(job.num_failures + 1),
            non_retryable=non_retryable,
        )

    # -- execution log ---------------------------------------------------------------

    def write_log(self, attempt: Attempt, entry: LogEntry) -> None:
        data = json.dumps(entry.data)
        worker_id = self.worker.worker_id
        try:
            if entry.index is None:
                rows = self.worker.writer.execute(
                    self.alias, self.stmts.log_append, [data, attempt.pk, worker_id]
                )
                if rows:
                    entry.index = int(rows[0][0])
                    logs = attempt.job.execution_logs
                    if isinstance(logs, list):
                        logs.append(entry.data)
            else:
                index: Any = str(entry.index) if self.stmts.pg else entry.index
                rows = self.worker.writer.execute(
                    self.alias, self.stmts.log_update, [index, data, attempt.pk, worker_id]
                )
        except Exception:
            logger.warning(
                "job %s: could not write its execution log",
                self.job_label(attempt.pk),
                exc_info=True,
            )
            return
        if not rows:
            attempt.request_cancel(CancelReason.LOST)
