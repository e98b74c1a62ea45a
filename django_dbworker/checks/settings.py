"""The checks of the ``DBWORKER`` setting (``dbworker.E001``, E011 of its middleware) and
E103, the tasks app a ``TASKS`` backend of ours needs."""

from __future__ import annotations

import difflib
import math
from typing import Any

from django.apps import apps
from django.core import checks
from django.db import connections

from .. import conf
from ..text import sentence


def _check_settings() -> list[checks.CheckMessage]:
    from django.conf import settings

    value = getattr(settings, "DBWORKER", {})
    if not isinstance(value, dict):
        return [checks.Error("DBWORKER must be a dict.", id="dbworker.E001")]
    errors: list[checks.CheckMessage] = []
    for key in sorted(set(value) - set(conf.DEFAULTS), key=str):
        close = difflib.get_close_matches(str(key), sorted(conf.DEFAULTS), n=1)
        errors.append(
            checks.Error(
                f"DBWORKER has an unknown key {key!r}"
                + (f": did you mean {close[0]!r}?" if close else "."),
                hint=f"Known keys: {', '.join(sorted(conf.DEFAULTS))}.",
                id="dbworker.E001",
            )
        )
    handlers = value.get("HANDLERS", [])
    if not isinstance(handlers, list | tuple) or not all(isinstance(h, str) for h in handlers):
        errors.append(
            checks.Error("DBWORKER['HANDLERS'] must be a list of dotted paths.", id="dbworker.E001")
        )
    for key in ("RESET_INTERVAL", "WORKER_RETENTION", "STARTUP_TIMEOUT"):
        if key in value and not _positive_number(value[key]):
            errors.append(
                checks.Error(
                    f"DBWORKER[{key!r}] must be a positive finite number.", id="dbworker.E001"
                )
            )
    for key in ("STATEMENT_TIMEOUT", "RETENTION_INTERVAL", "STATS_RETENTION", "PROBE_INTERVAL"):
        if key in value and value[key] is not None and not _positive_number(value[key]):
            errors.append(
                checks.Error(
                    f"DBWORKER[{key!r}] must be a positive finite number or None.",
                    id="dbworker.E001",
                )
            )
    for key, low, high, words in (
        ("POOL", 1, None, "an integer >= 1"),
        ("CONNECTION_BUDGET", 1, None, "an integer >= 1"),
        ("FILLFACTOR", 10, 100, "an integer from 10 to 100"),
    ):
        if value.get(key) is not None and not _whole(value[key], low, high):
            errors.append(
                checks.Error(f"DBWORKER[{key!r}] must be None or {words}.", id="dbworker.E001")
            )
    if "NOTIFY" in value and not isinstance(value["NOTIFY"], bool):
        errors.append(checks.Error("DBWORKER['NOTIFY'] must be True or False.", id="dbworker.E001"))
    prepared = value.get("PREPARED_STATEMENTS")
    if prepared is not None and not isinstance(prepared, bool):
        errors.append(
            checks.Error(
                "DBWORKER['PREPARED_STATEMENTS'] must be None, True or False.", id="dbworker.E001"
            )
        )
    errors += _listen_database_errors(value.get("LISTEN_DATABASE"))
    errors += [
        checks.Error(f"DBWORKER['MIDDLEWARE']: {problem}", id="dbworker.E011")
        for problem in _middleware_problems(value.get("MIDDLEWARE", []))
    ]
    token = value.get("METRICS_TOKEN")
    if token is not None and not (isinstance(token, str) and token.strip()):
        errors.append(
            checks.Error(
                "DBWORKER['METRICS_TOKEN'] must be a non-empty string or None.", id="dbworker.E001"
            )
        )
    for key, least in (
        ("MAX_FAILURE_MESSAGE_LENGTH", 100),
        ("MAX_LOG_OUTPUT_LENGTH", 100),
        ("MAX_LOG_LENGTH", 100),
        ("MAX_LOG_ENTRIES", 1),
    ):
        if key in value and not (
            isinstance(value[key], int) and not isinstance(value[key], bool) and value[key] >= least
        ):
            errors.append(
                checks.Error(
                    f"DBWORKER[{key!r}] must be an integer >= {least}.", id="dbworker.E001"
                )
            )
    return errors


def tasks_app_missing(alias: str) -> checks.Error:
    """E103: ``TASKS[alias]`` is a ``DatabaseBackend`` without the tasks app installed.
    The backend's ``check()`` reports it, and this app's check when Django runs none."""
    return checks.Error(
        f"TASKS[{alias!r}] uses django_dbworker.tasks.DatabaseBackend, but the app "
        "django_dbworker.tasks is not installed: its table does not exist.",
        hint='Add "django_dbworker.tasks" to INSTALLED_APPS (after "django_dbworker") '
        "and run migrate.",
        id="dbworker.E103",
    )


#: The checks of Django's tasks framework that call each backend's ``check()``:
#: Django 6's registers when ``django.tasks`` is imported, the backport's when its app
#: is ready (or its checks module imported).
BACKEND_CHECKS = {("django.tasks.checks", "check_tasks"), ("django_tasks.checks", "check_tasks")}


def _backend_checks_run() -> bool:
    """Whether ``check`` calls each ``TASKS`` backend's ``check()`` (which reports E103
    itself): Django runs each check of the registry, and two reports of one problem
    would both be printed (it does not merge equal messages)."""
    registered = checks.registry.registry.get_checks(include_deployment_checks=True)
    return any(
        (getattr(check, "__module__", None), getattr(check, "__name__", None)) in BACKEND_CHECKS
        for check in registered
    )


def _check_tasks_app() -> list[checks.CheckMessage]:
    """E103 from the main app when Django's tasks framework runs no backend checks (it
    is not loaded): the tasks app, which would register them, is what is missing."""
    from django.conf import settings

    if apps.is_installed("django_dbworker.tasks") or _backend_checks_run():
        return []
    backends = getattr(settings, "TASKS", {})
    if not isinstance(backends, dict):
        return []
    return [
        tasks_app_missing(alias)
        for alias, options in backends.items()
        if isinstance(options, dict)
        and str(options.get("BACKEND", "")).startswith("django_dbworker.tasks")
    ]


def _listen_database_errors(setting: Any) -> list[checks.CheckMessage]:
    """``LISTEN_DATABASE``: None, an alias, or a dict of aliases; PostgreSQL ones."""
    if setting is None:
        return []
    pairs = setting.items() if isinstance(setting, dict) else [(None, setting)]
    problems = []
    for source, target in pairs:
        for alias in (source, target):
            if alias is None:
                continue
            if not isinstance(alias, str) or alias not in connections:
                problems.append(f"{alias!r} is not an alias of DATABASES")
            elif connections[alias].vendor != "postgresql":
                problems.append(f"{alias!r} is not a PostgreSQL database")
    return [
        checks.Error(
            sentence(f"DBWORKER['LISTEN_DATABASE']: {problem}"),
            hint="Name the DATABASES alias to LISTEN through, or map the job tables' alias "
            "to it: {'default': 'direct'}.",
            id="dbworker.E001",
        )
        for problem in problems
    ]


def _whole(value: Any, low: int, high: int | None) -> bool:
    """An integer (not a bool) from ``low`` to ``high`` (None: no upper bound)."""
    return (
        not isinstance(value, bool)
        and isinstance(value, int)
        and low <= value
        and (high is None or value <= high)
    )


def _positive_number(value: Any) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value > 0
    )


def _middleware_problems(entries: Any) -> list[str]:
    """What is wrong with a list of middleware (factories or their dotted paths)."""
    from .. import middleware

    if isinstance(entries, str) or not isinstance(entries, list | tuple):
        return [f"must be a list of factories or dotted paths, not {entries!r}"]
    problems = []
    for entry in entries:
        try:
            middleware.split(middleware.load([entry]))
        except (ImportError, TypeError, ValueError) as exc:
            problems.append(f"{entry!r} cannot be used: {exc}")
    return problems
