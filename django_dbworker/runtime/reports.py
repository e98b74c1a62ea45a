"""The log lines outcomes get: one per outcome, completions of a statement together."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..states import JobState
from ..text import human_duration
from .logs import extra

if TYPE_CHECKING:
    from .attempt import Attempt
    from .lane import Lane
    from .outcome import Outcome

logger = logging.getLogger("django_dbworker.writer")

#: Job ids a grouped completion line names (its ``job_ids`` has them all).
MAX_IDS = 20


def report_completed(lane: Lane, items: list[tuple[Attempt, Outcome]]) -> None:
    """One INFO line for the jobs one statement completed: per job at low load, one line
    listing them all under load (a log record per job would cost more than the job:
    about a third of a core at 20,000 jobs/s)."""
    if not items or not logger.isEnabledFor(logging.INFO):
        return
    if len(items) == 1:
        attempt, outcome = items[0]
        report(lane, attempt, outcome, JobState.COMPLETED.value)
        return
    ids = [attempt.pk for attempt, _ in items]
    durations = [outcome.duration for _, outcome in items]
    named = ", ".join(map(str, ids[:MAX_IDS]))
    if len(ids) > MAX_IDS:
        named += f" and {len(ids) - MAX_IDS} more"
    logger.info(
        "%d jobs of %s completed in %s–%s: %s",
        len(ids),
        lane.model._meta.label,
        human_duration(min(durations)),
        human_duration(max(durations)),
        named,
        extra=extra(
            "completed",
            worker=lane.worker_id,
            jobs=ids,
            handler=lane.label,
            state=JobState.COMPLETED.value,
        ),
    )


def report(lane: Lane, attempt: Attempt, outcome: Outcome, state: str | None) -> None:
    """One line per outcome: INFO for what was asked for (completed, canceled, requeued),
    WARNING for an error that will be retried or an outcome that could not be written,
    ERROR for a job that failed for good. ``state``: what the row took (None: nothing)."""
    label = attempt.label
    fields = extra(
        state or "lost", worker=lane.worker_id, job=attempt.pk, handler=lane.label, state=state
    )
    took = human_duration(outcome.duration)
    if outcome.state == "lost":
        logger.warning(
            "job %s: no longer ours (deleted, or reset and claimed again); outcome dropped",
            label,
            extra=fields,
        )
    elif state is None:
        logger.warning(
            "job %s: outcome %s refused, the job was reset or deleted meanwhile",
            label,
            outcome.state,
            extra=fields,
        )
    elif state == JobState.COMPLETED:
        logger.info("job %s: completed in %s", label, took, extra=fields)
    elif state == JobState.QUEUED:  # given back: "requeued: <why>"
        logger.info("job %s: %s", label, outcome.message, extra=fields)
    elif state == JobState.ERRORED:
        logger.warning(
            "job %s: errored after %s, retry in %s: %s",
            label,
            took,
            human_duration(outcome.retry_delay),
            first_line(outcome.message),
            extra=fields,
        )
    else:
        level = logging.ERROR if state == JobState.FAILED else logging.INFO
        logger.log(
            level,
            "job %s: %s after %s: %s",
            label,
            state,
            took,
            first_line(outcome.message),
            extra=fields,
        )


def first_line(text: str | None) -> str:
    return (text or "").split("\n", 1)[0]
