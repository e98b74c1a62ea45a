"""Handlers of the benchmark: a no-op (also with limits that do not bind), a 1 ms sleep,
and one that records its start time."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from typing import Any

from django_dbworker import Handler, RateLimit

from .models import BenchJob, BenchNote, OtherBenchJob


class NoopHandler(Handler):
    model = BenchJob

    def handle(self, job: Any) -> None:
        return None


class OtherNoopHandler(NoopHandler):
    """The no-op on the second job table (benchmarks/multidb.py)."""

    model = OtherBenchJob


#: The logger of Django's receivers of the tasks signals (``django.tasks.signals``).
_task_logger = logging.getLogger("django.tasks")


class TaskLogsNoopHandler(NoopHandler):
    """The no-op plus the two records Django's receivers of ``task_started`` and
    ``task_finished`` log for each task, built as they build them: the least any
    backend that sends Django's signals can cost on this engine
    (``benchmarks.task_cost``)."""

    def handle(self, job: Any) -> None:
        path = "benchmarks.benchproject.tasks.noop"
        _task_logger.info("Task id=%s path=%s state=%s", job.pk, path, "RUNNING")
        exc_info = sys.exc_info()
        _task_logger.log(
            logging.INFO,
            "Task id=%s path=%s state=%s",
            job.pk,
            path,
            "SUCCESSFUL",
            exc_info=exc_info if exc_info[0] else None,
        )


class InsertHandler(NoopHandler):
    """One INSERT per job through the ORM; it commits on its own, the completion later
    (group commit)."""

    def handle(self, job: Any) -> None:
        BenchNote.objects.create(job_id=job.pk)


class AtomicInsertHandler(InsertHandler):
    """The same INSERT in one transaction with the job's completion (issue 44)."""

    atomic = True


class AckEachNoopHandler(NoopHandler):
    """The no-op, each completion acknowledged in its own statement."""

    ack_each_job = True


class ConcurrencyLimitedNoopHandler(NoopHandler):
    """The no-op with concurrency limits (per handler and per key) that do not bind."""

    max_concurrency = 1_000_000
    concurrency_key = "tenant"
    max_concurrency_per_key = 1_000_000


class RateLimitedNoopHandler(NoopHandler):
    """The no-op with rate limits (per handler and per key) that do not bind."""

    concurrency_key = "tenant"
    rate_limit = RateLimit("100000000/s", burst=1_000_000)
    rate_limit_per_key = RateLimit("100000000/s", burst=1_000_000)


class SlowRateLimitedNoopHandler(NoopHandler):
    """Rate limits that do not bind either (a burst larger than any key's jobs in a
    run) but refill slowly: every claim writes the buckets it spends from."""

    concurrency_key = "tenant"
    rate_limit = RateLimit("20/s", burst=1_000_000)
    rate_limit_per_key = RateLimit("20/s", burst=1_000)


class LimitedNoopHandler(ConcurrencyLimitedNoopHandler, RateLimitedNoopHandler):
    """The no-op with every limit configured and none binding: what the limits cost."""


class SleepHandler(Handler):
    """The 1 ms variant: a handler that waits on I/O for a millisecond."""

    model = BenchJob

    def handle(self, job: Any) -> None:
        time.sleep(0.001)


class AsyncNoopHandler(NoopHandler):
    """The no-op as ``async def handle``: a coroutine on the worker's event loop."""

    async def handle(self, job: Any) -> None:  # type: ignore[override]
        return None


class AsyncSleepHandler(NoopHandler):
    """The 1 ms variant as a coroutine: ``await asyncio.sleep(0.001)``."""

    async def handle(self, job: Any) -> None:  # type: ignore[override]
        await asyncio.sleep(0.001)


class AsyncWaitHandler(NoopHandler):
    """A coroutine awaiting 100 ms (an HTTP call, say): 1,000 of them in flight."""

    async def handle(self, job: Any) -> None:  # type: ignore[override]
        await asyncio.sleep(0.1)


_lock = threading.Lock()
_out: Any = None


def _record(job_id: int) -> None:
    """Append ``id wall-clock-time`` to ``BENCH_LATENCY_FILE`` at once (flushed per line)."""
    global _out
    now = time.time()
    with _lock:
        if _out is None:
            _out = open(os.environ["BENCH_LATENCY_FILE"], "a", buffering=1)  # noqa: SIM115
        _out.write(f"{job_id} {now:.6f}\n")


class LatencyHandler(Handler):
    """No-op that records when it started (pickup latency = start - enqueue commit)."""

    model = BenchJob

    def handle(self, job: Any) -> None:
        _record(job.pk)


class FairNoopHandler(NoopHandler):
    """The no-op with fair claims across ``tenant`` (benchmarks/fairness.py)."""

    fair_by = "tenant"
