"""The checks of the concrete job models (``dbworker.E006``, E008, E013, E016, W002,
W005, W006, W010)."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core import checks
from django.db import connections, router
from django.db.models import CheckConstraint, Q

from .. import schema

SUPPORTED_VENDORS = ("postgresql", "sqlite", "mysql")


def _is_worker_job(model: Any) -> bool:
    from ..models import WorkerJob

    return isinstance(model, type) and issubclass(model, WorkerJob)


def concrete_job_parent(model: Any) -> Any:
    """The concrete job model ``model`` extends by multi-table inheritance, if any."""
    if model._meta.proxy:
        return None
    for parent in model._meta.get_parent_list():
        if _is_worker_job(parent) and not parent._meta.abstract:
            return parent
    return None


def _mti_error(model: Any, parent: Any, prefix: str = "", obj: Any = None) -> checks.Error:
    return checks.Error(
        f"{prefix}{model._meta.label} extends the concrete job model {parent._meta.label} "
        "(multi-table inheritance): its bookkeeping columns are in another table, which "
        "the worker cannot claim from.",
        hint="Subclass WorkerJob (or an abstract job model) instead; for another class "
        "over the same table, make it a proxy (Meta.proxy = True).",
        obj=obj or model,
        id="dbworker.E008",
    )


def _q_key(q: Any) -> Any:
    """A ``Q`` as a comparable value, whatever sequence type its ``__in`` values use."""
    if isinstance(q, Q):
        return (q.connector, q.negated, tuple(_q_key(child) for child in q.children))
    if isinstance(q, tuple) and len(q) == 2 and isinstance(q[1], list | tuple | set):
        return (q[0], tuple(sorted(map(str, q[1]))))
    return q


def _missing_schema(model: Any) -> list[str]:
    """What of ``WorkerJob.Meta``'s indexes and constraint ``model`` lacks."""
    from ..models import (
        DEQUEUE_INDEX_CONDITION,
        STATE_CONSTRAINT_CONDITION,
        STATE_INDEX_CONDITION,
        WAITING_INDEX_CONDITION,
    )

    conditions = {_q_key(index.condition) for index in model._meta.indexes}
    constraints = {
        _q_key(constraint.condition)
        for constraint in model._meta.constraints
        if isinstance(constraint, CheckConstraint)
    }
    missing = []
    if _q_key(DEQUEUE_INDEX_CONDITION) not in conditions:
        missing.append("the dequeue index (claims scan finished rows)")
    if _q_key(WAITING_INDEX_CONDITION) not in conditions:
        missing.append("the waiting index (jobs scheduled for later never come due)")
    if _q_key(STATE_INDEX_CONDITION) not in conditions:
        missing.append("the state index (counts of active jobs scan the table)")
    if _q_key(STATE_CONSTRAINT_CONDITION) not in constraints:
        missing.append("the state check constraint (any string can be written to state)")
    return missing


@checks.register("dbworker", checks.Tags.models)
def check_job_models(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Concrete job models are not multi-table children of another job model (E008),
    keep the indexes and constraint of ``WorkerJob.Meta`` (W002), do not use a name of
    WorkerJob's fields for something else (E013, W006), are in a supported database
    (E006), have migrations for every field of WorkerJob (W005), and hold their unique
    keys in states the engine can keep them in (E016)."""
    from ..control.checks import unique_key_problems

    messages: list[checks.CheckMessage] = []
    models = (
        apps.get_models()
        if app_configs is None
        else [m for config in app_configs for m in config.get_models()]
    )
    checked = []
    for model in models:
        if not _is_worker_job(model) or model._meta.proxy:
            continue  # a proxy uses its concrete model's table, indexes and all
        parent = concrete_job_parent(model)
        if parent is not None:
            messages.append(_mti_error(model, parent))
            continue
        checked.append(model)
        messages += _model_problems(model)
        messages += unique_key_problems(model)
        missing = _missing_schema(model)
        if missing:
            messages.append(
                checks.Warning(
                    f"{model._meta.label} lacks {'; '.join(missing)}.",
                    hint="Let its Meta inherit WorkerJob.Meta (class Meta(WorkerJob.Meta)) and "
                    "keep *WorkerJob.Meta.indexes and *WorkerJob.Meta.constraints, or add "
                    "dequeue_index(), waiting_index(), state_index() and state_constraint() "
                    "from django_dbworker.models.",
                    obj=model,
                    id="dbworker.W002",
                )
            )
    for model, fields in schema.migration_gaps(checked).items():
        messages.append(
            checks.Warning(
                f"The migrations of app {model._meta.app_label!r} lack "
                f"the fields {', '.join(fields)} of WorkerJob (django_dbworker was "
                "upgraded): runworker refuses to start until they exist.",
                hint=f"{schema.makemigrations_advice(model).capitalize()} (docs/upgrading.md).",
                obj=model,
                id="dbworker.W005",
            )
        )
    for model, names in schema.index_gaps(checked).items():
        messages.append(
            checks.Warning(
                f"The migrations of app {model._meta.app_label!r} do not make the indexes "
                f"{', '.join(names)} of {model._meta.label} as declared (django_dbworker was "
                "upgraded): until they do, claims read the jobs that wait for later.",
                hint=f"{schema.makemigrations_advice(model).capitalize()}; on a large "
                "PostgreSQL table, build them concurrently (docs/upgrading.md).",
                obj=model,
                id="dbworker.W010",
            )
        )
    return messages


def _model_problems(model: Any) -> list[checks.CheckMessage]:
    """A concrete job model's own fields against WorkerJob's (E013, W006), and its
    database (E006)."""
    messages: list[checks.CheckMessage] = []
    for clash in schema.clashes(model):
        message, hint = schema.clash_message(clash)
        kind = checks.Error if clash.differences else checks.Warning
        messages.append(
            kind(
                message,
                hint=hint,
                obj=model,
                id="dbworker.E013" if clash.differences else "dbworker.W006",
            )
        )
    vendor = connections[router.db_for_write(model)].vendor
    if vendor not in SUPPORTED_VENDORS:
        messages.append(
            checks.Error(
                f"{model._meta.label} is in a {vendor!r} database: the worker supports "
                f"{', '.join(SUPPORTED_VENDORS)}.",
                hint="Route the job model to a supported database (DATABASE_ROUTERS).",
                obj=model,
                id="dbworker.E006",
            )
        )
    return messages
