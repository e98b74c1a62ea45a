"""Where the package keeps its rows when job tables live on several databases.

A row about a job table lives in that table's database, the one the project's router
gives for writing its model (``db_for_write``), whatever the router says of the
package's own models: a pause of a handler or of one of its queues, the rate buckets
of its limits, its schedules and their ticks, the audit entries of those, the per-minute
statistics of its jobs, and the worker registry's row of each worker that claims from
that database (a worker serving two databases keeps a row in each, listing what it runs
there). Ordered consumers keep their checkpoints in their model's database.

So each database is whole on its own: a claim reads its pause and spends its buckets
in the statement or transaction that takes the jobs; a schedule's tick commits with its
job; the resetter judges a job by the registry of the job's database; and one database
out of reach stops nothing on another (docs/operations.md § Several databases).

A pause of a name no handler known here has (``dbworker pause --force``) is written in
every database that holds job tables, so that it holds wherever that handler turns up.
``router.db_for_write`` of one of the package's models is asked only where no job
table is known (a worker of consumers alone registers there).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.core import checks
from django.db import models, router

if TYPE_CHECKING:
    from .handler import Handler


def job_alias(model: type[models.Model]) -> str:
    """The database of ``model``'s jobs: its router's ``db_for_write``."""
    return router.db_for_write(model)


def handler_alias(handler: Handler) -> str:
    """The database of ``handler``'s jobs."""
    assert handler.model is not None
    return job_alias(handler.model)


def aliases_of(handlers: Iterable[Handler]) -> list[str]:
    """The databases of ``handlers``' jobs, each once, in their order."""
    return list(dict.fromkeys(handler_alias(h) for h in handlers if h.model is not None))


def job_aliases() -> list[str]:
    """Every database that holds job tables, ``default`` (or the first) first: where the
    operator's tools look for pauses, schedules and live workers."""
    from .models import job_models

    found = list(dict.fromkeys(job_alias(m) for m in job_models()))
    return sorted(found, key=lambda alias: alias != "default") or ["default"]


def pause_alias(name: str) -> str | None:
    """The database of a pause ``name``: that of the jobs of the handler it names
    (``<handler>`` or ``<handler>:<queue>``, among ``DBWORKER["HANDLERS"]`` and the
    handlers the registries list), of the tasks' table for ``tasks:<backend>:<queue>``;
    None for a name no handler known here has (``pause`` then writes it in every
    database that holds job tables)."""
    from .handler import known_handlers

    if name.startswith("tasks:") and apps.is_installed("django_dbworker.tasks"):
        return job_alias(apps.get_model("dbworker_tasks", "TaskJob"))
    served = [h for h in known_handlers() if h.model is not None]
    for handler in served:
        if name == handler.get_name():
            return handler_alias(handler)
    for handler in served:
        if name.startswith(handler.queue_pause_prefix()):
            return handler_alias(handler)
    return None


def everywhere(model: type[models.Model]) -> list[str]:
    """Where rows of one of the package's models may be: every database that holds job
    tables, then the router's for ``model``."""
    return list(dict.fromkeys([*job_aliases(), router.db_for_write(model)]))


def per_alias(rows: Iterable[Any], alias_of: Any) -> dict[str, list[Any]]:
    """``rows`` grouped by ``alias_of(row)``, in their order."""
    grouped: dict[str, list[Any]] = {}
    for row in rows:
        grouped.setdefault(alias_of(row), []).append(row)
    return grouped


@checks.register("dbworker")
def check_tables_beside_jobs(**kwargs: Any) -> list[checks.CheckMessage]:
    """dbworker.E015: each database that holds job tables must hold the package's tables
    beside them (the router's ``allow_migrate`` lets ``migrate --database`` create
    them there): the claim reads pauses and spends rate buckets there, schedules commit
    their ticks there, workers register there."""
    from .control.models import AuditEntry, Pause, RateBucket, Schedule, ScheduleTick
    from .models import WorkerProcess, job_models
    from .stats import JobStats

    own = [Pause, RateBucket, Schedule, ScheduleTick, AuditEntry, WorkerProcess, JobStats]
    errors: list[checks.CheckMessage] = []
    for alias, jobs in per_alias(job_models(), job_alias).items():
        refused = [m for m in own if not router.allow_migrate_model(alias, m)]
        if refused:
            names = ", ".join(m._meta.object_name or "" for m in refused)
            errors.append(
                checks.Error(
                    f"{', '.join(m._meta.label for m in jobs)}: jobs in database {alias!r}, "
                    f"where the router's allow_migrate() refuses django_dbworker's {names}.",
                    hint="Each database that holds job tables holds the package's tables "
                    "beside them (pauses, rate buckets, schedules, the worker registry, "
                    "statistics): let allow_migrate() return True for the app label "
                    f"django_dbworker on {alias!r}, then run "
                    f"`manage.py migrate --database {alias}`.",
                    id="dbworker.E015",
                )
            )
    return errors
