"""Wake-ups on PostgreSQL: NOTIFY when jobs become claimable, LISTEN in the worker.

Enqueueing through the ORM (``save()``, ``create()``, ``bulk_create()``) and the
queryset operations that make jobs claimable (``retry()``, ``run_now()``) send
``pg_notify('dbworker', <table>)`` on the same connection, so the notification
is delivered when the enqueueing transaction commits, and never if it rolls
back. PostgreSQL folds identical notifications of one transaction into one: a
``bulk_create`` of 10,000 jobs wakes each worker once.

Workers keep one extra connection that LISTENs (a ``Listener`` thread). A
notification only makes the worker's next claim for that table due now; many
arriving while a claim runs fold into one more claim (that is the debounce),
and a worker with no free handler slot ignores them. Polling stays on as the
fallback for everything a notification does not cover: jobs inserted by plain
SQL (call ``notify_workers()`` after committing), ``process_after`` coming due,
poolers that cannot LISTEN (PgBouncer in transaction mode), a lost listener
connection. ``DBWORKER["NOTIFY"] = False`` turns both sides off.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections, router
from django.db.models import Model

from . import conf
from .backoff import Backoff

logger = logging.getLogger(__name__)

CHANNEL = "dbworker"
NOTIFY_SQL = "SELECT pg_notify(%s, %s)"


def enabled(alias: str) -> bool:
    return connections[alias].vendor == "postgresql" and bool(conf.get("NOTIFY"))


def notify_workers(model: type[Model], using: str | None = None) -> None:
    """Wake the workers of ``model`` now (at commit, inside a transaction).

    The ORM paths call this for you; call it after enqueueing with plain SQL.
    Does nothing off PostgreSQL or with ``DBWORKER["NOTIFY"] = False``.
    """
    alias = using or router.db_for_write(model)
    if not enabled(alias):
        return
    with connections[alias].cursor() as cursor:
        cursor.execute(NOTIFY_SQL, [CHANNEL, model._meta.db_table])


class Listener(threading.Thread):
    """LISTENs on one connection and calls ``on_notify(table)`` for each notification.

    ``connected`` is set while the LISTEN connection is up: the worker then polls
    at its slowest interval. On any error the connection is dropped and opened
    again with backoff, and the worker polls at its normal pace meanwhile.
    """

    def __init__(self, alias: str, tables: Iterable[str], on_notify: Callable[[str], None]) -> None:
        super().__init__(name="dbworker-listener", daemon=True)
        self.alias = alias
        self.tables = set(tables)
        self.on_notify = on_notify
        self.connected = threading.Event()
        self._stopping = threading.Event()
        self._wrapper: Any = None
        self._backoff = Backoff()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen()
            except Exception as exc:
                delay = self._backoff.next()
                logger.warning(
                    "LISTEN connection lost (%s); polling, reconnecting in %.1fs", exc, delay
                )
                self._stopping.wait(delay)
            finally:
                self.connected.clear()
                self._close()

    def _listen(self) -> None:
        self._wrapper = connections.create_connection(self.alias)
        self._wrapper.inc_thread_sharing()
        self._wrapper.ensure_connection()
        raw = self._wrapper.connection
        raw.autocommit = True
        raw.execute("SELECT set_config('application_name', 'dbworker listener', false)")
        raw.execute(f"LISTEN {CHANNEL}")
        self.connected.set()
        self._backoff.reset()
        # The worker may have missed notifications while this was down: claim now.
        for table in self.tables:
            self.on_notify(table)
        while not self._stopping.is_set():
            for note in raw.notifies(timeout=1.0):
                if note.payload in self.tables:
                    self.on_notify(note.payload)

    def _close(self) -> None:
        wrapper, self._wrapper = self._wrapper, None
        if wrapper is not None:
            try:
                wrapper.close()
            except Exception:
                logger.debug("closing the listener connection failed", exc_info=True)
