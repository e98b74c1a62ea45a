"""The consumers' tables: one checkpoint row per consumer (progress, assignment, the
running process, failure state) and the audit of passed gaps.

A checkpoint row is the consumer's lock: every batch of a transactional consumer
starts by updating it (guarded by owner, generation and running process) and ends by
moving ``position`` in the same transaction, so two batches of one consumer never
overlap and a batch of a process that lost the consumer commits nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import models
from django.utils import timezone

from ..conf import require_app

require_app()


class ConsumerCheckpoint(models.Model):
    name = models.CharField(max_length=200, unique=True)
    #: Every position <= this one was handled (or passed as a gap).
    position = models.BigIntegerField(default=0)
    #: The worker the leader assigned the consumer to.
    owner = models.CharField(max_length=255, blank=True, default="")
    #: Bumped by every change of owner: the fence of batches and checkpoint updates.
    generation = models.BigIntegerField(default=0)
    #: The worker that runs the consumer now (empty: nobody). Another worker starts it
    #: only once this one has stopped or its registry heartbeat is older than the lease.
    running_by = models.CharField(max_length=255, blank=True, default="")
    paused = models.BooleanField(default=False)
    failing = models.BooleanField(default=False)
    failures = models.PositiveIntegerField(default=0, help_text="Failed batches in a row.")
    last_error = models.TextField(blank=True, default="")
    #: The highest position seen and when (lag in rows and age, for the admin).
    head = models.BigIntegerField(default=0)
    last_batch_at = models.DateTimeField(null=True, blank=True)
    #: When the consumer was last seen with nothing beyond its checkpoint (an empty
    #: window, or a batch that started when the previous one had taken all it saw): it
    #: has been behind since then while the table's head is past the checkpoint.
    caught_up_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)
    #: The consumed model (``app_label.ModelName``) and its position field, written by
    #: the workers that run the consumer: where readers (the status command, the admin,
    #: the metrics) read the table's head from.
    source = models.CharField(max_length=255, blank=True, default="", db_default="")
    position_field = models.CharField(max_length=255, blank=True, default="", db_default="")

    class Meta:
        verbose_name = "consumer"
        verbose_name_plural = "consumers"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def lag(self) -> int:
        """Positions between the checkpoint and the head its batches last saw (what
        ``consumers.status`` reads from the table itself is the one to alert on)."""
        return max(self.head - self.position, 0)

    def behind_for(self, now: datetime, head: int | None = None) -> timedelta | None:
        """How long the consumer has been behind ``head`` (default: the head it saw):
        since it was last seen caught up (None: it is not behind)."""
        if max((self.head if head is None else head) - self.position, 0) == 0:
            return None
        return max(now - (self.caught_up_at or self.updated_at), timedelta(0))


class ConsumerGapSkip(models.Model):
    """Positions a consumer passed without seeing them: missing for longer than the
    stale-gap threshold (rolled back, or committed too late)."""

    consumer = models.CharField(max_length=200, db_index=True)
    first_position = models.BigIntegerField()
    last_position = models.BigIntegerField()
    waited = models.FloatField(help_text="Seconds the first position was waited for.")
    at = models.DateTimeField(default=timezone.now, db_index=True)
    worker = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        verbose_name = "gap skip"
        verbose_name_plural = "gap skips"
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.consumer}: {self.first_position}..{self.last_position}"
