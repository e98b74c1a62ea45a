"""Who runs which consumer: the leader's deterministic assignment, and starting and
stopping under the fence.

Live workers are the rows of the worker registry (``WorkerProcess``) whose heartbeat
is younger than ``DBWORKER["CONSUMER_LEASE"]``; a worker declares the consumers it
can run as ``consumer:<name>`` labels in its ``handlers``. Every
``CONSUMER_REBALANCE_INTERVAL`` each worker tries to lead: on PostgreSQL in a
transaction holding the advisory lock ``(LOCK_CLASS, LEADER_KEY)`` (not waited for:
one leader per round); on SQLite one process may run consumers (the single-process
rule: a worker there always leads). The leader sorts consumer names and assigns them
round-robin over the sorted ids of the live workers that declare each one; a changed
owner bumps the row's ``generation``.

A worker starts a consumer assigned to it only when nobody runs it
(``running_by`` empty, itself, or a worker whose heartbeat is older than the lease),
in one guarded UPDATE; it stops consumers no longer assigned to it and clears
``running_by``. Every batch re-checks owner, generation and ``running_by`` while it
holds the row (``batch``), so two processes never run batches of one consumer at
once.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence

from django.db import connections, transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from ..models import WorkerProcess
from .models import ConsumerCheckpoint

#: The advisory-lock class of consumer leadership (``sql.limits`` uses 0x64627721).
LOCK_CLASS = 0x64627763  # "dbwc"
LEADER_KEY = 1
LABEL_PREFIX = "consumer:"


def assign(names: Iterable[str], capable: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Consumer name → worker id: sorted names round-robin over the sorted live workers
    able to run each (``capable``: name → worker ids); names nobody can run are left
    out."""
    result = {}
    for index, name in enumerate(sorted(names)):
        workers = sorted(capable.get(name, ()))
        if workers:
            result[name] = workers[index % len(workers)]
    return result


def live_workers(alias: str, lease: float) -> dict[str, list[str]]:
    """Consumer name → ids of live workers that declare it."""
    rows = (
        WorkerProcess.objects.using(alias)
        .filter(last_heartbeat_at__gte=Now() - datetime.timedelta(seconds=lease))
        .values_list("worker_id", "handlers")
    )
    capable: dict[str, list[str]] = {}
    for worker_id, handlers in rows:
        for label in handlers or []:
            if isinstance(label, str) and label.startswith(LABEL_PREFIX):
                capable.setdefault(label[len(LABEL_PREFIX) :], []).append(worker_id)
    return capable


def rebalance(alias: str, lease: float) -> dict[str, str] | None:
    """Lead one round if no other worker does: reassign; the changed assignments
    (None: another worker leads now)."""
    wrapper = connections[alias]
    with transaction.atomic(using=alias):
        if wrapper.vendor == "postgresql":
            with wrapper.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = 5000")
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [LOCK_CLASS, LEADER_KEY])
                if not cursor.fetchone()[0]:
                    return None
        capable = live_workers(alias, lease)
        rows = dict(ConsumerCheckpoint.objects.using(alias).values_list("name", "owner"))
        wanted = assign(rows, capable)
        changed = {}
        for name, owner in rows.items():
            target = wanted.get(name, "")
            if target != owner:
                ConsumerCheckpoint.objects.using(alias).filter(name=name).update(
                    owner=target, generation=F("generation") + 1, updated_at=Now()
                )
                changed[name] = target
        return changed


def owned(alias: str, worker_id: str) -> dict[str, int]:
    """Name → generation of the consumers assigned to ``worker_id``."""
    return dict(
        ConsumerCheckpoint.objects.using(alias)
        .filter(owner=worker_id)
        .values_list("name", "generation")
    )


def try_start(alias: str, name: str, worker_id: str, generation: int, lease: float) -> bool:
    """Take ``running_by`` of a consumer assigned to us if nobody live runs it."""
    live = WorkerProcess.objects.using(alias).filter(
        last_heartbeat_at__gte=Now() - datetime.timedelta(seconds=lease)
    )
    free = (
        Q(running_by="")
        | Q(running_by=worker_id)
        | ~Q(running_by__in=live.exclude(worker_id=worker_id).values("worker_id"))
    )
    return bool(
        ConsumerCheckpoint.objects.using(alias)
        .filter(free, name=name, owner=worker_id, generation=generation)
        .update(running_by=worker_id, updated_at=Now())
    )


def release(alias: str, name: str, worker_id: str) -> None:
    ConsumerCheckpoint.objects.using(alias).filter(name=name, running_by=worker_id).update(
        running_by=""
    )


def ensure_rows(alias: str, consumers: Sequence[tuple[str, int]]) -> None:
    """A checkpoint row per (name, start position), created if missing."""
    existing = set(
        ConsumerCheckpoint.objects.using(alias)
        .filter(name__in=[n for n, _ in consumers])
        .values_list("name", flat=True)
    )
    ConsumerCheckpoint.objects.using(alias).bulk_create(
        [ConsumerCheckpoint(name=n, position=p) for n, p in consumers if n not in existing],
        ignore_conflicts=True,
    )
