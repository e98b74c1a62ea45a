"""How job columns look in the admin. Everything from a job is escaped here."""

from __future__ import annotations

import shlex
from datetime import datetime, timedelta
from typing import Any

from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .states import JobState

STATE_COLOURS = {
    JobState.QUEUED: "#6c757d",
    JobState.PROCESSING: "#0b62a4",
    JobState.COMPLETED: "#2e7d32",
    JobState.ERRORED: "#b26a00",
    JobState.FAILED: "#c62828",
    JobState.CANCELED: "#455a64",
}
#: Output longer than this is shown collapsed.
COLLAPSE_LINES = 20
COLLAPSE_CHARS = 2000


def state_badge(state: str) -> SafeString:
    colour = STATE_COLOURS.get(state, "#6c757d")  # type: ignore[call-overload]
    return format_html(
        '<span class="dbworker-state dbworker-state-{}" style="background:{}">{}</span>',
        state,
        colour,
        state,
    )


def human_duration(delta: timedelta | float | None) -> str:
    if delta is None:
        return "–"
    seconds = delta.total_seconds() if isinstance(delta, timedelta) else float(delta)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


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


def log_entries(logs: Any) -> list[dict[str, Any]]:
    """Execution-log entries made safe to render, whatever the JSON holds."""
    entries = []
    for raw in logs if isinstance(logs, list) else []:
        entry = raw if isinstance(raw, dict) else {"out": str(raw)}
        command = entry.get("command") or []
        if isinstance(command, list):
            command_text = shlex.join(str(part) for part in command)
        else:
            command_text = str(command)
        out = entry.get("out")
        out = "" if out is None else str(out)
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
                "out_lines": out.count("\n") + (1 if out and not out.endswith("\n") else 0),
                "collapsed": out.count("\n") > COLLAPSE_LINES or len(out) > COLLAPSE_CHARS,
            }
        )
    return entries


def live_panel(job: Any, live_url: str | None) -> SafeString:
    """State, heartbeat, failure and execution log of one job (refreshed while it runs)."""
    html = render_to_string(
        "django_dbworker/live_panel.html",
        {
            "job": job,
            "state_badge": state_badge(job.state),
            "heartbeat_age": human_duration(heartbeat_age(job)) if heartbeat_age(job) else None,
            "duration": human_duration(job_duration(job)),
            "entries": log_entries(job.execution_logs),
            "live_url": live_url,
            "processing": job.state == JobState.PROCESSING,
        },
    )
    return SafeString(html)  # the template autoescapes every value
