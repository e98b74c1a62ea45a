"""What each job database supports: the features its vendor lacks are refused by the
system checks here (dbworker.E030-E033), not left to misbehave. The SQL layer's
dialect says what is missing (``Dialect.missing``); nothing here names a vendor."""

from __future__ import annotations

import inspect
from typing import Any

from django.core import checks
from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper

from .handler import Handler, seconds
from .sql.dialects import dialect_for
from .text import sentence

#: The check id of each missing feature.
IDS = {"limits": "dbworker.E031", "consumers": "dbworker.E032", "unique": "dbworker.E033"}

LIMIT_OPTIONS = ("max_concurrency", "max_concurrency_per_key", "rate_limit", "rate_limit_per_key")


class NotSupportedHere(NotImplementedError):
    """A feature the job database does not have (``Dialect.missing``)."""


def missing(connection: BaseDatabaseWrapper, feature: str) -> str | None:
    """Why ``connection``'s database lacks ``feature``, or None if it has it."""
    try:
        return dialect_for(connection).missing.get(feature)
    except NotImplementedError:  # a vendor we do not support at all: E006 says so
        return None


def refuse(alias: str, feature: str) -> None:
    """Raise ``NotSupportedHere`` if database ``alias`` lacks ``feature``."""
    reason = missing(connections[alias], feature)
    if reason:
        raise NotSupportedHere(f"{reason} ({IDS[feature]}).")


def handler_problems(handler: Any, model: Any, name: str, cls: type) -> list[checks.Error]:
    """A handler's options its job database does not support (E031, E033)."""
    connection = connections[router.db_for_write(model)]
    errors = []
    used = [attr for attr in LIMIT_OPTIONS if getattr(handler, attr, None) is not None]
    reason = missing(connection, "limits")
    if used and reason:
        errors.append(
            checks.Error(
                sentence(f"{name}: {', '.join(used)}: {reason}"),
                hint="Remove the limits, or keep this job model on PostgreSQL.",
                obj=cls,
                id=IDS["limits"],
            )
        )
    reason = missing(connection, "unique")
    if getattr(handler, "unique_by", ()) and reason:
        errors.append(
            checks.Error(
                sentence(f"{name}: unique_by: {reason}"),
                hint="Remove unique_by (and enqueue_unique() calls), or keep this job model "
                "on PostgreSQL or SQLite.",
                obj=cls,
                id=IDS["unique"],
            )
        )
    return errors


def transaction_problems(handler: Any, model: Any, name: str, cls: type) -> list[Any]:
    """A transactional handler (``atomic``, ``complete()``) that cannot keep its promise
    (E040), or that would stall every worker of a single-writer database (W040)."""
    atomic = bool(getattr(handler, "atomic", False))
    uses_complete = getattr(cls, "complete", None) is not Handler.complete
    if not (atomic or uses_complete):
        return []
    what = "atomic = True" if atomic else "complete()"
    hooks = [getattr(cls, "handle", None), getattr(cls, "complete", None)]
    if any(inspect.iscoroutinefunction(hook) for hook in hooks if hook is not None):
        return [
            checks.Error(
                f"{name}: {what} needs a sync handle() and complete(): Django's "
                "transactions do not work in async code (each async ORM call runs in a "
                "thread of its own, outside any transaction), so the handler's writes "
                "could not commit with the job's outcome.",
                hint="Make handle() (and complete()) plain def methods, or keep the "
                "async handler non-transactional.",
                obj=cls,
                id="dbworker.E040",
            )
        ]
    connection = connections[router.db_for_write(model)]
    try:
        single_writer = dialect_for(connection).single_writer
    except NotImplementedError:
        return []
    limit = seconds(getattr(handler, "maximum_runtime_per_job", None))
    stalled = seconds(getattr(handler, "stalled_max_age", None)) or 0.0
    if atomic and single_writer and (limit is None or limit >= stalled):
        return [
            checks.Warning(
                f"{name}: atomic = True on a database with one writer: from its first "
                "write to its commit the handler's transaction holds the database's only "
                "write lock, and every heartbeat, claim and outcome of every worker waits "
                "for it; one that runs past stalled_max_age gets the jobs of other "
                "workers reset.",
                hint="Set maximum_runtime_per_job below stalled_max_age, or keep the "
                "transaction to the final writes with complete() (docs/transactions.md).",
                obj=cls,
                id="dbworker.W040",
            )
        ]
    return []


def consumer_problems(consumer: Any, label: str) -> list[checks.Error]:
    """A consumer on a database that lacks ordered consumers (E032)."""
    from .consumers.models import ConsumerCheckpoint

    connection = connections[router.db_for_write(ConsumerCheckpoint)]
    reason = missing(connection, "consumers")
    if not reason:
        return []
    return [checks.Error(sentence(f"Consumer {label}: {reason}"), id=IDS["consumers"])]


@checks.register("dbworker", checks.Tags.database)
def check_servers(databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The servers of the databases that hold job tables (E030): run by ``migrate`` and
    ``check --database``, as Django's own database checks; ``runworker`` refuses to
    start on such a server too."""
    from django.apps import apps

    from .models import WorkerJob

    messages: list[checks.CheckMessage] = []
    aliases = {
        router.db_for_write(model)
        for model in apps.get_models()
        if issubclass(model, WorkerJob) and not model._meta.proxy
    }
    for alias in sorted(aliases & set(databases or ())):
        problem = server_problem(connections[alias])
        if problem:
            messages.append(
                checks.Error(sentence(f"database {alias!r}: {problem}"), id="dbworker.E030")
            )
    return messages


def server_problem(connection: BaseDatabaseWrapper) -> str | None:
    """Why the server behind ``connection`` cannot hold job tables, or None."""
    try:
        return dialect_for(connection).server_problem(connection)
    except NotImplementedError:
        return None
