"""Switching periodic schedules on and off, from code (the admin and ``manage.py
dbworker`` call this too)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import router, transaction

from ..databases import everywhere
from .models import AuditEntry, Schedule

logger = logging.getLogger("django_dbworker.control")


def schedule_alias(name: str) -> str | None:
    """The database that holds schedule ``name`` (beside its handler's jobs), or None."""
    for alias in everywhere(Schedule):
        if Schedule.objects.using(alias).filter(name=name).exists():
            return alias
    return None


def set_schedule_enabled(name: str, enabled: bool, *, by: str = "", source: str = "code") -> bool:
    """Switch schedule ``name`` on or off; False if no worker has registered it yet or
    it was so already. A schedule switched on goes on from its next tick: the ticks
    it had while off are not run."""
    alias = schedule_alias(name) or router.db_for_write(Schedule)
    with transaction.atomic(using=alias):
        changed = (
            Schedule.objects.using(alias)
            .filter(name=name)
            .exclude(enabled=enabled)
            # Switched on, it starts afresh from its next tick (see Scheduler).
            .update(enabled=enabled, **({"next_tick": None} if enabled else {}))
        )
        if changed:
            action = "enable schedule" if enabled else "disable schedule"
            AuditEntry.record(alias, by, action, name, source)
    if changed:
        logger.info(
            "schedule %s %s by %s (%s)", name, "on" if enabled else "off", by or "?", source
        )
    return bool(changed)


def delete_schedules(names: Iterable[str], *, by: str = "", source: str = "code") -> list[str]:
    """Delete the schedules ``names``, each written to the audit trail; the names deleted.

    Only for schedules no worker declares any more: a worker that declares one registers
    it again at its next pass, switched on (the admin refuses those, see
    ``admin.schedules``)."""
    alias = router.db_for_write(Schedule)
    deleted = []
    with transaction.atomic(using=alias):
        for name in dict.fromkeys(names):
            if Schedule.objects.using(alias).filter(name=name).delete()[0]:
                AuditEntry.record(alias, by, "delete schedule", name, source)
                deleted.append(name)
    for name in deleted:
        logger.info("schedule %s deleted by %s (%s)", name, by or "?", source)
    return deleted
