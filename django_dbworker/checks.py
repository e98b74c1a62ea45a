"""System checks (``dbworker.E001`` …) and the handler validation commands reuse."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import FieldDoesNotExist
from django.db import connections, router
from django.db.models import CheckConstraint, Q

from . import conf, schema
from .handler import Handler, HandlerImportError, import_handler, seconds
from .text import sentence

SUPPORTED_VENDORS = ("postgresql", "sqlite", "mysql")


def _is_worker_job(model: Any) -> bool:
    from .models import WorkerJob

    return isinstance(model, type) and issubclass(model, WorkerJob)


def validate_handler(handler: Handler | type[Handler]) -> list[checks.CheckMessage]:
    """Every problem with a handler's model and options, as check messages."""
    cls = handler if isinstance(handler, type) else type(handler)
    options: Any = handler  # user input: check the values, not their annotations
    name = Handler.get_name(handler)  # type: ignore[arg-type]
    errors: list[checks.CheckMessage] = []

    def error(msg: str, id: str, hint: str | None = None) -> None:
        errors.append(checks.Error(f"{name}: {msg}", hint=hint, obj=cls, id=id))

    for message, hint in _attribute_problems(cls):
        error(message, "dbworker.E014", hint)
    if not _defines_handle(handler):
        typo = _near_handle(cls)
        error(
            "defines no handle(job) method, so every job it claims would fail.",
            "dbworker.E007",
            f"Rename {typo!r} to 'handle'." if typo else "Define handle(self, job) on the class.",
        )

    model = handler.model
    if model is None:
        error("has no model.", "dbworker.E003", "Set `model = YourJob` on the handler class.")
    elif not _is_worker_job(model):
        error(
            f"model {model!r} is not a subclass of django_dbworker.models.WorkerJob.",
            "dbworker.E003",
        )
    elif model._meta.abstract:
        error(f"model {model.__name__} is abstract; give it a concrete model.", "dbworker.E003")
    elif (parent := concrete_job_parent(model)) is not None:
        errors.append(_mti_error(model, parent, prefix=f"{name}: model ", obj=cls))

    def positive_int(attr: str, minimum: int) -> None:
        value = getattr(handler, attr)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            error(f"{attr} must be an integer >= {minimum}, not {value!r}.", "dbworker.E004")

    def duration(attr: str, *, optional: bool = False, zero: bool = False) -> float | None:
        value = getattr(handler, attr)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
            error(
                f"{attr} must be a timedelta or a number of seconds, not {value!r}.",
                "dbworker.E004",
            )
            return None
        secs = seconds(value)
        assert secs is not None
        if not math.isfinite(secs):
            error(f"{attr} must be a finite duration, not {value!r}.", "dbworker.E004")
            return None
        if secs < 0 or (secs == 0 and not zero):
            error(
                f"{attr} must be {'>= 0' if zero else 'positive'}, not {value!r}.", "dbworker.E004"
            )
            return None
        return secs

    positive_int("num_handlers", 1)
    weight = options.weight
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100_000:
        error(f"weight must be an integer from 1 to 100,000, not {weight!r}.", "dbworker.E004")
    positive_int("prefetch", 0)
    positive_int("max_num_retries", 0)
    positive_int("max_num_resets", 0)
    if options.max_snoozes is not None:
        positive_int("max_snoozes", 0)
    interval = duration("interval")
    max_interval = duration("max_interval", optional=True)
    if interval and max_interval and max_interval < interval:
        error(
            f"max_interval ({max_interval:g}s) must not be less than interval ({interval:g}s).",
            "dbworker.E004",
        )
    heartbeat = duration("heartbeat_interval")
    duration("retry_after", zero=True)
    duration("retry_max_delay", optional=True)
    stalled = duration("stalled_max_age")
    duration("maximum_runtime_per_job", optional=True)
    duration("maximum_runtime_grace", zero=True)
    backoff = options.retry_backoff
    if (
        isinstance(backoff, bool)
        or not isinstance(backoff, int | float)
        or not math.isfinite(backoff)
        or backoff < 1
    ):
        error(f"retry_backoff must be a finite number >= 1, not {backoff!r}.", "dbworker.E004")
    for flag in ("interrupt_on_cancel", "ack_each_job"):
        if not isinstance(getattr(options, flag), bool):
            error(f"{flag} must be True or False.", "dbworker.E004")
    if options.dequeue_filter is not None and not isinstance(options.dequeue_filter, Q):
        error("dequeue_filter must be a django.db.models.Q or None.", "dbworker.E004")
    if heartbeat and stalled and stalled < 3 * heartbeat:
        errors.append(
            checks.Warning(
                f"{name}: stalled_max_age ({stalled:g}s) is less than three heartbeat "
                f"intervals ({heartbeat:g}s); a slow heartbeat can get a live job reset.",
                hint="Raise stalled_max_age or lower heartbeat_interval.",
                obj=cls,
                id="dbworker.W001",
            )
        )
    if (
        model is not None
        and _is_worker_job(model)
        and not model._meta.abstract
        and concrete_job_parent(model) is None
    ):
        errors.extend(_check_ordering(handler, model, name, cls))
        if isinstance(options.dequeue_filter, Q):
            from .sql.filters import FILTER_ERRORS, compile_filter

            wrapper = connections[router.db_for_write(model)]
            try:
                compile_filter(model, options.dequeue_filter, wrapper, "pk")
            except FILTER_ERRORS as exc:
                error(
                    f"dequeue_filter cannot be used: {type(exc).__name__}: {exc}",
                    "dbworker.E004",
                    "Use lookups on the job model's fields that this database supports.",
                )
        for problem in _middleware_problems(options.middleware):
            error(f"middleware: {problem}", "dbworker.E011")
        from .control.checks import validate_controls, validate_limits

        errors.extend(validate_controls(handler, model, name, cls))
        errors.extend(validate_limits(handler, model, name, cls))
        from .control.fair import validate_fair

        errors.extend(validate_fair(handler, model, name, cls))
        from .support import handler_problems, transaction_problems

        errors.extend(handler_problems(handler, model, name, cls))
        from .partitions import partition_problems

        errors.extend(partition_problems(handler, model, name, cls))
        errors.extend(transaction_problems(handler, model, name, cls))
        vendor = connections[router.db_for_write(model)].vendor
        if vendor not in SUPPORTED_VENDORS:
            error(
                f"database vendor {vendor!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_VENDORS)}).",
                "dbworker.E006",
            )
    return errors


def _own_attributes(cls: type) -> dict[str, Any]:
    """The public attributes the classes of a handler declare, but ours (the most
    derived first)."""
    found: dict[str, Any] = {}
    for klass in cls.__mro__:
        if not issubclass(klass, Handler) or klass.__module__.startswith("django_dbworker."):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_"):
                found.setdefault(name, value)
    return found


def _attribute_problems(cls: type) -> Iterable[tuple[str, str]]:
    """(message, hint) for each attribute of a handler class that replaces a method of
    ``Handler`` with a value (or an option with a method), or that looks like a
    misspelt option: the engine would call a number, or ignore the setting."""
    options = {n for n in dir(Handler) if not n.startswith("_") and not _is_method(Handler, n)}
    methods = {n for n in dir(Handler) if not n.startswith("_") and _is_method(Handler, n)}
    for name, value in _own_attributes(cls).items():
        callable_value = callable(value) or isinstance(value, staticmethod | classmethod)
        if name in methods and not callable_value and not isinstance(value, property):
            close = difflib.get_close_matches(name, sorted(options), n=2, cutoff=0.5)
            named = " or ".join(map(repr, close))
            hint = f"Did you mean the option {named}?" if close else "Define it as a method."
            yield f"{name} = {value!r} replaces the method Handler.{name}() with a value.", hint
        elif name in options and callable_value and name not in _CALLABLE_OPTIONS:
            yield (
                f"{name} is an option of Handler, not a method ({name} = value).",
                "Set it as a class attribute.",
            )
        elif name not in options and name not in methods and not callable_value:
            close = difflib.get_close_matches(name, sorted(options), n=1, cutoff=0.8)
            if close:
                yield (
                    f"{name} is not an option of Handler: did you mean {close[0]!r}?",
                    "docs/reference.md lists the options; rename the attribute (an attribute "
                    "of your own with this name is taken for a misspelt option).",
                )


#: Options whose value may be a class or another callable.
_CALLABLE_OPTIONS = frozenset({"model", "fair_weights"})


def _is_method(cls: type, name: str) -> bool:
    value = getattr(cls, name)
    return callable(value) and not isinstance(value, type) and name not in _CALLABLE_OPTIONS


def _defines_handle(handler: Handler | type[Handler]) -> bool:
    cls = handler if isinstance(handler, type) else type(handler)
    own = not isinstance(handler, type) and "handle" in vars(handler)
    return own or cls.handle is not Handler.handle


def _near_handle(cls: type) -> str | None:
    """A method of the handler whose name looks like a misspelt ``handle``."""
    base = set(dir(Handler))
    names = {
        name
        for klass in cls.__mro__
        if klass is not Handler and issubclass(klass, Handler)
        for name, value in vars(klass).items()
        if name not in base and callable(value)
    }
    matches = difflib.get_close_matches("handle", sorted(names), n=1, cutoff=0.7)
    return matches[0] if matches else None


def _check_ordering(
    handler: Handler | type[Handler], model: Any, name: str, cls: type
) -> Iterable[checks.CheckMessage]:
    ordering = handler.ordering
    if isinstance(ordering, str) or not isinstance(ordering, list | tuple) or not ordering:
        yield checks.Error(
            f"{name}: ordering must be a non-empty tuple of field names, not {ordering!r}.",
            obj=cls,
            id="dbworker.E005",
        )
        return
    for item in ordering:
        field_name = item[1:] if isinstance(item, str) and item.startswith("-") else item
        if field_name == "pk":
            continue
        try:
            field = model._meta.get_field(field_name) if isinstance(field_name, str) else None
        except FieldDoesNotExist:
            field = None
        if field is None or not getattr(field, "concrete", False) or field.many_to_many:
            yield checks.Error(
                f"{name}: ordering item {item!r} is not a concrete field of {model.__name__}.",
                hint="Use model field names, optionally prefixed with '-'.",
                obj=cls,
                id="dbworker.E005",
            )


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


@checks.register("dbworker")
def check_settings_and_handlers(**kwargs: Any) -> list[checks.CheckMessage]:
    """The ``DBWORKER`` setting, and each handler it lists.

    A broken handler only stops the worker commands: it must not stop
    ``migrate`` or ``runserver`` of the whole site. So its errors (E002–E012)
    are reported here as ``dbworker.W003``, and ``runworker``/``runresetter``
    refuse to start with the error itself.
    """
    errors = _check_settings() + _check_tasks_app()
    if errors:
        return errors
    messages: list[checks.CheckMessage] = []
    imported = []
    for path in conf.get("HANDLERS"):
        try:
            handler_cls = import_handler(path)
        except HandlerImportError as exc:
            messages.append(_refuses_to_start(sentence(str(exc)), "dbworker.E002"))
            continue
        imported.append(handler_cls)
        for message in validate_handler(handler_cls):
            if message.is_serious():
                messages.append(_refuses_to_start(message.msg, message.id, message.hint))
            else:
                messages.append(message)
    from .control.checks import shared_schedule_names

    for message in shared_schedule_names(imported):
        messages.append(_refuses_to_start(message.msg, message.id, message.hint))
    return messages


def _refuses_to_start(msg: str, error_id: str | None, hint: str | None = None) -> checks.Warning:
    return checks.Warning(
        f"DBWORKER['HANDLERS']: {msg} runworker and runresetter will refuse to start "
        f"with this handler ({error_id}).",
        hint=hint,
        id="dbworker.W003",
    )


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
    from .models import (
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
    from .control.checks import unique_key_problems

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


def _middleware_problems(entries: Any) -> list[str]:
    """What is wrong with a list of middleware (factories or their dotted paths)."""
    from . import middleware

    if isinstance(entries, str) or not isinstance(entries, list | tuple):
        return [f"must be a list of factories or dotted paths, not {entries!r}"]
    problems = []
    for entry in entries:
        try:
            middleware.split(middleware.load([entry]))
        except (ImportError, TypeError, ValueError) as exc:
            problems.append(f"{entry!r} cannot be used: {exc}")
    return problems


@checks.register("dbworker")
def check_consumers(**kwargs: Any) -> list[checks.CheckMessage]:
    """The consumer settings (E207) and the consumers of ``DBWORKER["CONSUMERS"]``
    (E201–E206; E208 when one cannot be imported)."""
    from django.utils.module_loading import import_string

    from .consumers import Consumer
    from .consumers.checks import validate_consumer

    messages: list[checks.CheckMessage] = []
    for key in ("CONSUMER_LEASE", "CONSUMER_REBALANCE_INTERVAL", "CONSUMER_GAP_THRESHOLD"):
        value = conf.get(key)
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not (math.isfinite(value) and value > 0)
        ):
            messages.append(
                checks.Error(
                    f"DBWORKER[{key!r}] must be a positive finite number.", id="dbworker.E207"
                )
            )
    paths = conf.get("CONSUMERS")
    if not isinstance(paths, list | tuple):
        return [
            *messages,
            checks.Error(
                "DBWORKER['CONSUMERS'] must be a list of dotted paths.", id="dbworker.E208"
            ),
        ]
    for path in paths:
        try:
            cls = import_string(path)
        except ImportError as exc:
            messages.append(
                checks.Error(f"cannot import consumer {path!r}: {exc}", id="dbworker.E208")
            )
            continue
        if not (isinstance(cls, type) and issubclass(cls, Consumer)):
            messages.append(
                checks.Error(f"{path!r} is not a Consumer subclass.", id="dbworker.E208")
            )
            continue
        messages += validate_consumer(cls())
        from .support import consumer_problems

        messages += consumer_problems(cls, path)
    return messages


@checks.register("dbworker")
def check_connection_budget(**kwargs: Any) -> list[checks.CheckMessage]:
    """``DBWORKER["CONNECTION_BUDGET"]``: the connections a worker process running
    ``DBWORKER["HANDLERS"]`` may hold at most fit in it (``dbworker.W007``)."""
    budget = conf.get("CONNECTION_BUDGET")
    if budget is None or _check_settings():
        return []
    from .runtime.budget import worker_need

    handlers = []
    for path in conf.get("HANDLERS"):
        try:
            handler = import_handler(path)
        except HandlerImportError:
            continue  # dbworker.W003 says why
        if not any(message.is_serious() for message in validate_handler(handler)):
            handlers.append(handler)
    need = worker_need(handlers)
    if need.total <= budget:
        return []
    return [
        checks.Warning(
            f"a worker process running DBWORKER['HANDLERS'] may hold {need.total} database "
            f"connections ({need.describe()}), more than DBWORKER['CONNECTION_BUDGET'] "
            f"({budget}).",
            hint="Lower the handlers' num_handlers, give Django a connection pool "
            "(OPTIONS['pool'] with a max_size), split the handlers over more processes, or "
            "raise the budget; see docs/operations.md, 'Behind a connection pooler'.",
            id="dbworker.W007",
        )
    ]
