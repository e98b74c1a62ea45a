"""Wake-ups on PostgreSQL, the enqueue half: NOTIFY when jobs become claimable.

The LISTEN half is ``runtime.listener``.

Enqueueing through the ORM (``save()``, ``create()``, ``bulk_create()``) and the
queryset operations that make jobs claimable (``retry()``, ``run_now()``) send
``pg_notify('dbworker', <table>)`` on the same connection, so the notification
is delivered when the enqueueing transaction commits, and never if it rolls
back. PostgreSQL folds identical notifications of one transaction into one: a
``bulk_create`` of 10,000 jobs wakes each worker once.

Workers keep one extra connection that LISTENs (a ``Listener`` thread), through
``DBWORKER["LISTEN_DATABASE"]`` when set. A notification only makes the worker's
next claim for that table due now; many arriving while a claim runs fold into
one more claim (that is the debounce), and a worker with no free handler slot
ignores them. Polling stays on as the fallback for everything a notification
does not cover: jobs inserted by plain SQL (call ``notify_workers()`` after
committing), ``process_after`` coming due, poolers that cannot LISTEN (PgBouncer
in transaction mode: the listener's probe finds out), a lost listener
connection. ``DBWORKER["NOTIFY"] = False`` turns both sides off.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connections, router, transaction
from django.db.models import Model

from .. import conf

CHANNEL = "dbworker"
#: The payload that wakes every table a worker serves (a resumed handler or queue).
WAKE_ALL = "*"
NOTIFY_SQL = "SELECT pg_notify(%(channel)s, %(table)s)"


#: What wakes the dispatchers running in this process (``on_notify(table)`` of each).
_here: set[Callable[[str], None]] = set()
_here_lock = threading.Lock()


def wake_here(wake: Callable[[str], None]) -> Callable[[], None]:
    """Call ``wake(table)`` when this process enqueues into ``table`` where there is no
    ``NOTIFY``; returns what undoes it."""
    with _here_lock:
        _here.add(wake)

    def undo() -> None:
        with _here_lock:
            _here.discard(wake)

    return undo


def _wake_here_at_commit(table: str, alias: str) -> None:
    if not _here or not conf.get("NOTIFY"):
        return

    def wake() -> None:
        with _here_lock:
            wakes = list(_here)
        for each in wakes:
            each(table)

    transaction.on_commit(wake, using=alias)


def enabled(alias: str) -> bool:
    return connections[alias].vendor == "postgresql" and bool(conf.get("NOTIFY"))


def listen_alias(alias: str) -> str:
    """The database alias the workers of ``alias``'s job tables LISTEN through:
    ``DBWORKER["LISTEN_DATABASE"]`` (one alias for every job database, or a dict from
    the job tables' alias to the one to LISTEN through), else ``alias`` itself."""
    setting = conf.get("LISTEN_DATABASE")
    if isinstance(setting, dict):
        return str(setting.get(alias, alias))
    return str(setting) if setting else alias


def listen_alias_set(alias: str) -> bool:
    """Whether ``DBWORKER["LISTEN_DATABASE"]`` names the alias to LISTEN through for
    ``alias``'s job tables (possibly ``alias`` itself: behind a pooler in session mode,
    the user's word that a LISTEN stays on the listener's own server session)."""
    setting = conf.get("LISTEN_DATABASE")
    if isinstance(setting, dict):
        return alias in setting
    return bool(setting)


def notify_workers(model: type[Model], using: str | None = None) -> None:
    """Wake the workers of ``model`` now (at commit, inside a transaction).

    The ORM paths call this for you; call it after enqueueing with plain SQL.
    Off PostgreSQL it wakes only the workers of this process; with
    ``DBWORKER["NOTIFY"] = False``, none.
    """
    alias = using or router.db_for_write(model)
    if not enabled(alias):
        _wake_here_at_commit(model._meta.db_table, alias)
        return
    with connections[alias].cursor() as cursor:
        cursor.execute(NOTIFY_SQL, {"channel": CHANNEL, "table": model._meta.db_table})


def insert_notifying(obj: Model, using: str) -> None:
    """INSERT ``obj`` and wake the workers of its table in one statement (PostgreSQL
    with ``NOTIFY`` on; elsewhere ``save_base`` alone, without a NOTIFY). In
    autocommit that is one round trip and one commit instead of two each. Like
    ``bulk_create``, it sends no ``pre_save``/``post_save`` signals."""
    from django.db.models.sql import InsertQuery

    meta = obj._meta
    if not enabled(using):
        obj.save_base(using=using, force_insert=True)
        _wake_here_at_commit(meta.db_table, using)
        return
    fields = [
        f
        for f in meta.local_concrete_fields
        if not getattr(f, "generated", False) and not (f is meta.auto_field and obj.pk is None)
    ]
    query = InsertQuery(obj.__class__)
    query.insert_values(fields, [obj])
    compiler = query.get_compiler(using=using)
    compiler.returning_fields = [meta.pk]
    ((insert, params),) = compiler.as_sql()
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"WITH inserted AS ({insert}) SELECT inserted.*, pg_notify(%s, %s) FROM inserted",
            (*params, CHANNEL, meta.db_table),
        )
        obj.pk = cursor.fetchone()[0]
    obj._state.adding = False
    obj._state.db = using
