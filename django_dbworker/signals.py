"""Lifecycle signals of workers and jobs (Django signals).

Connect a receiver as to any Django signal::

    from django.dispatch import receiver
    from django_dbworker.signals import job_finished

    @receiver(job_finished)
    def count(sender, job, handler, outcome, **kwargs):
        ...

``sender`` is the job model for the job signals and the ``Worker`` class for the
worker signals. Each is sent from the thread named below; a receiver that raises is
logged (``django_dbworker.signals``) and never breaks the worker. Receivers run
inline in the worker's own threads: keep them fast (hand slow work to a queue), above
all those of ``job_finished``, sent from the thread that writes every outcome.
A signal nobody listens to costs nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_dbworker.signals")

#: A worker started (its threads run, before its first claim). Main thread.
#: ``worker_id``, ``handlers`` (their names).
worker_started = Signal()
#: A worker stops claiming: it was signalled, reached ``--max-time``/``--max-jobs``,
#: ran out of jobs (``--burst``) or lost a bookkeeping thread. Main thread.
#: ``worker_id``, ``running`` (how many jobs it still runs).
worker_stopping = Signal()
#: A worker stopped. Main thread. ``worker_id``, ``exit_code``, ``outcomes`` (a dict:
#: the number of attempts per state written, "lost" for outcomes not written).
worker_stopped = Signal()
#: A job was claimed. The dispatcher thread, before the job is handed to a handler.
#: ``job``, ``handler``, ``worker_id``.
job_claimed = Signal()
#: An attempt at a job starts. The thread that runs it (for an async handler, its
#: event loop's thread), before the middleware and ``pre_handle``. ``job``,
#: ``handler``, ``attempt``.
job_started = Signal()
#: An attempt's outcome was written (or could not be: ``outcome.state`` is then
#: "lost"). The outcome writer thread, right after the statement. ``job``,
#: ``handler``, ``attempt``, ``outcome`` (``django_dbworker.runtime.outcome.Outcome``:
#: ``state``, ``duration``, ``error``, ``message``).
job_finished = Signal()
#: The resetter moved a stalled job back to the queue (``failed`` False) or failed it
#: once its resets were spent (``failed`` True). The resetter's thread (the dispatcher
#: of a worker, or runresetter's main thread). ``job_id``, ``worker_id`` (the holder
#: that stopped heartbeating), ``failed``.
job_reset = Signal()
#: A worker saw a running job's ``cancel`` flag and asked its attempt to stop. The
#: heartbeat thread. ``job``, ``handler``, ``attempt``.
job_canceled = Signal()
#: Jobs were enqueued through the ORM: ``save()``/``create()`` of a queued job (and so
#: ``enqueue_unique()``), ``bulk_create``, ``bulk_enqueue``. The thread that enqueued,
#: after the statement (a later rollback of its transaction is not told). ``jobs``
#: (the instances; for ``bulk_enqueue`` one batch of them), ``using``. Tasks of
#: ``django.tasks`` send its own ``task_enqueued`` instead.
jobs_enqueued = Signal()


def send(signal: Signal, sender: Any, **arguments: Any) -> None:
    """Send ``signal`` if anyone listens; log what a receiver raised."""
    if not signal.receivers:
        return
    for receiver, result in signal.send_robust(sender, **arguments):
        if isinstance(result, Exception):
            logger.error(
                "receiver %r of a django_dbworker signal raised: %s: %s",
                receiver,
                type(result).__name__,
                result,
                exc_info=result,
                extra={"action": "receiver_failed"},
            )
