"""Pausing and resuming a handler, or one queue of it, from code (the admin and
``manage.py dbworker`` call these too)."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.db import IntegrityError, connections, transaction

from ..databases import everywhere, pause_alias
from ..sql.notify import CHANNEL, NOTIFY_SQL, WAKE_ALL, enabled
from .models import AuditEntry, Pause

if TYPE_CHECKING:
    from ..handler import Handler

logger = logging.getLogger("django_dbworker.control")


def pause(name: str, *, by: str = "", reason: str = "", source: str = "code") -> bool:
    """Pause ``name`` (a handler's name, or ``<handler name>:<queue>``, or
    ``tasks:<backend>:<queue>``): from the commit on, no claim takes its jobs; running
    jobs finish. False if it was paused already. The pause (and its audit entry) is
    written in the database of those jobs, where the claim reads it; a name no handler
    known here has is paused in every database that holds job tables."""
    alias = pause_alias(name)
    done = False
    for where in [alias] if alias is not None else everywhere(Pause):
        try:
            with transaction.atomic(using=where):
                Pause.objects.using(where).create(name=name, paused_by=by, reason=reason)
                detail = f"{source}: {reason}" if reason else source
                AuditEntry.record(where, by, "pause", name, detail)
        except IntegrityError:
            continue
        done = True
    if done:
        logger.info("%s paused by %s (%s)", name, by or "?", source)
    return done


def resume(name: str, *, by: str = "", source: str = "code") -> bool:
    """Resume ``name`` and wake idle workers at once. False if it was not paused."""
    done = False
    for alias in everywhere(Pause):
        with transaction.atomic(using=alias):
            deleted, _ = Pause.objects.using(alias).filter(name=name).delete()
            if not deleted:
                continue
            AuditEntry.record(alias, by, "resume", name, source)
            if enabled(alias):
                with connections[alias].cursor() as cursor:
                    cursor.execute(NOTIFY_SQL, {"channel": CHANNEL, "table": WAKE_ALL})
        done = True
    if done:
        logger.info("%s resumed by %s (%s)", name, by or "?", source)
    return done


def paused() -> dict[str, Pause]:
    """What is paused, by name (in every database that holds job tables)."""
    return {p.name: p for alias in everywhere(Pause) for p in Pause.objects.using(alias)}


def pause_names(handlers: Sequence[Handler]) -> list[str]:
    """The names a pause of ``handlers`` can take that are known in advance: each
    handler's, and each queue of a task handler (any other queue of a handler with a
    ``queue_field`` can be paused too)."""
    names = {handler.get_name() for handler in handlers}
    for handler in handlers:
        if handler.queue_field:
            queues = getattr(handler, "queues", None) or ()  # a task handler's
            names.update(handler.queue_pause_prefix() + queue for queue in queues)
    return sorted(names)


def pause_name_problem(name: str, handlers: Sequence[Handler]) -> str | None:
    """None if ``name`` pauses one of ``handlers``, or a queue of one with a
    ``queue_field`` (of a task handler: one of its queues); else one line saying so,
    with the closest known name."""
    known = pause_names(handlers)
    if name in known:
        return None
    for handler in handlers:
        prefix = handler.queue_pause_prefix()
        any_queue = handler.queue_field and not getattr(handler, "queues", None)
        if any_queue and name.startswith(prefix) and len(name) > len(prefix):
            return None
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f"{name!r} names no handler or queue: did you mean {close[0]!r}?"
    listed = ", ".join(known) or "none: no handler in DBWORKER['HANDLERS'], none run yet"
    return f"{name!r} names no handler or queue (known: {listed})"
