"""What operators do to consumers (the admin and ``dbworker_consumers``): pause,
resume, reset a checkpoint; each recorded in the audit trail (``AuditEntry``)."""

from __future__ import annotations

from django.db import transaction
from django.db.models import QuerySet
from django.db.models.functions import Now

from ..control.models import AuditEntry
from .models import ConsumerCheckpoint


def set_paused(rows: QuerySet[ConsumerCheckpoint], paused: bool, actor: str) -> int:
    alias = rows.db
    with transaction.atomic(using=alias):
        names = list(rows.exclude(paused=paused).values_list("name", flat=True))
        ConsumerCheckpoint.objects.using(alias).filter(name__in=names).update(
            paused=paused, updated_at=Now()
        )
        for name in names:
            AuditEntry.record(alias, actor, "pause" if paused else "resume", f"consumer {name}", "")
    return len(names)


def reset_checkpoint(name: str, position: int, actor: str, using: str = "default") -> int:
    """Move ``name``'s checkpoint to ``position`` (rows after it are handled again, or
    rows up to it are passed); the old position. Waits for a running batch (the row
    lock) and clears the failing state."""
    with transaction.atomic(using=using):
        row = ConsumerCheckpoint.objects.using(using).select_for_update().get(name=name)
        old = row.position
        ConsumerCheckpoint.objects.using(using).filter(pk=row.pk).update(
            position=position, failures=0, failing=False, last_error="", updated_at=Now()
        )
        AuditEntry.record(
            using, actor, "reset checkpoint", f"consumer {name}", f"{old} → {position}"
        )
    return old
