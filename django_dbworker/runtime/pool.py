"""A shared pool (``runworker --pool N``): every handler of a worker process runs on one
set of N slots, and each free slot goes to a handler chosen by weight.

gocraft/work's rule: when a slot frees, the handler that claims next is chosen among
those that have claimable jobs, in proportion to their weights (``Handler.weight``,
1-100,000). A handler that found nothing, is paused, or is held back by a fleet-wide
limit is out of the draw until it is due to claim again (its lane's ``next_claim_at``),
so its share goes to the others at once and no claim is wasted on it.

The draw is a smooth weighted round robin (nginx's), not a lottery, kept fair while the
handlers in the draw change: each handler in it is owed its weight's share of every
slot drawn (its weight over the total weight of the handlers in the draw for that
slot), and each slot goes to the one owed most. What a handler is owed is counted
from the draw it enters: one that leaves (it found nothing, was paused, held back,
or had no room left) and comes back brings no credit and no debt, and the others
keep what they were owed. So from the draw a handler enters, the slots it gets stay
within about one slot of its share of the draws it was in (at most 1.2 over
thousands of random draws, tests/unit/test_pool.py), whatever set of handlers each
draw had; with the same handlers in every draw, that is nginx's sequence. A handler of
weight 1 among weights of 1,000 gets its slot every 1,001 draws. (nginx's weights,
kept as they were when the handlers differed, let one of the others take every slot
for up to the heavy one's weight in draws after a heavy handler left.)
Slots freed together are drawn together, and each handler claims the slots it drew
in one statement, so claims stay batched.

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
        #: The lanes in the draw (those of the last draw that could take more), and
        #: what each is owed: its share of the slots drawn since it entered less the
        #: slots it got, in units of the total weight of the lanes in the draw (whole
        #: numbers while they stay the same: nginx's current weights).
        self._current: dict[Lane, float] = {}
        self._total = 0
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
            candidates = [lane for lane in eligible if room[lane] > 0]
            self._enter(candidates)
            current, total = self._current, self._total
            for _ in range(slots):
                if not candidates:
                    break
                for lane in candidates:
                    current[lane] += lane.weight
                best = max(candidates, key=current.__getitem__)
                current[best] -= total
                got = drawn[best] = drawn.get(best, 0) + 1
                if got >= room[best]:  # out of room: it leaves the draw
                    candidates.remove(best)
                    self._enter(candidates)
                    current, total = self._current, self._total
        return list(drawn.items())

    def _enter(self, lanes: list[Lane]) -> None:
        """``lanes`` are the draw now (the caller holds the lock): those that were in it
        keep what they are owed, in units of the new total weight; those that come in
        start at nothing owed; those that left forget it."""
        before = self._current
        if len(before) == len(lanes) and all(lane in before for lane in lanes):
            return
        total = sum(lane.weight for lane in lanes)
        scale = total / self._total if self._total else 0.0
        self._current = {lane: before[lane] * scale if lane in before else 0 for lane in lanes}
        self._total = total

    def left(self, lane: Lane) -> None:
        """``lane`` came back short (claimed fewer jobs than the slots it drew): it is
        out of the draw until it is due again, and comes back owed nothing."""
        with self._lock:
            if lane in self._current:
                self._enter([other for other in self._current if other is not lane])

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
