"""What the commands share: handler loading, option parsing, table checks."""

from __future__ import annotations

import logging
import math
import signal
import sys
import time
from argparse import ArgumentParser
from collections.abc import Sequence
from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connections, router

from django_dbworker import conf
from django_dbworker.checks import validate_handler
from django_dbworker.handler import Handler, HandlerImportError, import_handler
from django_dbworker.runtime.backoff import Backoff
from django_dbworker.runtime.signals import early_signal
from django_dbworker.schema import missing_table
from django_dbworker.sql.lasting import lasting_problem
from django_dbworker.text import PrintableFormatter, printable


class WaitingCommand(BaseCommand):
    """A command that waits for its databases itself (``--startup-timeout``, then one
    line for a problem that lasts, ``check_tables``): its system checks connect to none.
    Django 6.1 hands every database to the model checks when a command names none, and a
    JSONField's check then connects before ``handle`` (a traceback for a database that
    is down or does not exist)."""

    def check(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("databases", [])
        super().check(*args, **kwargs)


def number(
    value: str | None, name: str, *, kind: type = float, minimum: float = 0, inclusive: bool = False
) -> Any:
    """Parse an option value (``kind`` int: a whole number; float: a finite number),
    or say in one line what is wrong with it."""
    if value is None:
        return None
    if kind is int:
        try:
            parsed: float = int(value)
        except (TypeError, ValueError):
            raise CommandError(f"{name} must be a whole number, not {value!r}") from None
    else:
        try:
            parsed = float(value)
        except (TypeError, ValueError):
            raise CommandError(f"{name} must be a number, not {value!r}") from None
        if not math.isfinite(parsed):
            # inf would make a wait endless (an --interval of inf never polls again).
            raise CommandError(f"{name} must be a finite number, not {value!r}")
    if parsed < minimum or (parsed == minimum and not inclusive):
        bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
        raise CommandError(f"{name} must be {bound}, not {value!r}")
    return parsed


def add_task_arguments(parser: ArgumentParser) -> None:
    """``--tasks``, ``--backend``, ``--queue``: the tasks of ``django.tasks`` backends."""
    parser.add_argument(
        "--tasks",
        action="store_true",
        help="Also run the tasks of every django_dbworker.tasks.DatabaseBackend in TASKS "
        "(needs the django_dbworker.tasks app).",
    )
    parser.add_argument(
        "--backend",
        action="append",
        metavar="ALIAS",
        help="With --tasks: only this TASKS backend (repeatable).",
    )
    parser.add_argument(
        "--queue",
        action="append",
        metavar="NAME",
        help="With --tasks: only this queue (repeatable; default: the backend's QUEUES).",
    )


def load_handlers(
    paths: Sequence[str], tasks: dict[str, Any] | None = None, **options: Any
) -> list[Handler]:
    """Import, configure and validate handlers (and, with ``tasks`` — the command's
    options — the task handlers); a ``CommandError`` for any problem."""
    with_tasks = bool(tasks and tasks.get("tasks"))
    if tasks and not with_tasks and (tasks.get("queue") or tasks.get("backend")):
        raise CommandError("--queue and --backend go with --tasks")
    paths = list(paths) or ([] if with_tasks else list(conf.get("HANDLERS")))
    if not paths and not with_tasks:
        raise CommandError(
            "no handlers: name them (e.g. myapp.workers.MyHandler), list them in "
            "settings.DBWORKER['HANDLERS'], or run the tasks of django.tasks with --tasks"
        )
    overrides = {key: value for key, value in options.items() if value is not None}
    handlers = []
    for path in paths:
        try:
            handler_cls = import_handler(path)
        except HandlerImportError as exc:
            # A module that raised while importing: chain its exception, so
            # --traceback shows where (a wrong path has no cause to show).
            raise CommandError(str(exc)) from exc.__cause__
        handlers.append(handler_cls(**overrides))
    if with_tasks:
        assert tasks is not None
        handlers += _task_handlers(tasks, overrides)
    from django_dbworker.control.checks import shared_schedule_names

    for messages in (*map(validate_handler, handlers), shared_schedule_names(handlers)):
        errors = [m for m in messages if m.is_serious()]
        if errors:
            first = errors[0]
            hint = f" {first.hint}" if first.hint else ""
            raise CommandError(f"{first.msg} ({first.id}){hint}")
    return handlers


def _task_handlers(options: dict[str, Any], overrides: dict[str, Any]) -> list[Handler]:
    if not apps.is_installed("django_dbworker.tasks"):
        raise CommandError(
            '--tasks needs the app: add "django_dbworker.tasks" to INSTALLED_APPS and migrate'
        )
    from django_dbworker.tasks import compat

    if not compat.AVAILABLE:
        raise CommandError(
            "--tasks needs Django's tasks framework: Django >= 6.0, or `pip install "
            "django-tasks` on Django 5.2 (dbworker.E101)"
        )
    from django_dbworker.tasks.handler import task_handlers

    try:
        found: list[Handler] = list(
            task_handlers(options.get("backend"), options.get("queue"), **overrides)
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if not found:
        raise CommandError("--queue names no queue of the TASKS backends")
    return found


def check_tables(handlers: Sequence[Handler], startup_timeout: float | None = None) -> None:
    """Refuse to start on a job table that does not exist or lacks a column of its
    model (a migration not made or not applied).

    A database that cannot be reached is waited for, one line per try, up to
    ``startup_timeout`` seconds (``DBWORKER["STARTUP_TIMEOUT"]``); past that the
    command fails: a worker that never reached its database is misconfigured
    (a wrong ``DATABASE_URL``), not in an outage. A refusal that waiting cannot
    fix (a database that does not exist, a refused password or role:
    ``sql.lasting``) fails at once. The connections it used are closed.
    """
    logger = logging.getLogger("django_dbworker")
    timeout = float(conf.get("STARTUP_TIMEOUT") if startup_timeout is None else startup_timeout)
    deadline = time.monotonic() + timeout
    backoff = Backoff(base=1.0, cap=10.0)
    from django_dbworker.models import Pause, WorkerProcess

    # The claim statement reads the pause table, the heartbeat writes the registry's,
    # beside the jobs (django_dbworker.databases): they must be as their models say too
    # (a migrate after an upgrade that added one).
    tables: list[tuple[Any, str]] = [
        (h.model, router.db_for_write(h.model)) for h in handlers if h.model is not None
    ]
    for alias in dict.fromkeys(alias for _, alias in tables):
        tables += [(Pause, alias), (WorkerProcess, alias)]
    for model, alias in tables:
        assert model is not None
        while True:
            try:
                problem = missing_table(model, alias)
                break
            except DatabaseError as exc:
                lasting = lasting_problem(exc, connections[alias])
                connections[alias].close()
                if lasting:  # a wrong name or password: waiting would not help
                    raise CommandError(
                        f"cannot use database {alias!r}: {lasting}: {one_line(exc)}"
                    ) from exc
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommandError(
                        f"database {alias!r} unreachable for {timeout:g}s: {one_line(exc)}"
                    ) from exc
                delay = min(backoff.next(), left)
                logger.warning(
                    "database %r unreachable (%s); retrying in %.1fs, giving up in %.0fs",
                    alias,
                    one_line(exc),
                    delay,
                    left,
                )
                time.sleep(delay)
                signum = early_signal()
                if signum is not None:  # a stop while it waited: nothing was started
                    name = signal.Signals(signum).name
                    raise CommandError(
                        f"{name} received while waiting for database {alias!r}: not started",
                        returncode=0,
                    ) from exc
        # The command's own thread has no more use for this connection: kept, it
        # would sit idle for the process's life (a pooler's slot, a server's).
        if not connections[alias].in_atomic_block:
            connections[alias].close()
        if problem:
            raise CommandError(problem)


def one_line(exc: BaseException) -> str:
    """A database error's message on one line (psycopg's span several), without control
    characters (it may quote a value of a row)."""
    return printable(" ".join(str(exc).split()) or type(exc).__name__)


def configure_logging(verbosity: int) -> None:
    """Show the worker's log on stderr unless the project configured logging itself, and
    Django's own records (``django.tasks``' "Task id=… state=RUNNING" under DEBUG) in the
    same format as the worker's: Django's default console handler prints the bare
    message, which then reads as noise between the worker's lines."""
    logger = logging.getLogger("django_dbworker")
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    if logger.level == logging.NOTSET or verbosity != 1:
        logger.setLevel(level)
    formatter = next((h.formatter for h in logger.handlers if h.formatter is not None), None)
    if not logger.handlers and not logging.getLogger().handlers:
        # Job texts (failure messages, tracebacks) reach a terminal through it: printed,
        # not acted on.
        formatter = PrintableFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    if formatter is None:
        return
    for django_handler in logging.getLogger("django").handlers:
        if isinstance(django_handler, logging.StreamHandler) and django_handler.formatter is None:
            django_handler.setFormatter(formatter)


def load_prometheus() -> Any:
    """``django_dbworker.contrib.prometheus``, or a ``CommandError`` saying what to
    install."""
    try:
        from django_dbworker.contrib import prometheus
    except ImportError as exc:
        raise CommandError(
            f"--metrics-port needs prometheus-client ({exc}): "
            'pip install "django-dbworker[prometheus]"'
        ) from None
    return prometheus
