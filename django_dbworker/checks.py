"""System checks (``dbworker.E001`` …) and the handler validation commands reuse."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import FieldDoesNotExist
from django.db import connections, router
from django.db.models import Q

from . import conf
from .handler import Handler, HandlerImportError, import_handler, seconds

SUPPORTED_VENDORS = ("postgresql", "sqlite")


def _is_worker_job(model: Any) -> bool:
    from .models import WorkerJob

    return isinstance(model, type) and issubclass(model, WorkerJob)


def validate_handler(handler: Handler | type[Handler]) -> list[checks.CheckMessage]:
    """Every problem with a handler's model and options, as check messages."""
    cls = handler if isinstance(handler, type) else type(handler)
    options: Any = handler  # user input: check the values, not their annotations
    name = cls.get_name()
    errors: list[checks.CheckMessage] = []

    def error(msg: str, id: str, hint: str | None = None) -> None:
        errors.append(checks.Error(f"{name}: {msg}", hint=hint, obj=cls, id=id))

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
        if secs < 0 or (secs == 0 and not zero):
            error(
                f"{attr} must be {'>= 0' if zero else 'positive'}, not {value!r}.", "dbworker.E004"
            )
            return None
        return secs

    positive_int("num_handlers", 1)
    positive_int("prefetch", 0)
    positive_int("max_num_retries", 0)
    positive_int("max_num_resets", 0)
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
    backoff = options.retry_backoff
    if isinstance(backoff, bool) or not isinstance(backoff, int | float) or backoff < 1:
        error(f"retry_backoff must be a number >= 1, not {backoff!r}.", "dbworker.E004")
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
    if model is not None and _is_worker_job(model) and not model._meta.abstract:
        errors.extend(_check_ordering(handler, model, name, cls))
        if isinstance(options.dequeue_filter, Q):
            from .lane import FILTER_ERRORS, compile_filter

            wrapper = connections[router.db_for_write(model)]
            try:
                compile_filter(model, options.dequeue_filter, wrapper, "pk")
            except FILTER_ERRORS as exc:
                error(
                    f"dequeue_filter cannot be used: {type(exc).__name__}: {exc}",
                    "dbworker.E004",
                    "Use lookups on the job model's fields that this database supports.",
                )
        vendor = connections[router.db_for_write(model)].vendor
        if vendor not in SUPPORTED_VENDORS:
            error(
                f"database vendor {vendor!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_VENDORS)}).",
                "dbworker.E006",
            )
    return errors


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
    unknown = sorted(set(value) - set(conf.DEFAULTS))
    if unknown:
        errors.append(
            checks.Error(
                f"DBWORKER has unknown keys: {', '.join(unknown)}.",
                hint=f"Known keys: {', '.join(sorted(conf.DEFAULTS))}.",
                id="dbworker.E001",
            )
        )
    handlers = value.get("HANDLERS", [])
    if not isinstance(handlers, list | tuple) or not all(isinstance(h, str) for h in handlers):
        errors.append(
            checks.Error("DBWORKER['HANDLERS'] must be a list of dotted paths.", id="dbworker.E001")
        )
    for key in ("RESET_INTERVAL", "WORKER_RETENTION"):
        if key in value and not _positive_number(value[key]):
            errors.append(
                checks.Error(f"DBWORKER[{key!r}] must be a positive number.", id="dbworker.E001")
            )
    if (
        "STATEMENT_TIMEOUT" in value
        and value["STATEMENT_TIMEOUT"] is not None
        and not (_positive_number(value["STATEMENT_TIMEOUT"]))
    ):
        errors.append(
            checks.Error(
                "DBWORKER['STATEMENT_TIMEOUT'] must be a positive number or None.",
                id="dbworker.E001",
            )
        )
    for key in ("PREPARED_STATEMENTS", "NOTIFY"):
        if key in value and not isinstance(value[key], bool):
            errors.append(
                checks.Error(f"DBWORKER[{key!r}] must be True or False.", id="dbworker.E001")
            )
    for key in ("MAX_FAILURE_MESSAGE_LENGTH", "MAX_LOG_OUTPUT_LENGTH"):
        if key in value and not (isinstance(value[key], int) and value[key] >= 100):
            errors.append(
                checks.Error(f"DBWORKER[{key!r}] must be an integer >= 100.", id="dbworker.E001")
            )
    return errors


def _positive_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and value > 0


@checks.register("dbworker")
def check_settings_and_handlers(**kwargs: Any) -> list[checks.CheckMessage]:
    errors = _check_settings()
    if errors:
        return errors
    for path in conf.get("HANDLERS"):
        try:
            handler_cls = import_handler(path)
        except HandlerImportError as exc:
            errors.append(checks.Error(f"DBWORKER['HANDLERS']: {exc}.", id="dbworker.E002"))
            continue
        errors.extend(validate_handler(handler_cls))
    return errors


@checks.register("dbworker", checks.Tags.models)
def check_job_models(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Concrete job models keep the dequeue index (their Meta inherits WorkerJob.Meta)."""
    from .models import DEQUEUE_INDEX_CONDITION

    messages: list[checks.CheckMessage] = []
    models = (
        apps.get_models()
        if app_configs is None
        else [m for config in app_configs for m in config.get_models()]
    )
    for model in models:
        if not _is_worker_job(model):
            continue
        if not any(index.condition == DEQUEUE_INDEX_CONDITION for index in model._meta.indexes):
            messages.append(
                checks.Warning(
                    f"{model._meta.label} has no dequeue index, so claims scan finished rows.",
                    hint="Let its Meta inherit WorkerJob.Meta (class Meta(WorkerJob.Meta)), or "
                    "add django_dbworker.models.dequeue_index(...) to Meta.indexes.",
                    obj=model,
                    id="dbworker.W002",
                )
            )
    return messages
