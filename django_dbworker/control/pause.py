"""Pausing and resuming a handler, or one queue of it, from code (the admin and
``manage.py dbworker`` call these too)."""

from __future__ import annotations

import logging

from django.db import IntegrityError, connections, router, transaction

from ..sql.notify import CHANNEL, NOTIFY_SQL, WAKE_ALL, enabled
from .models import AuditEntry, Pause

logger = logging.getLogger("django_dbworker.control")


def pause(name: str, *, by: str = "", reason: str = "", source: str = "code") -> bool:
    """Pause ``name`` (a handler's name, or ``<handler name>:<queue>``, or
    ``tasks:<backend>:<queue>``): from the commit on, no claim takes its jobs; running
    jobs finish. False if it was paused already."""
    alias = router.db_for_write(Pause)
    try:
        with transaction.atomic(using=alias):
            Pause.objects.using(alias).create(name=name, paused_by=by, reason=reason)
            AuditEntry.record(alias, by, "pause", name, f"{source}: {reason}" if reason else source)
    except IntegrityError:
        return False
    logger.info("%s paused by %s (%s)", name, by or "?", source)
    return True


def resume(name: str, *, by: str = "", source: str = "code") -> bool:
    """Resume ``name`` and wake idle workers at once. False if it was not paused."""
    alias = router.db_for_write(Pause)
    with transaction.atomic(using=alias):
        deleted, _ = Pause.objects.using(alias).filter(name=name).delete()
        if not deleted:
            return False
        AuditEntry.record(alias, by, "resume", name, source)
        if enabled(alias):
            with connections[alias].cursor() as cursor:
                cursor.execute(NOTIFY_SQL, {"channel": CHANNEL, "table": WAKE_ALL})
    logger.info("%s resumed by %s (%s)", name, by or "?", source)
    return True


def paused() -> dict[str, Pause]:
    """What is paused, by name."""
    return {p.name: p for p in Pause.objects.using(router.db_for_read(Pause))}
