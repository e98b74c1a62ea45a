"""A reference model of one ordered consumer, written from docs/consumers.md
(Guarantees; Gaps: the safe frontier and its limits; Ownership; Failures), not from
the code: positions committed out of order, held open, rolled back; the checkpoint;
the stale-gap threshold on a clock the test moves; the owner and its generation; what
must have been handled.

Pure Python, no Django: ``tests/test_consumer_properties.py`` drives the real batches
beside it. The model does not pick the frontier a batch reaches (that depends on when
the running process first saw each gap); it bounds it and checks the guarantees:

- a batch takes at least the contiguous stretch of committed rows after the
  checkpoint that its window shows ("the contiguous prefix from the next expected
  position") and never more than its window;
- a missing position is passed only once it is stale: missing for at least the
  threshold. The sound form: the process times a gap from when it first saw a row
  above it, which is no earlier than that row's commit, so the clock minus the commit
  of the first committed row above the position must be at least the threshold;
- every committed row at or below the checkpoint was handled exactly once
  (transactional) or at least once (``transactional = False``), except a row committed
  after its position was passed as a stale gap: audited, never handled (the limit);
- passed positions are audited (``ConsumerGapSkip``), visible rows never are;
- a scoped consumer handles only the rows of its scope and moves its checkpoint by
  the unscoped frontier (rows outside the scope count as rows, not gaps);
- transactional: nothing above the checkpoint is handled (a failed batch, a batch
  past its timeout and a batch of a lost owner commit nothing); at least once, a
  batch that wrote and then failed or lost the consumer leaves its effects (they
  are repeated by the next batch);
- failures: a batch that raises counts one, ``max_failures`` in a row mark the
  consumer failing, a batch that moves the checkpoint clears them;
- the operator's reset of the checkpoint back to an earlier position (Operations):
  the rows after it are handled again, once more each (exactly once per pass,
  transactional), and it clears the failures; at least once, a batch running then
  does not move the checkpoint over the operator's;
- a batch of an old generation (or of a worker that no longer runs the consumer)
  changes nothing.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Sequence

#: What the model saw happen, over every run in this process (the test prints it: the
#: interesting paths were taken: gaps passed, late rows, lost owners, failures).
EVENTS: collections.Counter[str] = collections.Counter()


class Violation(AssertionError):
    """The engine did something the documented guarantees forbid."""


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What a batch's window can show: the table as committed when the batch read it."""

    checkpoint: int
    clock: float
    #: Committed positions after the checkpoint, ascending.
    visible: tuple[int, ...]
    #: Up to ``batch_size`` of them: the window.
    window: tuple[int, ...]
    #: position -> commit time, of every committed row then.
    committed: dict[int, float]


@dataclasses.dataclass(frozen=True)
class Passed:
    """A missing position the checkpoint passed."""

    position: int
    at: float  # the model's clock then
    #: How long it had been missing then at most (the clock minus the commit of the
    #: first committed row above it).
    missing_for: float


class OrderedConsumer:
    def __init__(
        self,
        *,
        threshold: float,
        batch_size: int,
        transactional: bool,
        max_failures: int,
        scoped: bool = False,
    ) -> None:
        self.threshold = threshold
        self.scoped = scoped
        #: Committed rows outside the scope (a scoped consumer never handles them).
        self.others: set[int] = set()
        self.batch_size = batch_size
        self.transactional = transactional
        self.max_failures = max_failures
        self.clock = 0.0
        #: position -> when it was committed (the model's clock).
        self.committed: dict[int, float] = {}
        self.in_flight: set[int] = set()  # inserted in a transaction still open
        self.rolled_back: set[int] = set()  # permanent gaps (until filled explicitly)
        self.top = 0  # the highest position ever taken (committed, open or rolled back)
        self.checkpoint = 0
        self.owner = "w1"
        self.generation = 1
        self.paused = False
        self.failures = 0
        #: How many times each position's effects persisted (a ``Handled`` row each).
        self.handled: collections.Counter[int] = collections.Counter()
        #: How many times a batch moved the checkpoint over each committed row: its
        #: passes (more than one only after a reset back).
        self.passes: collections.Counter[int] = collections.Counter()
        #: Every pass over each missing position, in order.
        self.passed: dict[int, list[Passed]] = {}
        #: The operator's resets of the checkpoint to an earlier position.
        self.resets = 0
        #: Positions committed after the checkpoint had passed them.
        self.late: set[int] = set()

    # -- the table -------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        self.clock += seconds

    def take(self, position: int) -> None:
        """A position taken by an insert (committed or not)."""
        assert position not in self.committed, position
        assert position not in self.in_flight, position
        self.top = max(self.top, position)
        self.rolled_back.discard(position)

    def in_scope(self, position: int) -> bool:
        return not self.scoped or position not in self.others

    def commit(self, positions: Iterable[int], *, other: bool = False) -> None:
        """Rows become visible (``other``: outside the scope)."""
        for p in positions:
            if other:
                self.others.add(p)
            if p in self.in_flight:
                self.in_flight.remove(p)
            else:
                self.take(p)
            self.committed[p] = self.clock
            if p <= self.checkpoint:
                # Passed before it became visible: the documented limit.
                if not self.passed.get(p):
                    raise Violation(f"position {p} committed at or below the checkpoint unseen")
                self.late.add(p)
                EVENTS["late commits"] += 1

    def begin(self, position: int) -> None:
        self.take(position)
        self.in_flight.add(position)
        EVENTS["inserts held open"] += 1

    def roll_back(self, position: int) -> None:
        self.in_flight.remove(position)
        self.rolled_back.add(position)
        EVENTS["inserts rolled back"] += 1

    def holes(self) -> list[int]:
        """Positions below the top that no row holds, nor an open transaction."""
        return [
            p for p in range(1, self.top + 1) if p not in self.committed and p not in self.in_flight
        ]

    # -- what a batch may do ---------------------------------------------------------

    def snapshot(self) -> Snapshot:
        visible = tuple(sorted(p for p in self.committed if p > self.checkpoint))
        return Snapshot(
            self.checkpoint,
            self.clock,
            visible,
            visible[: self.batch_size],
            dict(self.committed),
        )

    def missing_for(self, position: int, snap: Snapshot) -> float:
        """The longest ``position`` can have been missing below a visible row at the
        snapshot: since the first commit above it (0: nothing above it yet)."""
        above = [t for p, t in snap.committed.items() if p > position]
        return snap.clock - min(above) if above else 0.0

    def must_reach(self, snap: Snapshot) -> int:
        """The end of the contiguous committed stretch after the checkpoint, in the
        window: any batch that moves on takes at least this far."""
        reach = snap.checkpoint
        for p in snap.window:
            if p != reach + 1:
                break
            reach = p
        return reach

    def check_frontier(self, snap: Snapshot, frontier: int) -> tuple[list[int], list[int]]:
        """The rows a batch from ``snap`` to ``frontier`` handles and the positions it
        passes; a ``Violation`` if no correct batch could end there."""
        cp = snap.checkpoint
        if frontier != cp and frontier not in snap.window:
            raise Violation(
                f"frontier {frontier} from {cp} is neither the checkpoint nor a row of "
                f"the window {list(snap.window)}"
            )
        if frontier < self.must_reach(snap):
            raise Violation(
                f"frontier {frontier} from {cp} stops short of the contiguous rows "
                f"{list(snap.window)} (reach {self.must_reach(snap)})"
            )
        rows = [p for p in snap.window if p <= frontier]
        gaps = [p for p in range(cp + 1, frontier + 1) if p not in snap.committed]
        for m in gaps:
            age = self.missing_for(m, snap)
            if age < self.threshold:
                state = "in flight" if m in self.in_flight else "missing"
                raise Violation(
                    f"checkpoint passed position {m} ({state}) missing for at most "
                    f"{age:g}s < threshold {self.threshold:g}s"
                )
        return rows, gaps

    def handled_prefix(self, snap: Snapshot, positions: Sequence[int]) -> None:
        """The rows a batch handled before it failed or lost the consumer: a prefix of
        its window that a correct frontier allows, in order."""
        positions = list(positions)
        if not positions:
            return
        window = [p for p in snap.window if self.in_scope(p)]
        if positions != window[: len(positions)]:
            raise Violation(f"handled {positions}, not the start of window {window} (scope)")
        self.check_frontier(snap, positions[-1])

    # -- outcomes --------------------------------------------------------------------

    def batch_moved(self, snap: Snapshot, frontier: int, handled: Sequence[int]) -> list[int]:
        """A batch from ``snap`` moved the checkpoint to ``frontier`` (or found nothing
        to take) having handled ``handled``; the positions it passed."""
        if self.paused:
            if frontier != snap.checkpoint or handled:
                raise Violation("a paused consumer moved or handled rows")
            return []
        if self.checkpoint != snap.checkpoint:
            raise Violation(
                f"a batch from {snap.checkpoint} moved the checkpoint to {frontier} over the "
                f"operator's reset to {self.checkpoint} while it ran"
            )
        rows, gaps = self.check_frontier(snap, frontier)
        scoped = [p for p in rows if self.in_scope(p)]
        if list(handled) != scoped:
            raise Violation(
                f"batch {snap.checkpoint}..{frontier} handled {list(handled)}, not {scoped}"
            )
        self.handled.update(scoped)
        self.passes.update(rows)
        for m in gaps:
            self.passed.setdefault(m, []).append(Passed(m, snap.clock, self.missing_for(m, snap)))
            if m in self.committed:  # committed while the batch ran: after its window
                self.late.add(m)
                EVENTS["late commits"] += 1
        if frontier != snap.checkpoint:
            self.checkpoint = frontier
            self.failures = 0
            EVENTS["batches moved"] += 1
            EVENTS["gap positions passed"] += len(gaps)
        else:
            EVENTS["batches idle"] += 1
        return gaps

    def batch_failed(self, snap: Snapshot, written: Sequence[int]) -> None:
        """``handle_batch`` wrote ``written`` then raised (or ran past its timeout,
        transactional): the checkpoint stays; at least once, the writes stay."""
        self.handled_prefix(snap, written)
        if self.transactional:
            EVENTS["failed batches rolled back"] += 1
        else:
            self.handled.update(written)
            EVENTS["failed batches, effects kept"] += 1
        self.failures += 1

    def batch_lost(self, snap: Snapshot, written: Sequence[int]) -> None:
        """The consumer changed owner, or the operator reset its checkpoint, while the
        batch ran (at least once: its writes are done, its checkpoint move is
        refused)."""
        assert not self.transactional
        self.handled_prefix(snap, written)
        self.handled.update(written)
        EVENTS["batches refused midway (owner or reset)"] += 1

    def reset(self, position: int) -> None:
        """The operator moves the checkpoint back to ``position``."""
        assert position <= self.checkpoint
        self.resets += position < self.checkpoint
        self.checkpoint = position
        self.failures = 0
        # Rows after it are read again: a late row there is now just a row.
        self.late = {p for p in self.late if p <= position}
        EVENTS["resets"] += 1

    @property
    def failing(self) -> bool:
        return self.failures >= self.max_failures

    def change_owner(self, worker: str) -> None:
        self.owner = worker
        self.generation += 1

    # -- the guarantees --------------------------------------------------------------

    def check(self) -> None:
        """What must hold between any two steps, whatever the engine did."""
        for p in self.handled.keys() | self.passes.keys():
            count, passes = self.handled[p], self.passes[p] if self.in_scope(p) else 0
            if count and not self.in_scope(p):
                raise Violation(f"row {p}, outside the scope, was handled")
            if p in self.late and count:
                raise Violation(f"late row {p} (committed after it was passed) was handled")
            if self.transactional and count != passes:
                raise Violation(
                    f"row {p} handled {count} times, passed {passes} (transactional: "
                    "exactly once per pass; nothing a batch that did not commit handled)"
                )
            if count < passes:
                raise Violation(f"row {p} handled {count} times, passed {passes}")
        for p in self.committed:
            if p <= self.checkpoint and p not in self.late and not self.passes[p]:
                raise Violation(f"committed row {p} at or below the checkpoint never handled")
        for p in self.late:
            if not self.passed.get(p):
                raise Violation(f"late row {p} was not passed as a gap")
        for passes in self.passed.values():
            for gap in passes:
                if gap.missing_for < self.threshold:
                    raise Violation(f"position {gap.position} passed before it was stale")
