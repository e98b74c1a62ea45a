"""A job model's schema against what the engine needs: the fields ``WorkerJob``
declares, the model's migrations and its table.

- Fields. A subclass field of the same name replaces an abstract parent's field
  without a word from Django, and the worker goes on writing the column its own way
  (``progress = NULL`` at every claim). Such a redeclaration is refused unless it is
  ``WorkerJob``'s field with only its column or its presentation changed (the
  documented way to rename a column: ``db_column``).
- Migrations. A release that adds a field to ``WorkerJob`` needs a migration in every
  app with a job model; a forgotten ``makemigrations`` is said in one line.
- The table. ``runworker`` and ``runresetter`` refuse to start on a table without
  a column the model has, and say what to run: ``makemigrations`` when the model has
  changes no migration holds, ``migrate`` when a migration is not applied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import connections, models, router
from django.db.migrations.loader import MigrationLoader

from .models import WorkerJob

#: Options a redeclared field may change: its column's name, and how it is shown.
FREE_OPTIONS = frozenset(
    {
        "db_column",
        "db_comment",
        "db_index",
        "db_tablespace",
        "verbose_name",
        "help_text",
        "blank",
        "editable",
        "choices",
        "validators",
        "error_messages",
    }
)


def reserved_fields() -> list[models.Field[Any, Any]]:
    """The fields ``WorkerJob`` declares besides its key: their names are reserved."""
    return [f for f in WorkerJob._meta.local_fields if not f.primary_key]


RESERVED_NAMES = tuple(f.name for f in reserved_fields())


@dataclasses.dataclass(frozen=True)
class Clash:
    """A name of ``WorkerJob``'s that a job model uses for something else."""

    model: type[models.Model]
    name: str
    #: What makes it unusable by the engine (empty: it is WorkerJob's field, declared
    #: again in the same column).
    differences: tuple[str, ...]


def clashes(model: type[models.Model]) -> list[Clash]:
    """The fields of ``WorkerJob`` that ``model`` (a concrete job model) redeclares or
    hides. A field copied from ``WorkerJob`` keeps its creation counter, a field
    declared again gets a new one."""
    found = []
    for ours in reserved_fields():
        try:
            field: Any = model._meta.get_field(ours.name)
        except FieldDoesNotExist:
            # An attribute of the class (a method, a property) kept Django from adding it.
            value = next((vars(k)[ours.name] for k in model.__mro__ if ours.name in vars(k)), None)
            found.append(Clash(model, ours.name, (f"a {type(value).__name__} (not a field)",)))
            continue
        if field.creation_counter == ours.creation_counter:
            continue
        unusable = tuple(differences(field, ours))
        if unusable or field.column == ours.name:  # not merely a column of another name
            found.append(Clash(model, ours.name, unusable))
    return found


def differences(field: Any, ours: Any) -> list[str]:
    """What of ``field`` the engine cannot use as ``ours``: its type, nullability,
    defaults or size (anything but ``FREE_OPTIONS``)."""
    if field.get_internal_type() != ours.get_internal_type() or not field.concrete:
        return [f"a {type(field).__name__} (WorkerJob's is a {type(ours).__name__})"]
    found = []
    kwargs, expected = field.deconstruct()[3], ours.deconstruct()[3]
    for key in sorted((kwargs.keys() | expected.keys()) - FREE_OPTIONS):
        value, want = kwargs.get(key, _UNSET), expected.get(key, _UNSET)
        if key == "max_length" and value is not _UNSET and want is not _UNSET:
            if value < want:
                found.append(f"max_length={value!r} (at least {want!r})")
        elif value != want:
            found.append(f"{key}={_show(value)} ({_show(want)} in WorkerJob)")
    return found


_UNSET: Any = object()


def _show(value: Any) -> str:
    if value is _UNSET:
        return "unset"
    return getattr(value, "__qualname__", None) or repr(value)


def clash_message(clash: Clash) -> tuple[str, str]:
    """(message, hint) of a system check about ``clash``."""
    label = f"{clash.model._meta.label}.{clash.name}"
    if clash.differences:
        what = "; ".join(clash.differences)
        message = (
            f"{label} replaces WorkerJob's field {clash.name!r} with {what}: the worker "
            "writes this column itself, so the job model cannot use it."
        )
    else:
        message = (
            f"{label} declares WorkerJob's field {clash.name!r} again: the worker writes "
            "this column (if it holds data of your own, that data is overwritten)."
        )
    hint = (
        "Rename your field (makemigrations asks whether you renamed it, which keeps its "
        f"data). WorkerJob reserves the names: {', '.join(RESERVED_NAMES)}. To rename only "
        "the column of WorkerJob's field, declare it again unchanged but for db_column "
        "(docs/reference.md § Columns)."
    )
    return message, hint


def _migrated(job_models: Iterable[type[models.Model]]) -> list[tuple[Any, Any]]:
    """(model, its state after its app's migrations) of each managed job model that a
    migration creates. Read from the migration files, no database."""
    job_models = [m for m in job_models if m._meta.managed]
    if not job_models:
        return []
    try:
        state = MigrationLoader(None, ignore_no_migrations=True).project_state()
    except Exception:  # broken migration files: Django's own commands say so
        return []
    found = []
    for model in job_models:
        model_state = state.models.get((model._meta.app_label, model._meta.model_name))
        if model_state is not None:  # else not created by a migration: makemigrations says so
            found.append((model, model_state))
    return found


def migration_gaps(job_models: Iterable[type[models.Model]]) -> dict[Any, list[str]]:
    """For each managed job model that its app's migrations create: the fields of
    ``WorkerJob`` those migrations lack (an upgrade that added them, and
    ``makemigrations`` not run since)."""
    gaps: dict[Any, list[str]] = {}
    for model, model_state in _migrated(job_models):
        missing = [name for name in RESERVED_NAMES if name not in model_state.fields]
        if missing:
            gaps[model] = missing
    return gaps


def index_gaps(job_models: Iterable[type[models.Model]]) -> dict[Any, list[str]]:
    """For each managed job model that its app's migrations create: the names of its
    dequeue and waiting indexes (``WorkerJob.Meta``'s, or declared with
    ``dequeue_index()``) that those migrations do not make as declared (an upgrade
    that changed them, and ``makemigrations`` not run since)."""
    from .indexes import DequeueIndex, WaitingIndex

    gaps: dict[Any, list[str]] = {}
    for model, model_state in _migrated(job_models):
        made = model_state.options.get("indexes", [])
        missing = [
            index.name
            for index in model._meta.indexes
            if isinstance(index, DequeueIndex | WaitingIndex) and index not in made
        ]
        if missing:
            gaps[model] = missing
    return gaps


def makemigrations_advice(model: type[models.Model]) -> str:
    app = model._meta.app_label
    return f"run `python manage.py makemigrations {app}`, then `python manage.py migrate`"


def missing_columns(model: type[models.Model], alias: str) -> str | None:
    """None when the table of ``model`` in database ``alias`` has each of its columns;
    otherwise one line saying which it lacks and what to run. Raises
    ``DatabaseError`` when the database cannot tell."""
    connection = connections[alias]
    table = model._meta.db_table
    with connection.cursor() as cursor:
        present = {c.name for c in connection.introspection.get_table_description(cursor, table)}
    lacking = [str(f.column) for f in model._meta.concrete_fields if str(f.column) not in present]
    if not lacking:
        return None
    gaps = migration_gaps([model]).get(model)
    advice = makemigrations_advice(model) if gaps else _columns_advice(model, alias)
    return f"{table} lacks columns {', '.join(lacking)} of {model._meta.label}: {advice}"


def _columns_advice(model: type[models.Model], alias: str) -> str:
    """What to run for columns the table lacks: ``makemigrations`` when the model has
    changes no migration holds (Django's autodetector, as ``makemigrations --check``
    tells), ``migrate`` when a migration of its app is not applied."""
    app_label = model._meta.app_label
    loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
    if _unmigrated_changes(loader, model):
        return f"the model has changes no migration holds: {makemigrations_advice(model)}"
    unapplied = sorted(
        f"{app}.{migration}"
        for app, migration in loader.graph.nodes
        if app == app_label and (app, migration) not in loader.applied_migrations
    )
    if unapplied:
        return f"run `python manage.py migrate` (not applied: {', '.join(unapplied)})"
    return (
        f"the migrations of app {app_label!r} are all applied in {alias!r} and hold the "
        "model as it is, so the columns were dropped or renamed outside migrations"
    )


def _unmigrated_changes(loader: MigrationLoader, model: type[models.Model]) -> bool:
    """Whether ``makemigrations`` would write a migration for ``model``: the changes the
    autodetector finds between the app's migrations and its models touch it."""
    from django.apps import apps
    from django.db.migrations.autodetector import MigrationAutodetector
    from django.db.migrations.state import ProjectState

    app_label, name = model._meta.app_label, model._meta.model_name
    try:
        changes = MigrationAutodetector(
            loader.project_state(), ProjectState.from_apps(apps)
        ).changes(graph=loader.graph, trim_to_apps={app_label})
    except Exception:  # migrations Django cannot read: makemigrations says what is wrong
        return False
    for migration in changes.get(app_label, []):
        for operation in migration.operations:
            touched = getattr(operation, "model_name", None) or getattr(operation, "name", "")
            if str(touched).lower() == name:
                return True
    return False


def missing_table(model: type[models.Model], alias: str) -> str | None:
    """None when the table of ``model`` exists in database ``alias`` with each of its
    columns; otherwise one line saying what is missing and what to run. Raises
    ``DatabaseError`` when the database cannot tell."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        tables = connection.introspection.table_names(cursor)
    if model._meta.db_table in tables:
        return missing_columns(model, alias)
    return (
        f"table {model._meta.db_table!r} of {model._meta.label} does not exist in database "
        f"{alias!r}; {_table_advice(model, alias)}"
    )


def _table_advice(model: type[models.Model], alias: str) -> str:
    """Why a table is missing, from the app's migrations: none creates the model
    (makemigrations), one that does is not applied (migrate), or neither."""
    app_label, name = model._meta.app_label, model._meta.model_name
    makemigrations = makemigrations_advice(model)
    if not model._meta.managed:
        return "the model is unmanaged (Meta.managed = False): create the table yourself"
    if not router.allow_migrate_model(alias, model):
        return f"the database routers do not let migrate create it in {alias!r}"
    loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
    if app_label in loader.unmigrated_apps or app_label not in loader.migrated_apps:
        return f"app {app_label!r} has no migrations: {makemigrations}"
    state = loader.project_state()
    if (app_label, name) not in state.models:
        return f"no migration of app {app_label!r} creates {model.__name__}: {makemigrations}"
    try:
        planned_table = state.apps.get_model(app_label, name)._meta.db_table
    except Exception:  # a state the loader cannot render: say nothing about it
        planned_table = model._meta.db_table
    if planned_table != model._meta.db_table:
        return (
            f"the migrations of app {app_label!r} name its table {planned_table!r}: "
            f"{makemigrations}"
        )
    unapplied = sorted(
        f"{app}.{migration}"
        for app, migration in loader.graph.nodes
        if app == app_label and (app, migration) not in loader.applied_migrations
    )
    if unapplied:
        return f"run `python manage.py migrate` (not applied: {', '.join(unapplied)})"
    return (
        f"the migrations of app {app_label!r} are all recorded as applied in {alias!r}, so "
        "the table was dropped or renamed outside migrations"
    )
