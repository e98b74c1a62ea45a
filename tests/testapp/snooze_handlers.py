"""Handlers that snooze (issue 44, item 4), for tests/test_snooze.py and its
``runworker`` subprocesses. Each job's ``payload`` says what to do:

- ``snoozes``: snooze this many times (``seconds`` each, default 0), then
- ``errors``: raise this many times, then complete.
"""

from __future__ import annotations

import time

from django_dbworker import Handler, Snooze
from tests.testapp.models import Event, QueueJob


def _act(job: QueueJob) -> str:
    payload = job.payload or {}
    Event.objects.create(job_id=job.pk, kind="start", worker=job.worker_hostname, at=time.time())
    if job.num_snoozes < payload.get("snoozes", 0):
        raise Snooze(payload.get("seconds", 0))
    if job.num_failures < payload.get("errors", 0):
        raise RuntimeError(f"error {job.num_failures + 1}")
    return "done"


class SnoozingHandler(Handler):
    model = QueueJob
    max_num_retries = 3
    retry_after = 0
    max_snoozes = 200

    def handle(self, job: QueueJob) -> None:
        _act(job)


class CappedSnoozeHandler(SnoozingHandler):
    """Snoozes for ever; ``max_snoozes`` ends it."""

    max_snoozes = 5

    def handle(self, job: QueueJob) -> None:
        Event.objects.create(job_id=job.pk, kind="start")
        raise Snooze(0)


class BackoffHandler(SnoozingHandler):
    """Retries with a steep backoff: the delay after an error tells what it counted."""

    retry_after = 100
    retry_backoff = 10


class AsyncSnoozingHandler(SnoozingHandler):
    async def handle(self, job: QueueJob) -> None:  # type: ignore[override]
        from asgiref.sync import sync_to_async

        await sync_to_async(_act)(job)


class SleepySnoozeHandler(SnoozingHandler):
    """Snoozes once for ``payload["seconds"]`` (a real worker's stager must wake it)."""
