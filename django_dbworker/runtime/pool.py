"""A shared pool (``runworker --pool N``): every handler of a worker process runs on one
set of N slots, and each free slot goes to a handler chosen by weight.

gocraft/work's rule: when a slot frees, the handler that claims next is chosen among
those that have claimable jobs, in proportion to their weights (``Handler.weight``,
1-100,000). A handler that found nothing, is paused, or is held back by a fleet-wide
limit is out of the draw until it is due to claim again (its lane's ``next_claim_at``),
so its share goes to the others at once and no claim is wasted on it. The draw is a
smooth weighted round robin (nginx's): over any stretch of draws among the same
handlers, each gets its weight's share to within one slot, and a handler of weight 1
among weights of 1,000 still gets its slot every 1,001 draws (no starvation, and no
luck involved). Slots freed together are drawn together, and each handler claims the
slots it drew in one statement, so claims stay batched.

A handler's ceiling in the pool is its ``num_handlers`` when it sets one (on its class,
or ``runworker --num-handlers``), else the pool's size.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .lane import Lane

#: Minutes of claims the shares are computed over.
SHARE_WINDOW = 5


class Pool:
    """The pool of one worker process: its size, the draw, and the record of who got
    the slots (per minute, for the shares shown in the admin and the metrics)."""

    def __init__(self, size: int, prefetch: int = 0) -> None:
        self.size = size
        #: Jobs claimed beyond free slots, waiting in this process for one.
        self.prefetch = prefetch
        self.lanes: list[Lane] = []
        self._current: dict[Lane, float] = {}
        self._lock = threading.Lock()
        #: (minute, lane label) → jobs claimed.
        self._claimed: collections.Counter[tuple[int, str]] = collections.Counter()

    def attach(self, lanes: Sequence[Lane]) -> None:
        self.lanes = list(lanes)

    def busy(self) -> int:
        """Slots taken: attempts handed to an executor and not finished (running, or
        claimed ahead and waiting)."""
        return sum(lane.busy for lane in self.lanes)

    def free(self) -> int:
        """Jobs the process may claim now across every lane."""
        return max(self.size + self.prefetch - self.busy(), 0)

    def draw(self, eligible: Sequence[Lane], slots: int) -> list[tuple[Lane, int]]:
        """Give ``slots`` to ``eligible`` lanes by weight, none beyond what it may take
        (``Lane.free_slots``); (lane, slots) of each that got some, in draw order."""
        room = {lane: lane.free_slots() for lane in eligible}
        drawn: dict[Lane, int] = {}
        with self._lock:
            for _ in range(slots):
                candidates = [lane for lane in eligible if room[lane] > drawn.get(lane, 0)]
                if not candidates:
                    break
                total = 0.0
                for lane in candidates:
                    weight = lane.weight
                    self._current[lane] = self._current.get(lane, 0.0) + weight
                    total += weight
                best = max(candidates, key=lambda lane: self._current[lane])
                self._current[best] -= total
                drawn[best] = drawn.get(best, 0) + 1
        return list(drawn.items())

    def claimed(self, lane: Lane, count: int) -> None:
        """``lane`` claimed ``count`` jobs (for the shares)."""
        if count:
            minute = int(time.time() // 60)
            with self._lock:
                self._claimed[(minute, lane.label)] += count

    def shares(self) -> dict[str, float]:
        """Each lane's share of the jobs the pool claimed over the last ``SHARE_WINDOW``
        minutes (0 to 1)."""
        oldest = int(time.time() // 60) - SHARE_WINDOW + 1
        with self._lock:
            for key in [k for k in self._claimed if k[0] < oldest]:
                del self._claimed[key]
            per_lane: collections.Counter[str] = collections.Counter()
            for (_, label), count in self._claimed.items():
                per_lane[label] += count
        total = sum(per_lane.values())
        return {lane.label: (per_lane[lane.label] / total if total else 0.0) for lane in self.lanes}

    def report(self) -> dict[str, Any]:
        """What the worker registry keeps of the pool (the admin, ``dbworker_status``)."""
        shares = self.shares()
        return {
            "size": self.size,
            "busy": self.busy(),
            "handlers": {
                lane.label: {
                    "weight": lane.weight,
                    "ceiling": lane.num_handlers,
                    "busy": lane.busy,
                    "share": round(shares.get(lane.label, 0.0), 4),
                }
                for lane in self.lanes
            },
        }


def pool_lines(report: Any) -> list[str]:
    """A registry row's ``pool`` (``Pool.report()``) as lines of text: the occupancy,
    then each handler's weight, share of the last minutes, busy slots and ceiling."""
    if not isinstance(report, dict):
        return []
    lines = [f"pool of {report.get('size')} slots, {report.get('busy')} busy"]
    handlers = report.get("handlers")
    for name, figures in handlers.items() if isinstance(handlers, dict) else []:
        if isinstance(figures, dict):
            share = figures.get("share")
            shown = f"{100 * share:.0f}%" if isinstance(share, int | float) else "?"
            lines.append(
                f"{name}: weight {figures.get('weight')}, {shown} of the last "
                f"{SHARE_WINDOW} min, {figures.get('busy')} busy (ceiling "
                f"{figures.get('ceiling')})"
            )
    return lines
