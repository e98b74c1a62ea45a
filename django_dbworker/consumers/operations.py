"""What operators do to consumers (the admin and ``dbworker_consumers``): pause,
resume, reset a checkpoint, delete a retired consumer's checkpoint; each recorded in
the audit trail (``AuditEntry``)."""

from __future__ import annotations

from django.db import transaction
from django.db.models import QuerySet

from ..control.models import AuditEntry
from ..sql.mysql_session import UTCNow
from .models import ConsumerCheckpoint
from .status import declared


def set_paused(rows: QuerySet[ConsumerCheckpoint], paused: bool, actor: str) -> int:
    alias = rows.db
    with transaction.atomic(using=alias):
        names = list(rows.exclude(paused=paused).values_list("name", flat=True))
        ConsumerCheckpoint.objects.using(alias).filter(name__in=names).update(
            paused=paused, updated_at=UTCNow()
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
            position=position, failures=0, failing=False, last_error="", updated_at=UTCNow()
        )
        AuditEntry.record(
            using, actor, "reset checkpoint", f"consumer {name}", f"{old} → {position}"
        )
    return old


def delete_retired(rows: QuerySet[ConsumerCheckpoint], actor: str) -> list[str]:
    """Delete the checkpoints of ``rows`` that no live worker declares (retired
    consumers: their rows would otherwise show a growing lag for ever); the names kept
    because a live worker runs them. A worker that runs a consumer whose row is gone
    creates it again at its ``start_position``."""
    alias = rows.db
    with transaction.atomic(using=alias):
        names = list(rows.values_list("name", flat=True))
        live = declared(alias, names)
        gone = [name for name in names if name not in live]
        ConsumerCheckpoint.objects.using(alias).filter(name__in=gone).delete()
        for name in gone:
            AuditEntry.record(alias, actor, "delete checkpoint", f"consumer {name}", "")
    return sorted(live)
