"""Model instances without ``Model.__init__``, where nothing needs it.

Django's constructor costs about 15 µs per instance with keyword arguments. That is
more than the rest of ``bulk_enqueue`` (a ``COPY``) and more than a claimed job's
bookkeeping. ``plain()`` tells whether a model can skip it. ``Builder`` makes the
instance of a mapping of field values, as ``Model(**values)`` would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.db import models
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init


def plain(model: type[models.Model]) -> bool:
    """Whether instances of ``model`` may skip ``__init__`` (and ``from_db``): the model
    overrides neither, and nobody listens to the signals ``__init__`` sends."""
    overridden = {
        name
        for klass in model.__mro__
        if klass is not models.Model and issubclass(klass, models.Model)
        for name in ("__init__", "from_db")
        if name in vars(klass)
    }
    return not (overridden or pre_init.has_listeners(model) or post_init.has_listeners(model))


class Builder:
    """``build(values)``: the unsaved instance ``Model(**values)`` would make, each
    field not in ``values`` at its default (a callable default called for each)."""

    def __init__(self, model: type[models.Model]) -> None:
        self.model = model
        self.plain = plain(model)
        #: Field name or attname → the field.
        self.fields: dict[str, Any] = {}
        #: attname → default, for defaults that are the same for every instance.
        self.constant: dict[str, Any] = {}
        #: (attname, make) for the others (callable defaults).
        self.fresh: list[tuple[str, Callable[[], Any]]] = []
        for field in model._meta.concrete_fields:
            self.fields[field.name] = self.fields[field.attname] = field
            if field.has_default() and callable(field.default):
                self.fresh.append((field.attname, field.get_default))
            else:  # a value, or the database's default (one expression, never changed)
                self.constant[field.attname] = field.get_default()

    def build(self, values: Mapping[str, Any]) -> Any:
        model = self.model
        if not isinstance(values, Mapping):
            raise TypeError(
                f"expected {model.__name__} instances or mappings of their field values, "
                f"not {type(values).__name__}"
            )
        if not self.plain or not self.fields.keys() >= values.keys():
            return model(**values)  # properties, signals: as Django does it (or refuses)
        data = dict(self.constant)
        for attname, make in self.fresh:
            data[attname] = make()
        for key, value in values.items():
            field = self.fields[key]
            if key != field.attname and isinstance(value, models.Model):
                value = getattr(value, field.target_field.attname)  # a related instance
            data[field.attname] = value
        obj = model.__new__(model)
        obj.__dict__.update(data)
        obj._state = ModelState()
        return obj
