"""A ``Q`` as the WHERE fragment of a claim (``dequeue_filter``, ``pre_dequeue``)."""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import EmptyResultSet, FieldError, FullResultSet
from django.db import NotSupportedError, models
from django.db.backends.base.base import BaseDatabaseWrapper

#: What compiling a bad ``Q`` raises (an unknown field, a lookup the database lacks):
#: a mistake in the handler, not a database failure.
FILTER_ERRORS = (FieldError, NotSupportedError, TypeError, ValueError)

_POSITIONAL = re.compile(r"(?<!%)%s")


def compile_filter(
    model: type[models.Model],
    q: models.Q,
    wrapper: BaseDatabaseWrapper,
    pk_column: str,
    prefix: str = "f",
) -> tuple[str, dict[str, Any]] | None:
    """A ``Q`` as a WHERE fragment with named parameters (``%(f0)s``…, after
    ``prefix``); None if it matches nothing.

    Conditions on the job table's own columns are inlined; conditions that need
    joins become ``pk IN (subquery)``. Values stay parameters. Raises one of
    ``FILTER_ERRORS`` for a ``Q`` the model or the database cannot take.
    """
    query = model._base_manager.filter(q).query
    try:
        if len(query.alias_map) <= 1:
            sql, params = query.get_compiler(connection=wrapper).compile(query.where)
        else:
            sub = model._base_manager.filter(q).order_by().values("pk").query
            sql, params = sub.get_compiler(connection=wrapper).as_sql()
            sql = f"{pk_column} IN ({sql})"
    except EmptyResultSet:
        return None
    except FullResultSet:
        return "", {}
    names = iter(range(len(params)))
    named = _POSITIONAL.sub(lambda match: f"%({prefix}{next(names)})s", sql)
    return named, {f"{prefix}{i}": value for i, value in enumerate(params)}
