"""The ``Consumer`` base class: what a user subclasses, with its options."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from django.db import models
from django.db.models import Q


class Consumer:
    """Walks an append-only table in position order, one batch at a time.

    ``handle_batch(rows)`` gets the rows of ``scope`` in the next safe stretch of
    positions (possibly none: then it is not called). In the default transactional mode
    it runs inside the transaction that moves the checkpoint: what it writes to the
    same database commits with the checkpoint or not at all (exactly once). With
    ``transactional = False`` it runs outside any transaction and the checkpoint moves
    after it returns: at least once, for side effects outside the database.
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
    #: Seconds one batch may take; a longer one is rolled back and counts as failed.
    batch_timeout: ClassVar[float] = 30.0
    #: False: at-least-once (handle_batch outside the checkpoint's transaction).
    transactional: ClassVar[bool] = True
    #: Failed batches in a row after which the consumer is marked failing.
    max_failures: ClassVar[int] = 5
    #: Seconds between polls when idle (NOTIFY wakes it sooner on PostgreSQL).
    poll_interval: ClassVar[float] = 1.0
    #: Seconds a missing position is waited for before it is passed (and audited).
    #: None: DBWORKER["CONSUMER_GAP_THRESHOLD"].
    gap_threshold: ClassVar[float | None] = None
    #: The checkpoint a new consumer starts from (0: from the first row).
    start_position: ClassVar[int] = 0

    def handle_batch(self, rows: Sequence[Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define handle_batch(rows)")

    @property
    def label(self) -> str:
        return f"consumer:{self.name}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
