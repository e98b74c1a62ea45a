"""The Django connections of a worker process's threads: which threads opened one
(only those have one to look after between jobs), how a long-lived thread looks
after its own, and how many connections the whole process holds (the registry's
``num_connections``, docs/operations.md § The connection budget)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

#: ``opened`` is set in each thread that opened a Django database connection: only
#: those have one to look after (``close_old_connections`` after a job costs a fifth
#: of a no-op job's time in the handler thread).
_orm = threading.local()
#: Every database wrapper of this process that ever connected (Django's own, one per
#: thread and alias, and our private ones): what ``open_connections`` counts.
_wrappers: weakref.WeakSet[BaseDatabaseWrapper] = weakref.WeakSet()
_wrappers_lock = threading.Lock()


def _note_connection(sender: Any, connection: Any = None, **kwargs: Any) -> None:
    _orm.opened = True
    if connection is not None:
        with _wrappers_lock:
            _wrappers.add(connection)


connection_created.connect(_note_connection, dispatch_uid="django_dbworker.db")


def open_connections() -> int:
    """The database connections this process holds open now, in every thread: our
    private ones, the listener's, Django's per-thread ones (handlers that use the ORM,
    consumers), and each of Django's connection pools at its current size."""
    with _wrappers_lock:
        wrappers = list(_wrappers)
    count = 0
    pools: dict[int, Any] = {}
    for wrapper in wrappers:
        options = wrapper.settings_dict.get("OPTIONS") or {}
        if options.get("pool"):
            pool = getattr(type(wrapper), "_connection_pools", {}).get(wrapper.alias)
            if pool is not None:
                pools[id(pool)] = pool
            continue
        raw = wrapper.connection
        if raw is not None and not getattr(raw, "closed", False):
            count += 1
    for pool in pools.values():
        count += int(pool.get_stats().get("pool_size", 0))
    return count


def orm_used() -> bool:
    """Whether the calling thread ever opened one of Django's own connections."""
    return getattr(_orm, "opened", False)


def recycle_connections() -> None:
    """Look after the Django connections of a long-lived worker thread (the dispatcher
    runs ``pre_dequeue`` and ``get_queryset`` there) between two passes.

    One that broke (a failover, ``pg_terminate_backend``) is closed, so the next
    pass opens a new one instead of failing for good; a pooled one goes back to
    Django's pool; one past a positive ``CONN_MAX_AGE`` is closed as Django would
    at the end of a request. With ``CONN_MAX_AGE = 0`` and no pool a healthy
    connection is kept: a pass is not a request, and reconnecting at every claim
    would cost more than the claim.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or conn.in_atomic_block:
            continue
        settings_dict = conn.settings_dict
        if (settings_dict.get("OPTIONS") or {}).get("pool") or settings_dict.get("CONN_MAX_AGE"):
            conn.close_if_unusable_or_obsolete()
        elif conn.errors_occurred:
            if conn.is_usable():
                conn.errors_occurred = False
            else:
                conn.close()
