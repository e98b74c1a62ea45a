"""Rows a claim returned, as model instances; keys as statements return them."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.base import ModelState

from ..instances import plain

#: JSON texts most job rows hold (an empty error list, no result yet, no arguments),
#: made without the parser: a measurable share of building a claimed row otherwise.
_COMMON_JSON: dict[str, Callable[[], Any]] = {"[]": list, "{}": dict, "null": type(None)}


def _plain_json(field: models.Field[Any, Any]) -> bool:
    """A ``JSONField`` that decodes as Django's does (no decoder, no override)."""
    return (
        isinstance(field, models.JSONField)
        and type(field).from_db_value is models.JSONField.from_db_value
        and field.decoder is None
    )


def _json_converter(field: models.Field[Any, Any]) -> Callable[..., Any]:
    slow: Callable[..., Any] = getattr(field, "from_db_value")  # noqa: B009

    def convert(value: Any, expression: Any, connection: Any) -> Any:
        if type(value) is str:
            make = _COMMON_JSON.get(value)
            if make is not None:
                return make()
        elif value is None:
            return None
        return slow(value, expression, connection)

    return convert


def _aware_converter(func: Callable[..., Any], connection: Any) -> Callable[..., Any]:
    """MySQL's datetime converter (``timezone.make_aware`` of every naive value in the
    connection's time zone) made cheaper: the worker's connections read naive
    datetimes only (``mysql.conversions``), so it sets their zone directly, as
    ``make_aware`` does once it found them naive. Any other converter as it is."""
    zone = getattr(connection, "timezone", None)
    if (
        connection.vendor != "mysql"
        or zone is None
        or getattr(func, "__name__", "") != "convert_datetimefield_value"
    ):
        return func

    combine = datetime.datetime.combine  # a sixth of replace(tzinfo=…)'s time

    def aware(value: Any, expression: Any, connection: Any) -> Any:
        return None if value is None else combine(value, value.time(), zone)

    return aware


class JobRows:
    """Turns the rows of one job table into instances, without further queries."""

    def __init__(self, model: type[models.Model], connection: BaseDatabaseWrapper) -> None:
        meta = model._meta
        assert meta.pk is not None
        self.model = model
        self.fields = list(meta.concrete_fields)
        self.attnames = [f.attname for f in self.fields]
        self.logs_index = self.attnames.index("execution_logs")
        self.pk_index = next(i for i, f in enumerate(self.fields) if f.primary_key)
        self._connection = connection
        self.converters = self._converters(connection)
        pk_expression = meta.pk.get_col(meta.db_table)
        self._pk_converters = [
            (func, pk_expression)
            for func in connection.ops.get_db_converters(pk_expression)
            + pk_expression.get_db_converters(connection)
        ]

    def _converters(
        self, connection: BaseDatabaseWrapper
    ) -> list[tuple[int, list[Callable[..., Any]], Any]]:
        converters = []
        for i, field in enumerate(self.fields):
            if i == self.logs_index:
                continue  # a claim always returns '[]' here (see build_row)
            expression = field.get_col(self.model._meta.db_table)
            funcs = connection.ops.get_db_converters(expression) + expression.get_db_converters(
                connection
            )
            if funcs == [getattr(field, "from_db_value", None)] and _plain_json(field):
                funcs = [_json_converter(field)]
            funcs = [_aware_converter(func, connection) for func in funcs]
            if funcs:
                converters.append((i, funcs, expression))
        return converters

    # -- keys ------------------------------------------------------------------------

    def key(self, value: Any) -> Any:
        """A key as a statement returned it, as the model holds it (``job.pk``)."""
        for func, expression in self._pk_converters:
            value = func(value, expression, self._connection)
        return value

    def keys(self, rows: Sequence[Sequence[Any]]) -> list[Any]:
        """The keys in the first column of ``rows``."""
        if not self._pk_converters:
            return [row[0] for row in rows]
        return [self.key(row[0]) for row in rows]

    # -- instances -------------------------------------------------------------------

    def plain_instances(self) -> bool:
        """Whether claimed rows may skip ``Model.from_db`` and ``__init__``."""
        return plain(self.model)

    def build(self, rows: Sequence[Sequence[Any]], alias: str, connection: Any) -> list[Any]:
        """Model instances from the rows a claim returned (no further queries)."""
        plain = self.plain_instances()
        return [self.build_row(row, alias, connection, plain) for row in rows]

    def build_row(self, row: Sequence[Any], alias: str, connection: Any, plain: bool) -> Any:
        """One model instance from a row a claim returned; raises if a column cannot be
        converted (the row's primary key is ``row[self.pk_index]`` whatever happens)."""
        values = list(row)
        for i, funcs, expression in self.converters:
            value = values[i]
            for func in funcs:
                value = func(value, expression, connection)
            values[i] = value
        values[self.logs_index] = []  # the claim has just emptied the execution log
        model = self.model
        if not plain:
            return model.from_db(alias, self.attnames, values)
        # What Model.from_db does for a full row, minus the signals nobody listens to
        # and the per-field __init__ work: a measurable share of a no-op job's cost.
        obj = model.__new__(model)
        obj.__dict__.update(zip(self.attnames, values, strict=True))
        state = obj._state = ModelState()
        state.adding = False
        state.db = alias
        return obj

    def sort(self, jobs: list[Any], ordering: Sequence[str]) -> list[Any]:
        """Claimed jobs in claim order, as SQLite orders them (NULLs first ascending),
        for a dialect whose claims do not return them ordered."""
        if len(jobs) < 2:
            return jobs
        meta = self.model._meta
        for item in reversed(ordering):
            desc = item.startswith("-")
            name = item[1:] if desc else item
            field: Any = None if name == "pk" else meta.get_field(name)
            attname = "pk" if field is None else field.attname

            def key(job: Any, attname: str = attname) -> tuple[bool, Any]:
                value = getattr(job, attname)
                return (value is not None, value if value is not None else 0)

            jobs.sort(key=key, reverse=desc)
        return jobs
