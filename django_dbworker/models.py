"""The abstract ``WorkerJob`` every job table subclasses, and the worker registry."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Self

from django.db import models
from django.db.backends.utils import names_digest
from django.db.models.functions import Now
from django.db.models.signals import class_prepared
from django.utils import timezone

from . import signals
from .consumers.models import ConsumerCheckpoint, ConsumerGapSkip
from .control.models import AuditEntry, Pause, Schedule, ScheduleTick
from .job_meta import BOOKKEEPING_FIELDS as BOOKKEEPING_FIELDS
from .job_meta import DEQUEUE_INDEX_CONDITION as DEQUEUE_INDEX_CONDITION
from .job_meta import PROCESSING_INDEX_CONDITION as PROCESSING_INDEX_CONDITION
from .job_meta import STATE_CONSTRAINT_CONDITION as STATE_CONSTRAINT_CONDITION
from .job_meta import STATE_INDEX_CONDITION as STATE_INDEX_CONDITION
from .job_meta import WAITING_INDEX_CONDITION as WAITING_INDEX_CONDITION
from .job_meta import (
    dequeue_index,
    fair_index,
    processing_index,
    state_constraint,
    state_index,
    waiting_index,
    worker_index,
)
from .querysets import WorkerJobQuerySet
from .sql.notify import notify_workers
from .states import FINAL_STATES, JobState
from .stats import JobStats

__all__ = [
    "AuditEntry",
    "ConsumerCheckpoint",
    "ConsumerGapSkip",
    "JobState",
    "JobStats",
    "Pause",
    "Schedule",
    "ScheduleTick",
    "WorkerJob",
    "WorkerJobQuerySet",
    "WorkerProcess",
    "dequeue_index",
    "fair_index",
    "processing_index",
    "state_constraint",
    "state_index",
    "waiting_index",
    "worker_index",
]


@functools.cache
def _domain_fields(model: type[models.Model]) -> list[tuple[str, str]]:
    """(name, attname) of the columns ``save()`` writes for an existing job: all but the
    worker's and the key."""
    return [
        (f.name, f.attname)
        for f in model._meta.concrete_fields
        if not f.primary_key
        and f.name not in BOOKKEEPING_FIELDS
        # The partition key of a partitioned table (``partitions.FinishedOnField``).
        and not getattr(f, "dbworker_partition_key", False)
    ]


class WorkerJob(models.Model):
    """A row of a job table. Subclass it and add your own domain columns.

    Every bookkeeping column also has a database default, so programs that
    enqueue with plain SQL (``INSERT INTO … (domain columns) VALUES …``) get
    valid rows too.
    """

    id = models.BigAutoField(primary_key=True)
    state = models.CharField(
        max_length=16,
        choices=JobState.choices,
        default=JobState.QUEUED,
        db_default=JobState.QUEUED.value,
    )
    failure_message = models.TextField(null=True, blank=True)  # noqa: DJ001 - NULL means "no failure"
    queued_at = models.DateTimeField(default=timezone.now, db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    process_after = models.DateTimeField(
        null=True, blank=True, help_text="The job is not claimed before this time."
    )
    num_resets = models.PositiveIntegerField(default=0, db_default=0)
    num_failures = models.PositiveIntegerField(default=0, db_default=0)
    num_snoozes = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Times a handler snoozed the job (raise Snooze): not failures.",
    )
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    execution_logs = models.JSONField(default=list, db_default=models.Value("[]"), blank=True)
    worker_hostname = models.CharField(max_length=255, default="", db_default="", blank=True)
    cancel = models.BooleanField(default=False, db_default=False)
    progress = models.JSONField(
        null=True,
        blank=True,
        help_text="The running attempt's last check-in: text, done, total, at.",
    )
    history = models.JSONField(
        default=list,
        db_default=models.Value("[]"),
        blank=True,
        help_text="The attempts that ended without completing (errored, failed, canceled, "
        "requeued, reset), oldest first: worker, times, outcome, failure, log summary.",
    )

    objects = WorkerJobQuerySet.as_manager()

    class Meta:
        abstract = True
        indexes = [
            # Rows a worker can claim now, in the default claim order.
            dequeue_index("id", name="%(app_label)s_%(class)s_dq"),
            # Rows that wait for a time, by that time: the next one due.
            waiting_index(name="%(app_label)s_%(class)s_wt"),
            # Every row but the completed ones, by state: exact counts of active jobs,
            # and the rows being processed, which the resetter and limits scan.
            state_index(name="%(app_label)s_%(class)s_st"),
        ]
        constraints = [state_constraint(name="%(app_label)s_%(class)s_state_valid")]

    def __str__(self) -> str:
        return f"{type(self).__name__} {self.pk} ({self.state})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save the job; a new queued job also wakes the workers (PostgreSQL, at commit).

        For a job that exists already, only your own (domain) columns are written
        unless ``update_fields`` names others: the worker owns the bookkeeping
        columns (state, heartbeat, cancel flag, counters, execution log, times) of a
        job while it runs, and a ``job.save()`` in a handler or in the admin must not
        write back what was loaded earlier (a stale heartbeat gets a live job reset,
        a stale ``cancel`` undoes a cancellation). It is an UPDATE only, so it never
        re-inserts a job that was deleted meanwhile (Django raises instead).
        """
        if args:
            raise TypeError("WorkerJob.save() takes keyword arguments only")
        adding = self._state.adding or kwargs.get("force_insert")
        if not adding and kwargs.get("update_fields") is None:
            deferred = self.get_deferred_fields()
            kwargs["update_fields"] = [
                name for name, attname in _domain_fields(type(self)) if attname not in deferred
            ]
            kwargs.pop("force_update", None)
        super().save(**kwargs)
        update_fields = kwargs.get("update_fields")
        written = adding or (update_fields is not None and "state" in update_fields)
        if written and self.state == JobState.QUEUED:
            notify_workers(type(self), kwargs.get("using") or self._state.db)
            if adding:
                signals.send(signals.jobs_enqueued, type(self), jobs=[self], using=self._state.db)

    def wait(self, timeout: float | None = None) -> Self:
        """Block until the job is completed, failed or canceled, then return it
        reloaded (``refresh_from_db()``). ``django_dbworker.WaitTimeout`` (a
        ``TimeoutError``) past ``timeout`` seconds; ``DoesNotExist`` if the job was
        deleted. Every waiter of the process shares one connection (the hub of
        ``django_dbworker.waiting``): on PostgreSQL the outcome's NOTIFY wakes it,
        elsewhere it polls. See docs/results.md."""
        from .waiting import deadline_of, remaining, wait_for

        deadline = deadline_of(timeout)
        while True:
            wait_for(self, remaining(deadline), timeout)
            self.refresh_from_db()
            if self.state in FINAL_STATES:  # else retried meanwhile: wait on
                return self

    async def await_done(self, timeout: float | None = None) -> Self:
        """``wait()`` for coroutines: ``await job.await_done(timeout)`` never blocks the
        event loop, however many coroutines wait."""
        from .waiting import await_for, deadline_of, remaining

        deadline = deadline_of(timeout)
        while True:
            await await_for(self, remaining(deadline), timeout)
            await self.arefresh_from_db()
            if self.state in FINAL_STATES:  # else retried meanwhile: wait on
                return self

    @classmethod
    def notify_workers(cls, using: str | None = None) -> None:
        """Wake idle workers of this table now: call after enqueueing with plain SQL."""
        notify_workers(cls, using)


#: Longest name a constraint ``WorkerJob.Meta`` declares may keep: PostgreSQL cuts
#: identifiers at 63 bytes (Django's own limit of 30 is for indexes only).
MAX_CONSTRAINT_NAME_LENGTH = 63


def short_name(model: type[models.Model], suffix: str, limit: int) -> str:
    """A name of at most ``limit`` characters for the index or constraint ``suffix``
    of ``model``: ``<app_label>_<model>`` cut to fit, a hash of the model's label
    (stable, and unique per model), then the suffix. E.g. for
    ``myapp.RepositoryIndexingJob`` and ``_dq``: ``myapp_repositoryin_9ec50890_dq``.
    """
    digest = names_digest(model._meta.label_lower, length=8)
    prefix = f"{model._meta.app_label.lower()}_{model._meta.model_name}"
    return f"{prefix[: limit - len(suffix) - len(digest) - 1]}_{digest}{suffix}"


def _shorten_long_names(sender: type[models.Model], **kwargs: Any) -> None:
    """Give the indexes and constraint ``WorkerJob.Meta`` declares a short name on
    models whose ``%(app_label)s_%(class)s_…`` name is too long (Django refuses
    index names over 30 characters, models.E034). Names that fit are kept exactly,
    so existing migrations do not change."""
    if not issubclass(sender, WorkerJob) or sender._meta.abstract:
        return
    names = {"app_label": sender._meta.app_label.lower(), "class": sender._meta.model_name}
    declared: list[tuple[Sequence[Any], Sequence[Any], int]] = [
        (sender._meta.indexes, WorkerJob.Meta.indexes, models.Index.max_name_length),
        (sender._meta.constraints, WorkerJob.Meta.constraints, MAX_CONSTRAINT_NAME_LENGTH),
    ]
    for objs, templates, limit in declared:
        for template in templates:
            name = template.name % names
            if len(name) <= limit:
                continue
            suffix = template.name.rpartition("%(class)s")[2]
            for obj in objs:
                if obj.name == name:
                    obj.name = short_name(sender, suffix, limit)


class_prepared.connect(_shorten_long_names)


class WorkerProcess(models.Model):
    """A running ``runworker`` process, as it last reported itself.

    Written by the worker: a row at start, refreshed at every heartbeat,
    removed on a clean exit. Rows of workers that died stop moving; the
    resetter deletes them after ``DBWORKER["WORKER_RETENTION"]``.
    """

    worker_id = models.CharField(
        max_length=255, unique=True, help_text="Written to worker_hostname of the jobs it holds."
    )
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    handlers = models.JSONField(default=list)
    num_handlers = models.PositiveIntegerField(
        default=0,
        help_text="Handler threads of the process (with a shared pool: its size).",
    )
    threads = models.JSONField(
        default=dict,
        db_default=models.Value("{}"),
        help_text="Per handler it runs: its threads (in a shared pool: the slots it may "
        "take, its ceiling).",
    )
    jobs = models.JSONField(default=list, help_text="Jobs in flight, as app_label.model:id.")
    num_jobs = models.PositiveIntegerField(default=0)
    num_connections = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Database connections the process held open at its last heartbeat: its "
        "own, the listener's, and those of its handler threads (Django's pools at their size).",
    )
    heartbeat_interval = models.FloatField(
        default=1.0, help_text="Seconds between the worker's heartbeats."
    )
    pool = models.JSONField(
        null=True,
        blank=True,
        help_text="A shared pool's size and busy slots, and per handler its weight, "
        "ceiling, busy slots and share of the jobs of the last minutes (runworker --pool).",
    )
    tables = models.JSONField(
        default=dict,
        db_default=models.Value("{}"),
        help_text="Per job model it serves: [stalled_max_age, max_num_resets] of its jobs, "
        "which every resetter applies to the jobs this worker holds.",
    )
    started_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField()

    class Meta:
        verbose_name = "worker process"
        verbose_name_plural = "worker processes"
        ordering = ["hostname", "pid"]
        permissions = [
            (
                "view_metrics",
                "Can read the Prometheus metrics (metrics_view: every job model's gauges)",
            )
        ]

    def __str__(self) -> str:
        return self.worker_id

    def seconds_since_heartbeat(self) -> float:
        return (timezone.now() - self.last_heartbeat_at).total_seconds()

    def is_alive(self) -> bool:
        """Heard from within five heartbeat intervals (and at least 10 s)."""
        return self.seconds_since_heartbeat() < max(5 * self.heartbeat_interval, 10.0)


def job_models() -> list[type[WorkerJob]]:
    """Every concrete job model (subclass of ``WorkerJob``) of the project."""
    from django.apps import apps

    return [
        model
        for model in apps.get_models()
        if issubclass(model, WorkerJob) and not model._meta.proxy
    ]
