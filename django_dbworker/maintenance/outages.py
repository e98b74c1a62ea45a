"""When the resetter holds back: after its database failed (or, on SQLite, a statement
waited long for the write lock), live workers may not have written their heartbeats, so
their jobs' silence proves nothing for ``stalled_max_age``. Kept per database: one
out of reach holds back the resets of its own jobs only."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from ..runtime.logs import extra

logger = logging.getLogger("django_dbworker.resetter")


@dataclasses.dataclass
class Outage:
    """The last failure of one database as the resetter knows it."""

    failed_at: float | None = None
    contended: bool = False
    #: A pass was held back since (said once).
    holding_back: bool = False


class Outages:
    """Per database alias (None: any database), its last failure."""

    def __init__(self) -> None:
        self._outages: dict[str | None, Outage] = {}

    def note_failure(self, contended: bool = False, alias: str | None = None) -> None:
        now = time.monotonic()
        outage = self._outages.setdefault(alias, Outage())
        recent_failure = (
            outage.failed_at is not None and not outage.contended and now - outage.failed_at < 60
        )
        outage.contended = contended and not recent_failure
        outage.failed_at = now

    def held_back(self, report: Any, age: float, alias: str) -> bool:
        """Whether resets wait because ``alias`` (or any database) failed less than
        ``age`` ago; marks ``report`` and says so once per outage."""
        now = time.monotonic()
        recent = [
            o
            for o in (self._outages.get(alias), self._outages.get(None))
            if o is not None and o.failed_at is not None and now - o.failed_at < age
        ]
        mine = self._outages.setdefault(alias, Outage())
        if not recent:
            mine.holding_back = False
            return False
        report.held_back = True
        outage = max(recent, key=lambda o: o.failed_at or 0.0)
        if not mine.holding_back:
            mine.holding_back = True
            failed_at = outage.failed_at or now
            if outage.contended:  # busy, not failing: SQLite with several processes
                level, what = (
                    logging.INFO,
                    "a statement waited over a second for SQLite's write lock %.1fs ago "
                    "(heartbeats may have waited too)",
                )
            else:
                level, what = logging.WARNING, "the database failed %.1fs ago"
            logger.log(
                level,
                f"%s: {what}; no job is reset until its worker had stalled_max_age (%gs) "
                "to heartbeat again",
                report.handler,
                now - failed_at,
                age,
                extra=extra("reset_held_back", handler=report.handler),
            )
        return True
