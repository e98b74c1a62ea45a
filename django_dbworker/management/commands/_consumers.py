"""What runworker needs for consumers: telling consumer classes from handlers."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from django.core.management.base import CommandError

from django_dbworker.consumers import Consumer
from django_dbworker.consumers.checks import validate_consumer


def _import(path: str) -> object:
    module_path, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_path), attr)
    except (ImportError, AttributeError, ValueError):
        return None  # load_handlers says what is wrong with it


def split_consumers(paths: Sequence[str]) -> tuple[list[str], list[Consumer]]:
    """(handler paths, consumer instances) of runworker's dotted paths."""
    handlers, consumers = [], []
    for path in paths:
        obj = _import(path)
        if isinstance(obj, type) and issubclass(obj, Consumer):
            consumer = obj()
            errors = [m for m in validate_consumer(consumer) if m.is_serious()]
            if errors:
                hint = f" {errors[0].hint}" if errors[0].hint else ""
                raise CommandError(f"{errors[0].msg} ({errors[0].id}){hint}")
            consumers.append(consumer)
        else:
            handlers.append(path)
    names = [c.name for c in consumers]
    if len(set(names)) != len(names):
        raise CommandError(f"two consumers share a name: {sorted(names)}")
    return handlers, consumers
