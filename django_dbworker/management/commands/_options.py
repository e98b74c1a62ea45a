"""What runworker and runresetter share: handler loading and option parsing."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandError
from django.db import DatabaseError, connections, router

from django_dbworker import conf
from django_dbworker.checks import validate_handler
from django_dbworker.handler import Handler, HandlerImportError, import_handler


def number(
    value: str | None, name: str, *, kind: type = float, minimum: float = 0, inclusive: bool = False
) -> Any:
    """Parse an option value, or say in one line what is wrong with it."""
    if value is None:
        return None
    try:
        parsed = kind(value)
    except (TypeError, ValueError):
        raise CommandError(f"{name} must be a number, not {value!r}") from None
    if parsed < minimum or (parsed == minimum and not inclusive):
        bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
        raise CommandError(f"{name} must be {bound}, not {value!r}")
    return parsed


def load_handlers(paths: Sequence[str], **options: Any) -> list[Handler]:
    """Import, configure and validate handlers; a ``CommandError`` for any problem."""
    paths = list(paths) or list(conf.get("HANDLERS"))
    if not paths:
        raise CommandError(
            "no handlers: name them (e.g. myapp.workers.MyHandler) or list them in "
            "settings.DBWORKER['HANDLERS']"
        )
    handlers = []
    for path in paths:
        try:
            handler_cls = import_handler(path)
        except HandlerImportError as exc:
            raise CommandError(str(exc)) from None
        overrides = {key: value for key, value in options.items() if value is not None}
        handler = handler_cls(**overrides)
        errors = [m for m in validate_handler(handler) if m.is_serious()]
        if errors:
            first = errors[0]
            raise CommandError(f"{first.msg} ({first.id})")
        handlers.append(handler)
    return handlers


def check_tables(handlers: Sequence[Handler]) -> None:
    """Refuse to start on a job table that does not exist (a missing migration)."""
    logger = logging.getLogger("django_dbworker")
    for handler in handlers:
        model = handler.model
        assert model is not None
        alias = router.db_for_write(model)
        try:
            with connections[alias].cursor() as cursor:
                tables = connections[alias].introspection.table_names(cursor)
        except DatabaseError as exc:
            logger.warning("cannot check tables now (%s); starting anyway", exc)
            return
        if model._meta.db_table not in tables:
            raise CommandError(
                f"table {model._meta.db_table!r} of {model._meta.label} does not exist in "
                f"database {alias!r}; run `python manage.py migrate`"
            )


def configure_logging(verbosity: int) -> None:
    """Show the worker's log on stderr unless the project configured logging itself."""
    logger = logging.getLogger("django_dbworker")
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    if logger.level == logging.NOTSET or verbosity != 1:
        logger.setLevel(level)
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logger.addHandler(handler)
