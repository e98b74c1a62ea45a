"""The ``OPTIONS`` of a ``DatabaseBackend``: engine settings for its tasks."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from ..control.periodic import Periodic

#: OPTIONS keys, their defaults and what they mean (docs/tasks.md lists them).
DEFAULTS: dict[str, Any] = {
    # Errors after the first that are retried (a task's max_retries overrides it).
    "MAX_RETRIES": 0,
    # Seconds before the first retry, the factor each further retry waits longer, and
    # the longest wait (None: no cap).
    "RETRY_AFTER": 10.0,
    "RETRY_BACKOFF": 2.0,
    "RETRY_MAX_DELAY": 3600.0,
    # Seconds an attempt may run before it is cancelled (None: no limit).
    "MAX_RUNTIME": None,
    # Heartbeats, and how long a task may go without one before the resetter takes it.
    "HEARTBEAT_INTERVAL": 1.0,
    "STALLED_MAX_AGE": 30.0,
    # Resets (its worker died) before a task fails instead.
    "MAX_NUM_RESETS": 3,
    # Snoozes (a task raises django_dbworker.Snooze) before the next one fails the task.
    "MAX_SNOOZES": 100,
    # Tasks run at once per worker process (runworker --num-handlers overrides it), and
    # claimed ahead of free threads.
    "NUM_HANDLERS": 4,
    "PREFETCH": 0,
    # On a shared pool (runworker --pool): the tasks' weight among the handlers (1-100,000).
    "WEIGHT": 100,
    # Seconds between claims while idle (NOTIFY wakes workers at once on PostgreSQL).
    "INTERVAL": 1.0,
    # Seconds finished results are kept before the engine deletes them (None: kept).
    "RESULT_RETENTION": 7 * 24 * 3600.0,
    # Periodic tasks: {name: {"task": "dotted.path", "cron": "0 3 * * *", "timezone":
    # "UTC", "args": [], "kwargs": {}, "missed": "run_once"}} (docs/scheduling.md).
    "SCHEDULES": {},
}
#: A task's engine options (``@task(...)``, ``using(...)``) and the OPTIONS key of
#: each one's default.
TASK_OPTIONS = {
    "max_retries": "MAX_RETRIES",
    "retry_after": "RETRY_AFTER",
    "retry_backoff": "RETRY_BACKOFF",
    "retry_max_delay": "RETRY_MAX_DELAY",
    "max_runtime": "MAX_RUNTIME",
}
#: A ``Handler``'s attributes that tasks spell otherwise (docs/tasks.md § Retries);
#: ``retry_after``, ``retry_backoff`` and ``retry_max_delay`` are spelt alike.
HANDLER_SPELLINGS = {
    "max_num_retries": "max_retries",
    "maximum_runtime_per_job": "max_runtime",
}
#: The keys of one SCHEDULES entry.
SCHEDULE_KEYS = {"task", "cron", "timezone", "args", "kwargs", "missed", "missed_after"}
DURATIONS = {
    "RETRY_AFTER",
    "RETRY_MAX_DELAY",
    "MAX_RUNTIME",
    "HEARTBEAT_INTERVAL",
    "STALLED_MAX_AGE",
    "INTERVAL",
    "RESULT_RETENTION",
}
OPTIONAL = {"RETRY_MAX_DELAY", "MAX_RUNTIME", "RESULT_RETENTION"}
COUNTS = {
    "MAX_RETRIES": 0,
    "MAX_NUM_RESETS": 0,
    "MAX_SNOOZES": 0,
    "NUM_HANDLERS": 1,
    "PREFETCH": 0,
    "WEIGHT": 1,
}


def refuse_unknown(given: Iterable[str], known: Iterable[str], where: str) -> None:
    """``TypeError`` naming the first of ``given`` not in ``known``, and what was meant:
    a handler's spelling of a task option, or a close match."""
    known = list(known)
    for name in given:
        if name in known:
            continue
        meant = HANDLER_SPELLINGS.get(name)
        if meant is not None:
            hint = f"; tasks spell the handler attribute {name} as {meant}"
        else:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
        raise TypeError(f"{where}() got an unexpected keyword argument {name!r}{hint}")


def seconds(value: Any) -> float | None:
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def duration_ok(value: Any, *, zero: bool) -> bool:
    """A ``timedelta`` or a finite number of seconds, positive (or zero if ``zero``)."""
    if not isinstance(value, timedelta) and (
        isinstance(value, bool) or not isinstance(value, int | float)
    ):
        return False
    secs = seconds(value)
    return secs is not None and math.isfinite(secs) and (secs > 0 or (zero and secs == 0))


def count_ok(value: Any, minimum: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= minimum


def backoff_ok(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and value >= 1


def problems(options: Any) -> list[str]:
    """What is wrong with an OPTIONS dict, one line each."""
    if not isinstance(options, dict):
        return ["OPTIONS must be a dict"]
    found = []
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        known = ", ".join(sorted(DEFAULTS))
        found.append(f"unknown OPTIONS {', '.join(unknown)} (known: {known})")
    for key, value in options.items():
        if key in DURATIONS and not (value is None and key in OPTIONAL):
            if not duration_ok(value, zero=False):
                found.append(f"OPTIONS[{key!r}] must be a positive number of seconds")
        elif key in COUNTS and not count_ok(value, COUNTS[key]):
            found.append(f"OPTIONS[{key!r}] must be a whole number >= {COUNTS[key]}")
        elif key == "RETRY_BACKOFF" and not backoff_ok(value):
            found.append("OPTIONS['RETRY_BACKOFF'] must be a number >= 1")
        elif key == "SCHEDULES":
            found += schedule_problems(value)
    return found


def schedule_problems(schedules: Any) -> list[str]:
    if not isinstance(schedules, dict):
        return ["OPTIONS['SCHEDULES'] must be a dict of name: schedule"]
    found = []
    for name, entry in schedules.items():
        where = f"OPTIONS['SCHEDULES'][{name!r}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("task"), str):
            found.append(f"{where} must be a dict with 'task' (a dotted path) and 'cron'")
            continue
        unknown = sorted(set(entry) - SCHEDULE_KEYS)
        if unknown:
            found.append(f"{where}: unknown keys {', '.join(unknown)}")
            continue
        try:
            periodic_of(str(name), entry)
        except (TypeError, ValueError) as exc:
            found.append(f"{where}: {exc}")
    return found


def periodic_of(name: str, entry: dict[str, Any]) -> Periodic:
    """The ``Periodic`` of one SCHEDULES entry (``ValueError`` if it is not one)."""
    if not isinstance(entry.get("args", []), list | tuple):
        raise ValueError("args must be a list")
    if not isinstance(entry.get("kwargs", {}), dict):
        raise ValueError("kwargs must be a dict")
    return Periodic(
        str(entry.get("cron", "")),
        fields={
            "task": entry["task"],
            "args": list(entry.get("args", [])),
            "kwargs": dict(entry.get("kwargs", {})),
        },
        name=name,
        timezone=entry.get("timezone", "UTC"),
        missed=entry.get("missed", "run_once"),
        missed_after=float(entry.get("missed_after", 60.0)),
    )


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """A backend's OPTIONS merged over the defaults, durations in seconds."""

    alias: str
    values: dict[str, Any]
    #: The keys the backend's OPTIONS set (the others are defaults).
    given: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, alias: str, options: Any) -> TaskOptions:
        merged = dict(DEFAULTS)
        given = (
            {k: v for k, v in options.items() if k in DEFAULTS} if isinstance(options, dict) else {}
        )
        merged.update(given)
        for key in DURATIONS:
            merged[key] = seconds(merged[key])
        return cls(alias, merged, frozenset(given))

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def validate_task(self, task: Any) -> None:
        """The engine options of a ``DatabaseTask`` (``@task(max_retries=…)``)."""
        from .backend import InvalidTask

        max_retries = getattr(task, "max_retries", None)
        if max_retries is not None and not count_ok(max_retries, 0):
            raise InvalidTask(f"max_retries must be a whole number >= 0, not {max_retries!r}.")
        for name in ("retry_after", "retry_max_delay", "max_runtime"):
            value = getattr(task, name, None)
            if value is not None and not duration_ok(value, zero=name == "retry_after"):
                raise InvalidTask(f"{name} must be seconds or a timedelta, not {value!r}.")
        backoff = getattr(task, "retry_backoff", None)
        if backoff is not None and not backoff_ok(backoff):
            raise InvalidTask(f"retry_backoff must be a number >= 1, not {backoff!r}.")

    def for_task(self, task: Any, name: str, key: str) -> Any:
        """A task's own option, else the backend's."""
        value = getattr(task, name, None)
        if value is None:
            return self.values[key]
        return seconds(value) if key in DURATIONS else value


def stored_options(task: Any) -> dict[str, Any] | None:
    """The engine options of ``task`` as a run stores them (``TaskJob.options``), or None
    when it sets none."""
    found = None
    for name in TASK_OPTIONS:
        value = getattr(task, name, None)
        if value is not None:
            if found is None:
                found = {}
            found[name] = stored_value(name, value)
    return found


def stored_value(name: str, value: Any) -> Any:
    """A task option's value as JSON stores it: durations in seconds."""
    return seconds(value) if TASK_OPTIONS[name] in DURATIONS else value
