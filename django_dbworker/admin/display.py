"""How job columns look in the admin. Everything from a job is escaped here."""

from __future__ import annotations

import shlex
from datetime import datetime, timedelta
from typing import Any

from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from ..operations import RETRYABLE_STATES
from ..states import DEQUEUEABLE_STATES, JobState
from ..text import EMPTY, human_duration, plain_number

STATE_COLOURS = {
    JobState.QUEUED: "#6c757d",
    JobState.PROCESSING: "#0b62a4",
    JobState.COMPLETED: "#2e7d32",
    JobState.ERRORED: "#b26a00",
    JobState.FAILED: "#c62828",
    JobState.CANCELED: "#455a64",
}
#: Times in the job list: compact, to the second, in the site's time zone (the date
#: and the time separated by one space).
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
#: Output longer than this is shown collapsed.
COLLAPSE_LINES = 20
COLLAPSE_CHARS = 2000
#: The execution-log entries the job page and its live refresh show (the last ones), and
#: the characters of each one's output (its end); the whole log is a link away.
SHOWN_ENTRIES = 20
SHOWN_OUTPUT = 10_000


def state_badge(state: str) -> SafeString:
    colour = STATE_COLOURS.get(state, "#6c757d")  # type: ignore[call-overload]
    return format_html(
        '<span class="dbworker-state dbworker-state-{}" style="background:{}">{}</span>',
        state,
        colour,
        state,
    )


def job_duration(job: Any) -> timedelta | None:
    if job.started_at is None:
        return None
    end: datetime | None = timezone.now() if job.state == JobState.PROCESSING else job.finished_at
    if end is None or end < job.started_at:
        return None
    started: datetime = job.started_at
    return end - started


def heartbeat_age(job: Any) -> timedelta | None:
    if job.state != JobState.PROCESSING or job.last_heartbeat_at is None:
        return None
    return timezone.now() - job.last_heartbeat_at  # type: ignore[no-any-return]


def local_time(value: datetime | None) -> SafeString | None:
    """``2026-11-23 16:34:55`` in the current time zone, which the tooltip names."""
    if value is None:
        return None
    local = timezone.localtime(value)
    day, time = local.strftime(TIME_FORMAT).split(" ", 1)
    # Date and time may go on two lines in a narrow column, never break inside either.
    return format_html(
        '<time class="dbworker-time" datetime="{}" title="{}"><span>{}</span> <span>{}</span>'
        "</time>",
        value.isoformat(),
        local.strftime("%Z"),
        day,
        time,
    )


def breakable_worker(name: str) -> SafeString:
    """A worker id (``host:pid:random``) that may wrap after its colons."""
    return format_html_join(mark_safe(":<wbr>"), "{}", ((part,) for part in name.split(":")))


def failure_of_previous_attempt(job: Any) -> bool:
    """A queued or processing job's ``failure_message`` is left from an attempt before
    it was queued again (retried, reset), not its current state."""
    return bool(job.failure_message) and job.state in (JobState.QUEUED, JobState.PROCESSING)


def first_line(text: str | None, limit: int = 100) -> str:
    line = (text or "").strip().split("\n", 1)[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def log_entries(logs: Any, most: int | None = None) -> list[dict[str, Any]]:
    """Execution-log entries made safe to render, whatever the JSON holds: the last
    ``most`` of them (None: all), each output's last ``SHOWN_OUTPUT`` characters."""
    entries = []
    raws = logs if isinstance(logs, list) else []
    for raw in raws[-most:] if most else raws:
        entry = raw if isinstance(raw, dict) else {"out": str(raw)}
        command = entry.get("command") or []
        if isinstance(command, list):
            command_text = shlex.join(str(part) for part in command)
        else:
            command_text = str(command)
        out = entry.get("out")
        out = "" if out is None else str(out)
        hidden = max(len(out) - SHOWN_OUTPUT, 0)
        out = out[hidden:]
        duration = entry.get("duration_ms")
        entries.append(
            {
                "key": str(entry.get("key", "")),
                "command": command_text,
                "start_time": _parse_time(entry.get("start_time")),
                "start_raw": str(entry.get("start_time") or ""),
                "exit_code": entry.get("exit_code"),
                "duration": human_duration(duration / 1000)
                if isinstance(duration, int | float)
                else None,
                "out": out,
                "out_hidden": hidden,
                "out_lines": out.count("\n") + (1 if out and not out.endswith("\n") else 0),
                "collapsed": out.count("\n") > COLLAPSE_LINES or len(out) > COLLAPSE_CHARS,
            }
        )
    return entries


def progress_bar(progress: Any) -> SafeString | None:
    """A job's last check-in (``attempt.checkin()``): its text, and a bar with the
    percentage when it gave ``done`` of ``total``."""
    if not isinstance(progress, dict):
        return None
    text = progress.get("text")
    done: Any = progress.get("done")
    total: Any = progress.get("total")
    parts = []
    if _number(done) and _number(total) and total > 0:
        share = max(0.0, min(done / total, 1.0))
        parts.append(
            format_html(
                '<progress max="1" value="{}" title="{} of {}"></progress> {}%',
                f"{share:.4f}",
                plain_number(done),
                plain_number(total),
                f"{share * 100:.0f}",
            )
        )
    if text:
        parts.append(format_html('<span class="dbworker-checkin">{}</span>', str(text)))
    if not parts:
        return None
    bar = format_html_join(" ", "{}", ((part,) for part in parts))
    return format_html('<span class="dbworker-progress">{}</span>', bar)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def live_panel(job: Any, live_url: str | None, empty: str = EMPTY) -> SafeString:
    """State, heartbeat, failure and execution log of one job (refreshed while it runs).

    ``empty`` is what an empty value shows (the admin's ``empty_value_display``).
    """
    age = heartbeat_age(job)
    logs = job.execution_logs if isinstance(job.execution_logs, list) else []
    html = render_to_string(
        "django_dbworker/live_panel.html",
        {
            "earlier_entries": max(len(logs) - SHOWN_ENTRIES, 0),
            "log_url": operation_url(live_url, "log"),
            "job": job,
            "state_badge": state_badge(job.state),
            "heartbeat_age": human_duration(age) if age else None,
            "duration": human_duration(job_duration(job), empty),
            "previous_attempt": failure_of_previous_attempt(job),
            "entries": log_entries(logs, SHOWN_ENTRIES),
            "live_url": live_url,
            "processing": job.state == JobState.PROCESSING,
            "progress": progress_bar(getattr(job, "progress", None)),
            "empty": empty,
        },
    )
    return SafeString(html)  # the template autoescapes every value


def operation_url(live_url: str | None, operation: str) -> str | None:
    """The URL of another operation of the job whose ``live`` operation is at
    ``live_url`` (``…/dbworker/live/``)."""
    if not live_url or not live_url.endswith("/live/"):
        return None
    return live_url.removesuffix("live/") + f"{operation}/"


def operation_effect(operation: str, job: Any) -> tuple[bool, str]:
    """Whether a job-page operation applies to ``job`` now, and what it would do (or why
    it does not apply), in words for the confirmation page."""
    pk, state = job.pk, job.state
    waiting = state in DEQUEUEABLE_STATES
    if operation == "cancel":
        if waiting:
            return True, f"Job {pk} is {state}: it becomes canceled now and does not run again."
        if state == JobState.PROCESSING and not job.cancel:
            worker = job.worker_hostname or "(unknown)"
            return True, (
                f"Job {pk} is running on worker {worker}: the worker is asked to stop it at "
                "its next heartbeat, and the job becomes canceled when it has stopped."
            )
        if state == JobState.PROCESSING:
            return False, f"Job {pk} is running and its worker has already been asked to stop it."
        return False, f"Job {pk} is {state}: there is nothing to cancel."
    if operation in ("retry", "retry-reset"):
        if state not in RETRYABLE_STATES:
            return (
                False,
                f"Job {pk} is {state}: only failed, errored and canceled jobs are retried.",
            )
        if operation == "retry":
            return True, (
                f"Job {pk} is {state}: it is queued to run again now, keeping its "
                f"{job.num_failures} failure(s) and {job.num_resets} reset(s), so a job past its "
                "retry budget gets exactly one more attempt."
            )
        return True, (
            f"Job {pk} is {state}: it is queued to run again now with its failure and reset "
            f"counts ({job.num_failures} and {job.num_resets}) set to 0: its whole retry "
            "budget again."
        )
    if operation == "run-now":
        if waiting and job.process_after and job.process_after > timezone.now():
            when = timezone.localtime(job.process_after).strftime("%Y-%m-%d %H:%M:%S %Z")
            return True, f"Job {pk} is {state}, scheduled for {when}: it can be claimed now."
        return False, (
            f"Job {pk} is {state} and not scheduled for later: only queued or errored jobs "
            "scheduled for later can be run now."
        )
    raise ValueError(f"unknown operation {operation!r}")


def job_url(site: str, label: str) -> str:
    """The admin page of the job ``app_label.Model:pk`` names ("#" if there is none)."""
    from django.apps import apps

    model_label, _, pk = label.rpartition(":")
    try:
        opts = apps.get_model(model_label)._meta
        return reverse(f"{site}:{opts.app_label}_{opts.model_name}_change", args=[pk])
    except Exception:
        return "#"
