from __future__ import annotations

import os
import time
from typing import Any

from django.tasks import task

_out: Any = None


@task()
def noop() -> None:
    return None


@task()
def sleep_1ms() -> None:
    time.sleep(0.001)


@task(takes_context=True)
def latency(context: Any) -> None:
    """Records when it started (pickup latency = start - enqueue commit)."""
    global _out
    if _out is None:
        _out = open(os.environ["BENCH_LATENCY_FILE"], "a", buffering=1)  # noqa: SIM115
    _out.write(f"{context.task_result.id} {time.time():.6f}\n")
