"""The safe frontier: how far a consumer may advance from what one window shows.

Positions come from a sequence, and commit order is not position order: a lower
position can become visible after a higher one. From the checkpoint ``c``, only the
contiguous prefix ``c+1, c+2, …`` of the visible positions is safe. A missing position
below a visible one is a gap: an insert still in flight, or rolled back (a permanent
gap). Gaps are waited for up to the stale-gap threshold (each position timed from when
it was first seen missing), then passed: only the missing positions themselves, never
a visible row. Pure logic, no database.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Step:
    #: The new checkpoint (== the old one: no progress).
    frontier: int
    #: Missing runs passed, as (first, last, waited seconds).
    skipped: tuple[tuple[int, int, float], ...] = ()
    #: The first position still waited for (None: no gap in the window).
    waiting_for: int | None = None


class GapWatch:
    """Remembers when the head (the highest visible position) first reached each value:
    a missing position ``m`` is in flight (or rolled back) since the head first passed
    it, so a gap deep in a backlog has aged with it, not from when the window reached
    it."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        #: (head, monotonic time it was first seen), both ascending.
        self.heads: list[int] = []
        self.times: list[float] = []

    def _saw(self, head: int, now: float) -> None:
        if not self.heads or head > self.heads[-1]:
            self.heads.append(head)
            self.times.append(now)

    def _since(self, position: int) -> float:
        """When the head first reached ``position``."""
        return self.times[bisect.bisect_left(self.heads, position)]

    def step(
        self, checkpoint: int, positions: Sequence[int], now: float, head: int | None = None
    ) -> Step:
        """``positions``: the visible positions after ``checkpoint``, ascending (one
        window); ``head``: the highest visible position, if known."""
        if positions:
            self._saw(max(positions[-1], head or 0), now)
        frontier = checkpoint
        skipped: list[tuple[int, int, float]] = []
        waiting_for = None
        for position in positions:
            if position <= frontier:
                continue
            if position == frontier + 1:
                frontier = position
                continue
            # frontier+1 .. position-1 are missing below a visible row.
            waited = now - self._since(position)
            if waited >= self.threshold:
                skipped.append((frontier + 1, position - 1, waited))
                frontier = position
                continue
            waiting_for = frontier + 1
            break
        # Forget heads behind the frontier (but the last of them).
        cut = bisect.bisect_left(self.heads, frontier)
        if cut > 1:
            del self.heads[: cut - 1], self.times[: cut - 1]
        return Step(frontier, tuple(skipped), waiting_for)
