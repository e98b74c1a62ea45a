"""Helpers shared by every driver; standard library only (drivers run in the peers' venvs)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any


def emit(result: dict[str, Any]) -> None:
    """Print the driver's result as one JSON line (the last line of stdout)."""
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def open_loop(enqueue_one: Callable[[], Any], count: int, interval: float, out: str) -> None:
    """Enqueue ``count`` jobs, one every ``interval`` seconds on a fixed schedule (open
    loop: a slow enqueue does not push the next ones back), and write ``id time`` for
    each, the time taken when the enqueue call returned (its transaction committed)."""
    lines = []
    start = time.monotonic() + interval
    for i in range(count):
        delay = start + i * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        job_id = enqueue_one()
        lines.append(f"{job_id} {time.time():.6f}\n")
    with open(out, "w") as f:
        f.writelines(lines)


async def open_loop_async(
    enqueue_one: Callable[[], Awaitable[Any]], count: int, interval: float, out: str
) -> None:
    lines = []
    start = time.monotonic() + interval
    for i in range(count):
        delay = start + i * interval - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        job_id = await enqueue_one()
        lines.append(f"{job_id} {time.time():.6f}\n")
    with open(out, "w") as f:
        f.writelines(lines)
