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

import dataclasses
from collections.abc import Sequence

#: Missing positions tracked per run (a longer run is timed by its first ones).
MAX_TRACKED = 100_000


@dataclasses.dataclass(frozen=True)
class Step:
    #: The new checkpoint (== the old one: no progress).
    frontier: int
    #: Missing runs passed, as (first, last, waited seconds).
    skipped: tuple[tuple[int, int, float], ...] = ()
    #: The first position still waited for (None: no gap in the window).
    waiting_for: int | None = None


class GapWatch:
    """Remembers when each missing position was first seen (monotonic seconds)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.first_seen: dict[int, float] = {}

    def step(self, checkpoint: int, positions: Sequence[int], now: float) -> Step:
        """``positions``: the visible positions after ``checkpoint``, ascending (one
        window)."""
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
            first = frontier + 1
            # The run is as old as its youngest position (a row visible further up
            # makes more positions missing, seen from now on).
            since = max(
                self.first_seen.setdefault(missing, now)
                for missing in range(first, min(position, first + MAX_TRACKED))
            )
            waited = now - since
            if waited >= self.threshold:
                skipped.append((first, position - 1, waited))
                frontier = position
                continue
            waiting_for = first
            break
        # Forget what is behind the frontier now.
        if self.first_seen:
            self.first_seen = {p: t for p, t in self.first_seen.items() if p > frontier}
        return Step(frontier, tuple(skipped), waiting_for)
