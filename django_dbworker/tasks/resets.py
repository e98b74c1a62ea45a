"""``task_finished`` for the tasks the resetter fails (their worker died once too
often): every other failure is told by the worker that wrote it (``TaskHandler``), and
this one has no worker left to tell it."""

from __future__ import annotations

import logging
from typing import Any

from django.db import router

from ..signals import send
from ..states import JobState
from . import compat
from .models import TaskJob
from .results import result_of

logger = logging.getLogger("django_dbworker.tasks")


def task_failed_by_resetter(
    sender: Any, job_id: Any, worker_id: str, failed: bool, **kwargs: Any
) -> None:
    """A receiver of ``job_reset`` for ``TaskJob``: sends ``task_finished`` (FAILED) by
    the task's backend class once the resetter failed it."""
    if not failed:
        return  # back in the queue: not finished
    job = TaskJob._base_manager.using(router.db_for_write(TaskJob)).filter(pk=job_id).first()
    if job is None or job.state != JobState.FAILED:
        return  # retried or deleted meanwhile
    tasks = compat.require()
    try:
        result = result_of(job)
        backend = type(tasks.task_backends[job.backend])
    except Exception as exc:  # the task or its backend is gone from the code
        logger.warning(
            "task %s failed by the resetter: no task_finished sent (%s: %s)",
            job.result_id,
            type(exc).__name__,
            exc,
        )
        return
    send(compat.signals.task_finished, backend, task_result=result)
