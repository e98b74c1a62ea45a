"""System checks of a handler's controls: schedules, queue_field, unique_by, limits."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from django.core import checks
from django.core.exceptions import FieldDoesNotExist
from django.db import models

from ..handler import Handler
from ..sql.waiting import condition_states
from ..text import sentence
from .limits import as_rate
from .models import RateBucket
from .periodic import Periodic


def validate_controls(handler: Any, model: Any, name: str, cls: type) -> Iterator[Any]:
    """Problems with ``schedules`` (E009), ``queue_field`` (E010) and ``unique_by``
    (W004) of a handler of concrete job model ``model``."""
    seen: set[str] = set()
    schedules = handler.schedules
    if not isinstance(schedules, list | tuple) or not all(
        isinstance(p, Periodic) for p in schedules
    ):
        yield checks.Error(
            f"{name}: schedules must be a list of django_dbworker.Periodic.",
            obj=cls,
            id="dbworker.E009",
        )
        schedules = []
    for periodic in Handler.periodic_schedules(handler) if schedules else ():
        if periodic.name in seen:
            yield checks.Error(
                f"{name}: two schedules are named {periodic.name!r}.",
                hint="Give each Periodic its own name=.",
                obj=cls,
                id="dbworker.E009",
            )
        seen.add(periodic.name)
        unknown = [f for f in periodic.fields if not _is_field(model, f)]
        if unknown:
            yield checks.Error(
                f"{name}: schedule {periodic.name!r} sets {', '.join(unknown)}, "
                f"not fields of {model.__name__}.",
                obj=cls,
                id="dbworker.E009",
            )
    if handler.queue_field is not None and not _is_field(model, handler.queue_field):
        yield checks.Error(
            f"{name}: queue_field {handler.queue_field!r} is not a field of {model.__name__}.",
            obj=cls,
            id="dbworker.E010",
        )
    unique_by = getattr(handler, "unique_by", ())
    if unique_by and not any(
        isinstance(c, models.UniqueConstraint) and set(c.fields) == set(unique_by)
        for c in model._meta.constraints
    ):
        yield checks.Warning(
            f"{name}: unique_by {tuple(unique_by)!r} has no unique constraint on "
            f"{model.__name__}, so enqueue_unique() cannot keep jobs unique.",
            hint=f"Add django_dbworker.unique_job_constraint({', '.join(map(repr, unique_by))}, "
            "name=...) to Meta.constraints and run makemigrations.",
            obj=cls,
            id="dbworker.W004",
        )


def shared_schedule_names(handlers: Iterable[Any]) -> Iterator[Any]:
    """E009 for each schedule name two handlers declare: a name is the schedule's row,
    shared by every worker, so two schedules of one name would each set it back to
    their own next tick and neither would ever come due."""
    owners: dict[str, list[str]] = {}
    for handler in handlers:
        if not isinstance(handler.schedules, list | tuple):
            continue  # E009 of its own
        for periodic in Handler.periodic_schedules(handler):
            owners.setdefault(periodic.name, []).append(Handler.get_name(handler))
    for name, declared_by in owners.items():
        if len(set(declared_by)) > 1:
            yield checks.Error(
                f"schedule {name!r} is declared by {' and '.join(sorted(set(declared_by)))}: "
                "schedule names are shared by every worker of the project.",
                hint="Give one of them another name= (Periodic(..., name=...)).",
                id="dbworker.E009",
            )


def validate_limits(handler: Any, model: Any, name: str, cls: type) -> Iterator[Any]:
    """Problems with the concurrency and rate limits of a handler (E012)."""

    def error(message: str, hint: str | None = None) -> Any:
        return checks.Error(f"{name}: {message}", hint=hint, obj=cls, id="dbworker.E012")

    for attr in ("max_concurrency", "max_concurrency_per_key"):
        value = getattr(handler, attr)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            yield error(f"{attr} must be None or an integer >= 1, not {value!r}.")
    rates = {}
    for attr in ("rate_limit", "rate_limit_per_key"):
        try:
            rates[attr] = as_rate(getattr(handler, attr))
        except ValueError as exc:
            yield error(sentence(f"{attr}: {exc}"))
    key = handler.concurrency_key
    if key is not None and not (isinstance(key, str) and _is_field(model, key)):
        yield error(f"concurrency_key {key!r} is not a field of {model.__name__}.")
    for attr in ("max_concurrency_per_key", "rate_limit_per_key"):
        if getattr(handler, attr) is not None and key is None:
            yield error(f"{attr} needs concurrency_key (the field that names each key).")
    if handler.rate_limit_per_key is not None and isinstance(key, str) and _is_field(model, key):
        # A key is never cut to fit its bucket: two keys sharing a prefix would share a
        # bucket. One that does not fit failed every claim of the handler (PostgreSQL,
        # MariaDB), so a field that may hold one is refused here.
        limit = RateBucket._meta.get_field("key").max_length or 255
        longest = _longest_text(model._meta.get_field(key))
        if longest is None or longest > limit:
            yield error(
                f"rate_limit_per_key: concurrency_key {key!r} may hold more than {limit} "
                f"characters{'' if longest is None else f' ({longest})'}, the most a rate "
                "bucket's key holds.",
                hint=f"Make it a CharField(max_length={limit}) or shorter, an integer or "
                "a UUID field (e.g. a digest of the longer value).",
            )


def _longest_text(field: Any) -> int | None:
    """The most characters the value of ``field`` has as text (0: short, whatever it
    is: numbers, dates, UUIDs); None: no bound (text, JSON, binary)."""
    field = getattr(field, "target_field", None) or field  # a foreign key: its target's
    if isinstance(field, models.CharField):
        return field.max_length
    if isinstance(field, models.TextField | models.JSONField | models.BinaryField):
        return None
    return 0


def _is_field(model: Any, name: str) -> bool:
    try:
        return bool(model._meta.get_field(name).concrete)
    except FieldDoesNotExist:
        return False


def unique_key_problems(model: Any) -> Iterator[Any]:
    """E016 for each unique constraint of job model ``model`` that holds its key in a
    set of states the engine cannot keep it in (``unique_job_constraint`` refuses
    those; a ``models.UniqueConstraint`` written by hand does not): held while running
    but not while waiting, a claim or a move back to waiting would fail on it."""
    from .unique import allowed_states

    for constraint in model._meta.constraints:
        states = condition_states(constraint)
        if states is None or allowed_states(set(states)):
            continue
        yield checks.Error(
            f"{model._meta.label}: unique constraint {constraint.name!r} holds its key in "
            f"{', '.join(sorted(states))}: neither every active state (queued, processing, "
            "errored) nor a waiting-only key (queued, maybe errored).",
            hint="Declare it with django_dbworker.unique_job_constraint(..., states=...) "
            "(docs/scheduling.md § Unique jobs).",
            obj=model,
            id="dbworker.E016",
        )
