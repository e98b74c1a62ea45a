"""The abstract ``WorkerJob`` every job table subclasses, and the worker registry."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator
from datetime import timedelta
from itertools import islice
from typing import Any

from django.db import connections, models, transaction
from django.db.models.functions import Now
from django.utils import timezone

from .notify import notify_workers
from .states import DEQUEUEABLE_STATES, FINAL_STATES, JobState

__all__ = ["JobState", "WorkerJob", "WorkerJobQuerySet", "WorkerProcess", "dequeue_index"]

#: The predicate of the dequeue index. The claim statement repeats it literally so
#: PostgreSQL can prove the partial index applies.
DEQUEUE_INDEX_CONDITION = models.Q(state__in=[s.value for s in DEQUEUEABLE_STATES])


#: The columns the worker owns (what ``WorkerJob`` declares besides ``id``).
BOOKKEEPING_FIELDS = (
    "state",
    "failure_message",
    "queued_at",
    "started_at",
    "finished_at",
    "process_after",
    "num_resets",
    "num_failures",
    "last_heartbeat_at",
    "execution_logs",
    "worker_hostname",
    "cancel",
)


def _chunks(objs: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(objs)
    while chunk := list(islice(iterator, size)):
        yield chunk


def dequeue_index(*fields: str, name: str) -> models.Index:
    """A partial index over the rows a worker can still claim, in claim order.

    ``WorkerJob.Meta`` declares one on ``id``. A handler that claims in another
    order (``ordering = ("-priority", "id")``) should add one for that order::

        class Meta(WorkerJob.Meta):
            indexes = [
                *WorkerJob.Meta.indexes,
                dequeue_index("-priority", "id", name="myapp_job_prio_dq"),
            ]
    """
    return models.Index(fields=list(fields), condition=DEQUEUE_INDEX_CONDITION, name=name)


class WorkerJobQuerySet(models.QuerySet[Any]):
    """Filters and the operator's operations (what the admin actions call).

    Every operation is one guarded UPDATE: it only touches rows in the states it
    applies to, so it never races a worker into an inconsistent row.
    """

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list[Any]:
        """``QuerySet.bulk_create`` that also wakes the workers (on PostgreSQL)."""
        created = super().bulk_create(objs, *args, **kwargs)
        if created:
            notify_workers(self.model, self.db)
        return created

    def bulk_enqueue(self, objs: Iterable[Any], *, batch_size: int = 10_000) -> int:
        """Enqueue many jobs fast; return how many.

        Writes each job's own (domain) fields and ``process_after``; every other
        column takes its database default (``queued``, queued now). Primary keys
        are not set on ``objs``: use ``bulk_create`` when you need them. On
        PostgreSQL this is one ``COPY`` per ``batch_size`` jobs (several times
        faster than ``bulk_create``); elsewhere it is ``bulk_create``. Wakes the
        workers like ``bulk_create``.
        """
        model = self.model
        fields = [
            f
            for f in model._meta.concrete_fields
            if not f.primary_key and (f.name == "process_after" or f.name not in BOOKKEEPING_FIELDS)
        ]
        connection = connections[self.db]
        count = 0
        if connection.vendor != "postgresql":
            names = [f.attname for f in fields]
            for chunk in _chunks(objs, batch_size):
                fresh = [model(**{n: getattr(obj, n) for n in names}) for obj in chunk]
                self.bulk_create(fresh, batch_size=batch_size)
                count += len(chunk)
            return count
        columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
        table = connection.ops.quote_name(model._meta.db_table)
        with transaction.atomic(using=self.db, savepoint=False), connection.cursor() as cursor:
            for chunk in _chunks(objs, batch_size):
                with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                    for obj in chunk:
                        copy.write_row(
                            [
                                f.get_db_prep_save(getattr(obj, f.attname), connection)
                                for f in fields
                            ]
                        )
                count += len(chunk)
            if count:
                notify_workers(model, self.db)
        return count

    def with_state(self, *states: str) -> WorkerJobQuerySet:
        return self.filter(state__in=states)

    def unfinished(self) -> WorkerJobQuerySet:
        return self.exclude(state__in=FINAL_STATES)

    def stalled(self, max_age: timedelta) -> WorkerJobQuerySet:
        """Processing rows whose heartbeat is older than ``max_age`` (what the resetter takes)."""
        cutoff = timezone.now() - max_age
        return self.filter(state=JobState.PROCESSING).filter(
            models.Q(last_heartbeat_at__isnull=True) | models.Q(last_heartbeat_at__lt=cutoff)
        )

    def cancel(self) -> tuple[int, int]:
        """Cancel: queued/errored jobs become ``canceled`` now; processing jobs get the
        ``cancel`` flag and stop at their worker's next heartbeat.

        Returns (canceled now, cancellation requested).
        """
        canceled = self.filter(state__in=DEQUEUEABLE_STATES).update(
            state=JobState.CANCELED,
            cancel=True,
            finished_at=timezone.now(),
            failure_message="canceled before it ran",
        )
        requested = self.filter(state=JobState.PROCESSING, cancel=False).update(cancel=True)
        return canceled, requested

    def retry(self, *, reset_counters: bool = False) -> int:
        """Queue failed, errored and canceled jobs again, to run now.

        Counters are kept by default: a job past its retry budget then gets one
        more attempt. ``reset_counters=True`` zeroes ``num_failures`` and
        ``num_resets``, giving it its whole budget again.
        """
        now = timezone.now()
        fields: dict[str, Any] = {
            "state": JobState.QUEUED,
            "cancel": False,
            "queued_at": now,
            "process_after": None,
            "started_at": None,
            "finished_at": None,
            "last_heartbeat_at": None,
        }
        if reset_counters:
            fields.update(num_failures=0, num_resets=0)
        retried = self.filter(
            state__in=[JobState.FAILED, JobState.ERRORED, JobState.CANCELED]
        ).update(**fields)
        if retried:
            notify_workers(self.model, self.db)
        return retried

    def run_now(self) -> int:
        """Queued or errored jobs scheduled for later become claimable now."""
        now = timezone.now()
        done = self.filter(state__in=DEQUEUEABLE_STATES, process_after__gt=now).update(
            process_after=now
        )
        if done:
            notify_workers(self.model, self.db)
        return done

    def schedule(self, when: datetime.datetime) -> int:
        """Queued or errored jobs are not claimed before ``when``."""
        return self.filter(state__in=DEQUEUEABLE_STATES).update(process_after=when)


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
        db_index=True,
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
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    execution_logs = models.JSONField(default=list, db_default=models.Value("[]"), blank=True)
    worker_hostname = models.CharField(max_length=255, default="", db_default="", blank=True)
    cancel = models.BooleanField(default=False, db_default=False)

    objects = WorkerJobQuerySet.as_manager()

    class Meta:
        abstract = True
        indexes = [
            # Rows a worker can still claim, in the default claim order.
            dequeue_index("id", name="%(app_label)s_%(class)s_dq"),
            # Rows being processed: what the heartbeat and the resetter scan. Kept off
            # last_heartbeat_at so heartbeats stay HOT updates.
            models.Index(
                fields=["id"],
                condition=models.Q(state=JobState.PROCESSING.value),
                name="%(app_label)s_%(class)s_run",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state__in=JobState.values),
                name="%(app_label)s_%(class)s_state_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{type(self).__name__} {self.pk} ({self.state})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save; a queued job also wakes the workers (on PostgreSQL, at commit)."""
        super().save(*args, **kwargs)
        if self.state == JobState.QUEUED:
            notify_workers(type(self), kwargs.get("using") or self._state.db)

    @classmethod
    def notify_workers(cls, using: str | None = None) -> None:
        """Wake idle workers of this table now: call after enqueueing with plain SQL."""
        notify_workers(cls, using)


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
    num_handlers = models.PositiveIntegerField(default=0)
    jobs = models.JSONField(default=list, help_text="Jobs in flight, as app_label.model:id.")
    num_jobs = models.PositiveIntegerField(default=0)
    heartbeat_interval = models.FloatField(
        default=1.0, help_text="Seconds between the worker's heartbeats."
    )
    started_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField()

    class Meta:
        verbose_name = "worker process"
        verbose_name_plural = "worker processes"
        ordering = ["hostname", "pid"]

    def __str__(self) -> str:
        return self.worker_id

    def seconds_since_heartbeat(self) -> float:
        return (timezone.now() - self.last_heartbeat_at).total_seconds()

    def is_alive(self) -> bool:
        """Heard from within five heartbeat intervals (and at least 10 s)."""
        return self.seconds_since_heartbeat() < max(5 * self.heartbeat_interval, 10.0)
