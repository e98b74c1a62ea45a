"""What a consumer's state is now, as the status command, the admin and the metrics
show it: the lag against the consumed table's head read at that moment, not only
what the consumer's own batches saw, so a consumer that no process runs, or whose
batch hangs, shows a growing lag and age.

The head is ``MAX(position_field)`` of the consumed model (named in the checkpoint
row by the workers that run it): the position field is unique, so its index answers
with one descent from its high end (PostgreSQL: an index-only scan backward under
``LIMIT 1``; SQLite and MySQL: their min/max optimisation), whatever the table's size.
One such statement per consumed table, and one read of the worker registry, per call.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import apps
from django.db import models
from django.db.models import Max
from django.utils import timezone

from .. import conf
from ..models import WorkerProcess
from ..sql.mysql_session import UTCNow
from .assignment import live_workers
from .models import ConsumerCheckpoint

logger = logging.getLogger("django_dbworker.consumers")


def table_head(model: type[models.Model], field: str, alias: str) -> int:
    """The highest position of ``model`` (0: empty), through its default manager (the
    rows the consumer's windows read)."""
    value = model._default_manager.using(alias).aggregate(head=Max(field))["head"]
    return int(value or 0)


def source_of(row: ConsumerCheckpoint) -> tuple[type[models.Model], str] | None:
    """The consumed model and position field a checkpoint row names (None: unknown, or
    not a model of this project)."""
    if not row.source or not row.position_field:
        return None
    try:
        model = apps.get_model(row.source)
    except (LookupError, ValueError):
        return None
    return model, row.position_field


@dataclasses.dataclass(frozen=True)
class ConsumerStatus:
    row: ConsumerCheckpoint
    #: The consumed table's head now (the head the batches saw when it cannot be read).
    head: int
    #: A live worker runs it (``running_by`` names a worker heartbeating within the
    #: lease).
    running: bool
    now: datetime.datetime

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def lag(self) -> int:
        """Positions between the checkpoint and the head (rows, where positions are
        dense)."""
        return max(self.head - self.row.position, 0)

    @property
    def behind_for(self) -> datetime.timedelta | None:
        """Since the consumer was last seen with nothing beyond its checkpoint (None:
        at the head)."""
        return self.row.behind_for(self.now, self.head)

    @property
    def state(self) -> str:
        """``paused``, ``failing`` (``max_failures`` batches in a row failed or hung),
        ``stopped`` (no live worker runs it) or ``ok``."""
        row = self.row
        if row.paused:
            return "paused"
        if row.failing:
            return "failing"
        return "ok" if self.running else "stopped"


def live_worker_ids(alias: str, lease: float | None = None) -> set[str]:
    """Ids of the workers whose registry heartbeat is younger than the consumer lease."""
    seconds = float(lease if lease is not None else conf.get("CONSUMER_LEASE"))
    return set(
        WorkerProcess.objects.using(alias)
        .filter(last_heartbeat_at__gte=UTCNow() - datetime.timedelta(seconds=seconds))
        .values_list("worker_id", flat=True)
    )


def statuses(rows: Iterable[ConsumerCheckpoint], alias: str) -> list[ConsumerStatus]:
    """The status of each checkpoint row (read from ``alias``)."""
    rows = list(rows)
    if not rows:
        return []
    live = live_worker_ids(alias)
    heads: dict[tuple[Any, str], int | None] = {}
    found: list[ConsumerStatus] = []
    now = timezone.now()
    for row in rows:
        head = row.head
        source = source_of(row)
        if source is not None:
            if source not in heads:
                try:
                    heads[source] = table_head(*source, alias)
                except Exception as exc:  # a dropped table, a renamed field
                    logger.warning("consumer %s: cannot read its table's head: %s", row.name, exc)
                    heads[source] = None
            head = max(head, heads[source] or 0)
        found.append(
            ConsumerStatus(row, head, bool(row.running_by) and row.running_by in live, now)
        )
    return found


def declared(alias: str, names: Sequence[str]) -> set[str]:
    """Which of ``names`` a live worker declares (runs, or may be given)."""
    capable = live_workers(alias, float(conf.get("CONSUMER_LEASE")))
    return {name for name in names if capable.get(name)}
