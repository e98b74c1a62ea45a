"""A job's attempts, for its page: those ``WorkerJob.history`` kept (each attempt that
ended without completing, oldest first) and the one the row itself describes (running,
or completed). Whatever the JSON holds is made safe to render here; the template
autoescapes every value."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.template.loader import render_to_string
from django.utils.safestring import SafeString

from ..sql.jobs import history_time
from ..states import JobState
from ..text import EMPTY, human_duration
from .display import state_badge

#: Characters of an attempt's message shown before "…" (the history keeps 500).
MESSAGE_CHARS = 500
#: Log entries listed per attempt (the history keeps 20).
LOG_ENTRIES = 20


def _time(value: Any) -> datetime | None:
    return value if isinstance(value, datetime) else history_time(value)


def _logs(value: Any) -> list[dict[str, Any]]:
    entries = []
    for entry in (value if isinstance(value, list) else [])[:LOG_ENTRIES]:
        if not isinstance(entry, dict):
            continue
        code = entry.get("exit_code")
        entries.append(
            {
                "key": str(entry.get("key") or "(no key)"),
                "exit_code": "" if code is None else str(code),
                "bad": code not in (None, 0),
            }
        )
    return entries


def _row(
    number: int,
    outcome: str,
    worker: Any,
    started: Any,
    ended: Any,
    message: Any,
    logs: Any,
    current: bool = False,
) -> dict[str, Any]:
    start, end = _time(started), _time(ended)
    text = "" if message is None else str(message)
    return {
        "number": number,
        "outcome": state_badge(str(outcome)),
        "worker": str(worker or ""),
        "started": start,
        "ended": end,
        "duration": human_duration(end - start) if start and end and end >= start else EMPTY,
        "message": text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…",
        "logs": _logs(logs),
        "current": current,
    }


def attempts(job: Any) -> list[dict[str, Any]]:
    """The attempts of ``job``, oldest first, as rows for the template."""
    history = job.history if isinstance(getattr(job, "history", None), list) else []
    rows = [
        _row(
            i + 1,
            entry.get("outcome", "?"),
            entry.get("worker"),
            entry.get("started_at"),
            entry.get("ended_at"),
            entry.get("message"),
            entry.get("logs"),
        )
        for i, entry in enumerate(e for e in history if isinstance(e, dict))
    ]
    if job.state in (JobState.PROCESSING, JobState.COMPLETED) and job.started_at:
        logs = [
            {"key": e.get("key"), "exit_code": e.get("exit_code")}
            for e in (job.execution_logs if isinstance(job.execution_logs, list) else [])
            if isinstance(e, dict)
        ]
        rows.append(
            _row(
                len(rows) + 1,
                job.state,
                job.worker_hostname,
                job.started_at,
                job.finished_at,
                None,
                logs,
                current=True,
            )
        )
    return rows


def attempts_table(job: Any, empty: str = EMPTY) -> SafeString:
    html = render_to_string(
        "django_dbworker/attempts.html", {"attempts": attempts(job), "empty": empty}
    )
    return SafeString(html)  # the template autoescapes every value
