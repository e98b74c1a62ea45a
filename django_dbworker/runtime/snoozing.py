"""What a snooze (``raise Snooze(seconds)``) ends in: back to the queue for a time, or
failed once the handler's ``max_snoozes`` is spent.

A snooze is not a failure: the ``snooze`` statement (``sql.jobs``) counts it in
``num_snoozes`` and leaves ``num_failures`` alone, so the retry budget and the backoff
of a later error (``Handler.retry_delay(num_failures + 1)``) do not see it. The row
waits with ``process_after`` set, off the claim path, until the stager makes it
claimable (the writer tells the stager when, as for a retry's delay).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..text import human_duration
from .outcome import Outcome, failure_message

if TYPE_CHECKING:
    from ..exceptions import Snooze
    from ..handler import Handler


def snooze_message(seconds: float, number: int, cap: int | None) -> str:
    """``snoozed for 30.0 s, 3 of at most 100``: what history and the log say."""
    limit = f" of at most {cap}" if cap is not None else ""
    return f"snoozed for {human_duration(seconds)}, {number}{limit}"


def snoozed(handler: Handler, snooze: Snooze, job: Any) -> Outcome:
    """The outcome of an attempt that raised ``snooze``: snoozed, or failed (not
    retried) when the job has snoozed ``max_snoozes`` times already."""
    done = int(getattr(job, "num_snoozes", 0) or 0)
    cap = handler.max_snoozes
    if cap is not None and done >= cap:
        error = RuntimeError(
            f"the job snoozed {done} time(s) already, the most max_snoozes allows "
            f"({cap}): it failed instead of snoozing again"
        )
        error.__cause__ = snooze
        return Outcome.failed(error, failure_message(error), non_retryable=True)
    return Outcome.snoozed(snooze.seconds, snooze_message(snooze.seconds, done + 1, cap))
