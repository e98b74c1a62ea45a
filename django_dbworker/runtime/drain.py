"""What a stopping worker gives back: the jobs it claimed ahead (``prefetch``) that no
handler thread will take before the running ones end."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .outcome import Outcome

if TYPE_CHECKING:
    from .attempt import Attempt
    from .lane import Lane

MESSAGE = "requeued unrun: the worker stopped"


def give_back_waiting(lanes: Sequence[Lane], *, all_waiting: bool = False) -> None:
    """Requeue, unrun and uncounted, the claimed jobs waiting for a busy thread; with
    ``all_waiting`` (a forced stop) also those an idle thread was about to take: a
    stopping worker must not leave them ``processing``.

    Lanes that run on one executor (the threads of a shared pool, ``runworker --pool``)
    are counted together: a job waits behind every running attempt of that executor,
    whichever handler's, and only as many waiting jobs as it has idle threads are kept
    (any of them: the threads skip the ones given back and take the others)."""
    executors: dict[int, list[Lane]] = {}
    for lane in lanes:
        executors.setdefault(id(lane.executor), []).append(lane)
    for group in executors.values():
        size = getattr(group[0].executor, "size", group[0].num_handlers)
        running = [attempt for lane in group for attempt in lane.running()]
        waiting = [attempt for attempt in running if not attempt.begun]
        idle = 0 if all_waiting else max(size - (len(running) - len(waiting)), 0)
        waiting.sort(key=lambda attempt: attempt.started)  # claim order: the queue's
        for attempt in waiting[idle:]:
            _give_back(attempt)


def _give_back(attempt: Attempt) -> None:
    lane = attempt.lane
    if attempt.withdraw():
        lane.started(attempt)
        with lane.lock:
            lane.busy -= 1
        lane.submit(attempt, Outcome.requeued(MESSAGE))
