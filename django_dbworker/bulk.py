"""The rows ``bulk_enqueue`` writes: each job's values as the database takes them.

Django's way, per job and field, is ``field.pre_save(obj, add=True)`` and then
``field.get_db_prep_save(value, connection)``: a few calls each. Done that way, it
costs more than the ``COPY`` that writes the row. ``Rows`` gives the same values
with less work:

- A field whose ``pre_save`` only reads the attribute (Django's own, and a date
  without ``auto_now`` or ``auto_now_add``) is read from the instance.
- A field of one of Django's own types, whose database value depends on the value
  alone, is prepared once for each distinct value in the batch. These are the
  queue's usual payload: keys, flags, ``None``.
- Every other field goes Django's way: ``auto_now_add``, and fields of your own
  types and their subclasses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.models.expressions import DatabaseDefault

#: Django's fields whose ``get_db_prep_save`` is a function of the value alone, and
#: whose equal values are written alike. These classes exactly: a subclass may prepare
#: its values as it likes. Not ``FloatField``: ``0.0 == -0.0``.
PURE_FIELDS = frozenset(
    {
        models.BigIntegerField,
        models.BooleanField,
        models.CharField,
        models.DateField,
        models.DateTimeField,
        models.DecimalField,
        models.EmailField,
        models.IntegerField,
        models.PositiveBigIntegerField,
        models.PositiveIntegerField,
        models.PositiveSmallIntegerField,
        models.SlugField,
        models.SmallIntegerField,
        models.TextField,
        models.UUIDField,
    }
)
#: Distinct values kept for each field. A field whose values are all different (a
#: payload's own id) stops being kept there and costs one dict lookup more a job.
KEPT = 1024


class Rows:
    """``of(obj)``: the fields ``obj`` writes (those whose value is not the database's
    default, ``db_default``) and their values for the database, in ``fields``' order."""

    def __init__(self, fields: Sequence[Any], connection: Any) -> None:
        self.connection = connection
        self.plans: list[tuple[Any, str, bool, Any, dict[Any, Any] | None]] = [
            (
                field,
                field.attname,
                _reads_attribute(field),
                field.get_db_prep_save,
                {} if type(field) in PURE_FIELDS else None,
            )
            for field in fields
        ]

    def of(self, obj: models.Model) -> tuple[tuple[Any, ...], list[Any]]:
        connection = self.connection
        used: list[Any] = []
        row: list[Any] = []
        for field, attname, plain, prep, kept in self.plans:
            value = getattr(obj, attname) if plain else field.pre_save(obj, add=True)
            if isinstance(value, DatabaseDefault):
                continue
            used.append(field)
            if kept is None:
                row.append(prep(value, connection))
                continue
            key = (value.__class__, value)  # 1, 1.0 and True are equal keys otherwise
            try:
                row.append(kept[key])
            except KeyError:
                row.append(prepared := prep(value, connection))
                if len(kept) < KEPT:
                    kept[key] = prepared
            except TypeError:  # unhashable
                row.append(prep(value, connection))
        return tuple(used), row


def _reads_attribute(field: Any) -> bool:
    """Whether ``field.pre_save(obj, add=True)`` is ``getattr(obj, field.attname)``."""
    if type(field).pre_save is models.Field.pre_save:
        return True
    dated = type(field) in (models.DateField, models.DateTimeField)
    return dated and not (field.auto_now or field.auto_now_add)
