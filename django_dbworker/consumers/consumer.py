"""The ``Consumer`` base class: what a user subclasses, with its options; ``Batch``,
what ``handle_batch`` is told about its batch through ``self.batch`` (the fencing
token)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from django.db import models
from django.db.models import Q


@dataclasses.dataclass(frozen=True)
class Batch:
    """What ``handle_batch`` is told about its batch (``self.batch``).

    ``generation`` is the fencing token: it grows with every change of the consumer's
    owner, so a sink that keeps the highest generation it has accepted per consumer
    (and refuses lower ones, atomically with the write) refuses the late writes of a
    process that lost the consumer while it was stopped or hung. ``still_owner()``
    checks the checkpoint row now (one query): a cheap check before a side effect, not
    a fence (the process may stop right after it).
    """

    consumer: str
    generation: int
    worker_id: str
    #: The positions this batch covers: the old checkpoint + 1 … the new checkpoint.
    first_position: int
    last_position: int
    _check: Callable[[], bool] = dataclasses.field(repr=False, compare=False)

    def still_owner(self) -> bool:
        """Whether this process still owns the consumer in this generation."""
        return self._check()


_current = threading.local()


def current_batch() -> Batch | None:
    """The batch the calling thread's ``handle_batch`` runs (None: none)."""
    return getattr(_current, "batch", None)


def set_current_batch(batch: Batch | None) -> None:
    _current.batch = batch


class Consumer:
    """Walks an append-only table in position order, one batch at a time.

    ``handle_batch(rows)`` gets the rows of ``scope`` in the next safe stretch of
    positions (possibly none: then it is not called). In the default transactional mode
    it runs inside the transaction that moves the checkpoint: what it writes to the
    same database commits with the checkpoint or not at all (exactly once). With
    ``transactional = False`` it runs outside any transaction and the checkpoint moves
    after it returns: at least once, for side effects outside the database. Inside it,
    ``self.batch`` tells the batch's fencing token (``Batch``).
    """

    #: Checkpoint and assignment identity: keep it stable (a new name starts over).
    name: ClassVar[str] = ""
    #: The consumed model (an append-only table).
    model: ClassVar[type[models.Model] | None] = None
    #: A unique, sequence-backed, increasing integer field.
    position_field: ClassVar[str] = "id"
    #: Rows handed to handle_batch (the frontier stays unscoped). None: all rows.
    scope: ClassVar[Q | None] = None
    #: Positions read per batch (the window; also the most rows per handle_batch).
    batch_size: ClassVar[int] = 100
    #: Seconds one batch may take. Past it a batch counts as failed (again at each
    #: further multiple while it runs; after ``max_failures`` the worker process ends).
    #: Transactional: it is rolled back. At least once: one that returns is checkpointed.
    batch_timeout: ClassVar[float] = 30.0
    #: False: at-least-once (handle_batch outside the checkpoint's transaction).
    transactional: ClassVar[bool] = True
    #: Failed batches in a row after which the consumer is marked failing.
    max_failures: ClassVar[int] = 5
    #: Seconds between polls when idle (NOTIFY wakes it sooner on PostgreSQL).
    poll_interval: ClassVar[float] = 1.0
    #: Longest wait between the polls of an idle consumer: each poll that finds nothing
    #: doubles the wait from ``poll_interval`` up to this; rows or a wake-up start over.
    #: None: ``poll_interval`` (no back-off).
    max_poll_interval: ClassVar[float | None] = 5.0
    #: Seconds to rest after each batch that advanced while catching up (0: none).
    batch_pause: ClassVar[float] = 0.0
    #: Seconds a missing position is waited for before it is passed (and audited).
    #: None: DBWORKER["CONSUMER_GAP_THRESHOLD"].
    gap_threshold: ClassVar[float | None] = None
    #: The checkpoint a new consumer starts from (0: from the first row).
    start_position: ClassVar[int] = 0

    def handle_batch(self, rows: Sequence[Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define handle_batch(rows)")

    @property
    def batch(self) -> Batch:
        """The batch ``handle_batch`` is running: its generation (the fencing token),
        positions and ``still_owner()``. Only valid inside ``handle_batch``."""
        batch = current_batch()
        if batch is None:
            raise RuntimeError("self.batch is only available inside handle_batch")
        return batch

    @property
    def label(self) -> str:
        return f"consumer:{self.name}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
