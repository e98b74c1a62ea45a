"""``dbworker_jobs_enqueued_total{model,queue}``: the jobs this process enqueued,
counted from the ``jobs_enqueued`` signal (the ORM's enqueueing paths) and
``django.tasks``' ``task_enqueued``, in prometheus_client's default registry and in
the metrics of ``runworker`` and ``metrics_view`` (``prometheus``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from django.db import models
from prometheus_client import REGISTRY, Counter

from .. import conf, signals
from ..handler import HandlerImportError, import_handler
from ..tasks import compat as tasks_compat

#: The most ``queue`` label values per handler (or model) in one process.
MAX_QUEUE_LABELS = 50
OTHER_QUEUE = "other"
#: The model label of django.tasks' results (counted from ``task_enqueued``).
TASKS_MODEL = "dbworker_tasks.TaskJob"


class QueueLabels:
    """The ``queue`` label value of a job: its queue as text, up to ``MAX_QUEUE_LABELS``
    distinct values per owner (a handler or a model), then ``other``."""

    def __init__(self, limit: int = MAX_QUEUE_LABELS) -> None:
        self.limit = limit
        self._seen: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def __call__(self, owner: str, queue: Any) -> str:
        text = "" if queue is None else str(queue)
        seen = self._seen.get(owner)
        if seen is not None and text in seen:
            return text
        with self._lock:
            seen = self._seen.setdefault(owner, set())
            if text not in seen:
                if len(seen) >= self.limit:
                    return OTHER_QUEUE
                seen.add(text)
            return text


#: The jobs this process enqueued, in the default registry too (an exposition of the
#: process's own, such as django-prometheus, includes it).
ENQUEUED = Counter(
    "dbworker_jobs_enqueued",
    "Jobs this process enqueued (the ORM's enqueueing paths and django.tasks).",
    ["model", "queue"],
    registry=REGISTRY,
)
_enqueued_queues = QueueLabels()
#: Model → queue field, from the handlers this process runs (``WorkerMetrics.attach``).
_running_queue_fields: dict[type[models.Model], str] = {}
_configured: tuple[tuple[str, ...], dict[type[models.Model], str]] = ((), {})


def queue_field_of(model: type[models.Model]) -> str | None:
    """The ``queue_field`` of a handler of ``model``: one this process runs, or one
    ``DBWORKER["HANDLERS"]`` lists (None: no handler says)."""
    global _configured
    if model in _running_queue_fields:
        return _running_queue_fields[model]
    paths = tuple(conf.get("HANDLERS"))
    if paths != _configured[0]:
        found: dict[type[models.Model], str] = {}
        for path in paths:
            try:
                cls = import_handler(path)
            except HandlerImportError:
                continue
            if cls.model is not None and cls.queue_field:
                found.setdefault(cls.model, cls.queue_field)
        _configured = (paths, found)
    return _configured[1].get(model)


def _count_jobs(sender: type[models.Model], jobs: Sequence[Any], **kwargs: Any) -> None:
    label = sender._meta.label
    if label == TASKS_MODEL or not jobs:
        return  # tasks: counted from task_enqueued
    field = queue_field_of(sender)
    counts: dict[str, int] = {}
    for job in jobs:
        queue = _enqueued_queues(label, getattr(job, field, None) if field else None)
        counts[queue] = counts.get(queue, 0) + 1
    for queue, count in counts.items():
        ENQUEUED.labels(label, queue).inc(count)


def _count_task(sender: Any, task_result: Any, **kwargs: Any) -> None:
    from ..tasks.backend import DatabaseBackend  # the tasks framework is there: it sent

    if not (isinstance(sender, type) and issubclass(sender, DatabaseBackend)):
        return  # another backend's task
    queue = getattr(getattr(task_result, "task", None), "queue_name", None)
    ENQUEUED.labels(TASKS_MODEL, _enqueued_queues(TASKS_MODEL, queue)).inc()


signals.jobs_enqueued.connect(_count_jobs, dispatch_uid="dbworker-metrics-enqueued")
if tasks_compat.AVAILABLE:
    tasks_compat.signals.task_enqueued.connect(_count_task, dispatch_uid="dbworker-metrics-tasks")
