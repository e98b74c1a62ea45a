"""Wake-ups on PostgreSQL, the worker's half: LISTEN, and a claim when told.

Workers keep one extra connection that LISTENs (a ``Listener`` thread). A
notification only makes the worker's next claim for that table due now; many
arriving while a claim runs fold into one more claim (that is the debounce),
and a worker with no free handler slot ignores them. Polling stays on as the
fallback for everything a notification does not cover (see ``sql.notify``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ..sql.connection import private_wrapper
from ..sql.notify import CHANNEL, WAKE_ALL
from .backoff import Backoff

logger = logging.getLogger("django_dbworker.notify")


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
        self._wrapper = private_wrapper(self.alias)
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
        while not self._stopping.is_set():  # a short timeout: stop() is seen at once
            for note in raw.notifies(timeout=0.25):
                if note.payload in self.tables:
                    self.on_notify(note.payload)
                elif note.payload == WAKE_ALL:  # a handler or queue was resumed
                    for table in self.tables:
                        self.on_notify(table)

    def _close(self) -> None:
        wrapper, self._wrapper = self._wrapper, None
        if wrapper is not None:
            try:
                wrapper.close()
            except Exception:
                logger.debug("closing the listener connection failed", exc_info=True)
