"""Wake-ups on PostgreSQL, the worker's half: LISTEN, and a claim when told.

Workers keep one extra connection that LISTENs (a ``Listener`` thread), to the
job tables' database or, with ``DBWORKER["LISTEN_DATABASE"]``, to another alias
of it (a direct connection when the jobs go through a pooler). A notification
only makes the worker's next claim for that table due now; many arriving while
a claim runs fold into one more claim (that is the debounce), and a worker with
no free handler slot ignores them. Polling stays on as the fallback for
everything a notification does not cover (see ``sql.notify``).

Each time it connects, the listener checks that wake-ups arrive: it sends a
notification of its own through the job tables' database (where enqueueing
sends them) and waits for it; when none comes it says so once, stops listening,
and the worker polls at its base ``interval`` instead of backing off.

Behind a connection pooler it does not LISTEN unless told it may: in transaction
mode a LISTEN stays on a server session that other clients get next, and there is
no sure way to tell the modes apart from a client, nor to take a LISTEN back (an
UNLISTEN runs in whichever session is free). ``DBWORKER["LISTEN_DATABASE"]`` tells
it: a direct connection, or the pooled alias itself when the pooler is in session
mode. Without it the listener says once how to get wake-ups, and the worker polls.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..sql import pooler
from ..sql.drivers import private_wrapper
from ..sql.notify import CHANNEL, WAKE_ALL, listen_alias, listen_alias_set
from .backoff import Backoff

logger = logging.getLogger("django_dbworker.notify")

#: Seconds the listener waits for its own probe notification before it concludes
#: that wake-ups do not arrive.
PROBE_WAIT = 5.0
#: The payload prefix of probes (workers ignore payloads that name no table).
PROBE = "dbworker-probe:"
#: Times the listener's and the probe's server sessions are compared before listening.
PROBE_SAMPLES = 3
#: Tries at taking a LISTEN back from a pooled server session.
UNLISTEN_TRIES = 50
_warned: set[str] = set()
_warned_lock = threading.Lock()


def run_with_pid(raw: Any, columns: str = "", *, before: str = "", after: str = "") -> int:
    """``{before}SELECT pg_backend_pid(){columns}{after}`` on ``raw`` as one query (one
    transaction: one server session, even through a pooler in transaction mode); the
    pid of that session."""
    from psycopg import ClientCursor

    with ClientCursor(raw) as cursor:
        cursor.execute(f"{before}SELECT pg_backend_pid(){columns}{after}")
        while cursor.description is None and cursor.nextset():
            pass
        row = cursor.fetchone()
        assert row is not None
        return int(row[0])


class WakeupsUnavailable(Exception):
    """Notifications sent through the job tables' database do not reach the listener."""


class Listener(threading.Thread):
    """LISTENs on one connection and calls ``on_notify(table)`` for each notification.

    ``connected`` is set while the LISTEN connection is up and its probe came back.
    On any error the connection is dropped and opened again with backoff. When the
    probe does not come back the thread warns once, calls ``on_unavailable()`` and
    ends (``unavailable`` is set).
    """

    def __init__(
        self,
        alias: str,
        tables: Iterable[str],
        on_notify: Callable[[str], None],
        on_unavailable: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="dbworker-listener", daemon=True)
        self.alias = alias
        #: The alias the LISTEN connection goes through (``DBWORKER["LISTEN_DATABASE"]``).
        self.through = listen_alias(alias)
        self.tables = set(tables)
        self.on_notify = on_notify
        self.on_unavailable = on_unavailable
        self.connected = threading.Event()
        self.unavailable = threading.Event()
        self._stopping = threading.Event()
        self._wrapper: Any = None
        self._backoff = Backoff()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen()
            except WakeupsUnavailable as exc:
                self._give_up(str(exc))
                return
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
        self._wrapper = private_wrapper(self.through)
        self._wrapper.inc_thread_sharing()
        self._wrapper.ensure_connection()
        raw = self._wrapper.connection
        raw.autocommit = True
        pid = pooler.server_pid(raw)
        pooled = pooler.behind_pooler(raw, pid)
        if not pooled:
            pooler.session_settings(raw, "dbworker listener", None)
        elif not listen_alias_set(self.alias):
            raise WakeupsUnavailable(
                f"database {self.through!r} is reached through a connection pooler, and a "
                "LISTEN through a pooler in transaction mode would stay on a server session "
                "other clients get"
            )
        token, listening = self._probe(raw, pooled)
        deadline = time.monotonic() + PROBE_WAIT
        confirmed = False
        try:
            while not self._stopping.is_set():  # a short timeout: stop() is seen at once
                for note in raw.notifies(timeout=0.25):
                    if note.payload == token and not confirmed:
                        confirmed = True
                        self.connected.set()
                        self._backoff.reset()
                        logger.info(
                            "wake-ups: listening on database %r",
                            self.through,
                            extra={"action": "listening"},
                        )
                        # The worker may have missed notifications while this was down.
                        for table in self.tables:
                            self.on_notify(table)
                    elif note.payload in self.tables:
                        self.on_notify(note.payload)
                    elif note.payload == WAKE_ALL:  # a handler or queue was resumed
                        for table in self.tables:
                            self.on_notify(table)
                if not confirmed and time.monotonic() > deadline:
                    raise WakeupsUnavailable(
                        f"a notification sent through database {self.alias!r} did not "
                        f"reach the LISTEN connection ({self._through_text()}) within "
                        f"{PROBE_WAIT:g}s"
                    )
        finally:
            # Unconfirmed through a pooler: the LISTEN may be on a session others get.
            # (Confirmed, the session is ours: closing the connection ends the LISTEN.)
            if pooled and not confirmed:
                self._unlisten(raw, listening)

    def _probe(self, raw: Any, pooled: bool) -> tuple[str, int]:
        """LISTEN on ``raw`` and send a probe through the job tables' database: (the
        probe's payload, the pid of the server session that LISTENs).

        Through a pooler in transaction mode the LISTEN would land on a server session
        that other clients get next: the listener must then not LISTEN (or must take
        it back). Before listening it looks for proof, a few times: another client of
        the pooler (the probe's connection) gets the session the listener just used,
        or, while that client holds a session in a transaction, the listener's next
        statement runs in another session than its last. In session mode neither can
        happen. After listening, the probe also reports the session it sent from."""
        token = f"{PROBE}{secrets.token_hex(8)}"
        same_pooler = pooled and self.through == self.alias
        probe = private_wrapper(self.alias)
        try:
            probe.ensure_connection()
            other = probe.connection
            other.autocommit = True
            if same_pooler and self._sessions_shared(raw, other):
                raise WakeupsUnavailable(self._shared_text())
            listening = run_with_pid(raw, after=f"; LISTEN {CHANNEL}")
            sent = run_with_pid(other, f", pg_notify('{CHANNEL}', '{token}')")
            if same_pooler and sent == listening:
                self._unlisten(raw, listening)
                raise WakeupsUnavailable(self._shared_text())
        finally:
            probe.close()
        return token, listening

    @staticmethod
    def _sessions_shared(raw: Any, other: Any) -> bool:
        """Whether two clients of one pooler (``raw``, ``other``) ran in one server
        session, or one client in two: transaction pooling."""
        for _ in range(PROBE_SAMPLES):
            mine = run_with_pid(raw)
            theirs = run_with_pid(other, before="BEGIN; ")
            try:
                if theirs == mine or run_with_pid(raw) != mine:
                    return True
            finally:
                other.execute("COMMIT")
        return False

    def _unlisten(self, raw: Any, listening: int) -> None:
        """Take the LISTEN back from the server session ``listening``: through a pooler
        in transaction mode, the UNLISTEN runs in whichever session is free, so it is
        sent until it runs in that one (a few tries; a LISTEN left behind only makes the
        pooler drop that session's notifications with a warning)."""
        for _ in range(UNLISTEN_TRIES):
            try:
                if run_with_pid(raw, after=f"; UNLISTEN {CHANNEL}") == listening:
                    return
            except Exception:
                logger.debug("UNLISTEN failed", exc_info=True)
                return
            time.sleep(0.01)

    def _shared_text(self) -> str:
        return (
            f"database {self.through!r} is reached through a connection pooler in "
            "transaction mode (two of its clients ran in one server session)"
        )

    def _through_text(self) -> str:
        return "the same database" if self.through == self.alias else f"{self.through!r}"

    def _give_up(self, reason: str) -> None:
        self.unavailable.set()
        with _warned_lock:
            first = self.alias not in _warned
            _warned.add(self.alias)
        if first:
            logger.warning(
                "wake-ups do not work: %s. Workers poll at their interval instead of "
                "backing off. Set DBWORKER['LISTEN_DATABASE'] to a database alias that "
                "connects directly (not through the pooler), or to this alias if the "
                "pooler runs in session mode; or DBWORKER['NOTIFY'] = False.",
                reason,
                extra={"action": "wakeups_unavailable"},
            )
        if self.on_unavailable is not None:
            self.on_unavailable()

    def _close(self) -> None:
        wrapper, self._wrapper = self._wrapper, None
        if wrapper is not None:
            try:
                wrapper.close()
            except Exception:
                logger.debug("closing the listener connection failed", exc_info=True)
