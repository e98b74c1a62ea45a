"""The checks of the handlers ``DBWORKER["HANDLERS"]`` lists (``dbworker.E002``–E012,
reported as W003; W001) and of the connections a worker running them needs (W007);
``validate_handler``, which the worker commands reuse."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.core import checks
from django.core.exceptions import FieldDoesNotExist
from django.db import connections, router
from django.db.models import Q

from .. import conf
from ..handler import Handler, HandlerImportError, import_handler, seconds
from ..text import sentence
from .job_models import SUPPORTED_VENDORS, _is_worker_job, _mti_error, concrete_job_parent
from .settings import _check_settings, _check_tasks_app, _middleware_problems


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
            from ..sql.filters import FILTER_ERRORS, compile_filter

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
        from ..control.checks import validate_controls, validate_limits

        errors.extend(validate_controls(handler, model, name, cls))
        errors.extend(validate_limits(handler, model, name, cls))
        from ..control.fair import validate_fair

        errors.extend(validate_fair(handler, model, name, cls))
        from ..support import handler_problems, transaction_problems

        errors.extend(handler_problems(handler, model, name, cls))
        from ..partitions import partition_problems

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
    from ..control.checks import shared_schedule_names

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


@checks.register("dbworker")
def check_connection_budget(**kwargs: Any) -> list[checks.CheckMessage]:
    """``DBWORKER["CONNECTION_BUDGET"]``: the connections a worker process running
    ``DBWORKER["HANDLERS"]`` may hold at most fit in it (``dbworker.W007``)."""
    budget = conf.get("CONNECTION_BUDGET")
    if budget is None or _check_settings():
        return []
    from ..runtime.budget import worker_need

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
