"""Fair claims across the values of a field (``Handler.fair_by``): the weights of the
keys, and the system checks of the options (the statements are ``sql.fair``'s)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from django.core import checks
from django.core.exceptions import FieldDoesNotExist
from django.db import models

logger = logging.getLogger("django_dbworker.lane")

#: Seconds a claim reuses the weights of the keys it found (a key that appears meanwhile
#: weighs 1 until then): the keys are listed again, and the weights asked for, at most
#: this often; on MariaDB, where listing them reads every claimable row, ``SLOW_REFRESH``.
REFRESH = 1.0
SLOW_REFRESH = 10.0


def weight_of(weights: Any, key: Any) -> float:
    """The weight ``fair_weights`` gives ``key`` (1 where it says nothing)."""
    if weights is None:
        return 1.0
    value = weights(key) if callable(weights) else weights.get(key, 1)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"the weight of {key!r} is {value!r}, not a number")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"the weight of {key!r} is {value!r}, not a positive number")
    return float(value)


class FairWeights:
    """The ``dbw_fair`` parameter of a handler's fair claims: the weight of each key
    with claimable rows, found at most every ``REFRESH`` seconds."""

    def __init__(self, handler: Any, model: type[models.Model], refresh: float = REFRESH) -> None:
        self.refresh = refresh
        self.weights = handler.fair_weights
        self.field: Any = model._meta.get_field(handler.fair_by)
        self.label = handler.get_name()
        self._at = -math.inf
        self._known: dict[str, float] = {}

    @property
    def weighted(self) -> bool:
        return self.weights is not None

    def current(self, list_keys: Callable[[], list[tuple[Any, ...]]]) -> dict[str, float]:
        """{key as text: weight} of the keys ``list_keys()`` returns ((value, text)
        each), listed again when the last list is older than ``REFRESH``."""
        now = time.monotonic()
        if now - self._at < self.refresh:
            return self._known
        known: dict[str, float] = {}
        for value, text in list_keys():
            key = self._python(value)
            try:
                name = text.decode() if isinstance(text, bytes | bytearray) else str(text)
                known[name] = weight_of(self.weights, key)
            except Exception:
                logger.exception("%s: fair_weights failed for %r; weighing it 1", self.label, key)
        self._known, self._at = known, now
        return known

    def _python(self, value: Any) -> Any:
        """A key as the database returned it, as the model holds it."""
        field = getattr(self.field, "target_field", None) or self.field
        try:
            return field.to_python(value)
        except Exception:
            return value


def validate_fair(handler: Any, model: Any, name: str, cls: type) -> Iterator[Any]:
    """Problems with ``fair_by`` and ``fair_weights`` (E017); a missing fair index (W012)."""

    def error(message: str, hint: str | None = None) -> Any:
        return checks.Error(f"{name}: {message}", hint=hint, obj=cls, id="dbworker.E017")

    field_name = handler.fair_by
    weights = handler.fair_weights
    if field_name is None:
        if weights is not None:
            yield error("fair_weights needs fair_by (the field that names each key).")
        return
    try:
        field = model._meta.get_field(field_name) if isinstance(field_name, str) else None
    except FieldDoesNotExist:
        field = None
    if field is None or not field.concrete or field.primary_key:
        yield error(
            f"fair_by {field_name!r} is not a field of {model.__name__}.",
            hint="Name a concrete field of the job model, e.g. fair_by = 'tenant_id'.",
        )
        return
    if isinstance(field, models.TextField | models.JSONField | models.BinaryField):
        yield error(
            f"fair_by {field_name!r} is a {type(field).__name__}: fair claims group and "
            "index the keys.",
            hint="Use a CharField, an integer, a UUID or a foreign key.",
        )
    if weights is not None and not callable(weights):
        if not isinstance(weights, Mapping):
            yield error(
                f"fair_weights must be a dict (key -> weight) or a callable, not {weights!r}."
            )
        else:
            for key in weights:
                try:
                    weight_of(weights, key)
                except (TypeError, ValueError) as exc:
                    yield error(f"fair_weights: {exc}.", hint="Weights are numbers > 0.")
                    break
    if not has_fair_index(model, field):
        yield checks.Warning(
            f"{name}: fair_by {field_name!r} has no fair index on {model.__name__}: each "
            "fair claim reads every claimable row.",
            hint=f"Add django_dbworker.models.fair_index({field_name!r}, "
            f"{', '.join(repr(o) for o in _ordering(handler, model))}, name=...) to "
            "Meta.indexes and run makemigrations.",
            obj=cls,
            id="dbworker.W012",
        )


def _ordering(handler: Any, model: Any) -> list[str]:
    pk = model._meta.pk.name
    return [pk if item.lstrip("-") == "pk" else item for item in handler.ordering]


def has_fair_index(model: Any, field: Any) -> bool:
    """Whether ``model`` declares an index that starts with ``field`` over the claimable
    rows (``fair_index()``)."""
    return fair_index_name(model, field) is not None


def fair_index_name(model: Any, field: Any) -> str | None:
    """The name of the first ``fair_index()`` of ``field`` (a field or its name) that
    ``model`` declares; None if it declares none."""
    from ..models import DEQUEUE_INDEX_CONDITION

    if isinstance(field, str):
        field = model._meta.get_field(field)
    names = {field.name, field.attname}
    for index in model._meta.indexes:
        if index.condition != DEQUEUE_INDEX_CONDITION or not index.fields:
            continue
        if index.fields[0] in names:
            return str(index.name)
    return None
