"""Validation of a consumer's options (``dbworker.E201`` …), used by ``runworker``
and the system check of ``DBWORKER["CONSUMERS"]``."""

from __future__ import annotations

import math
from typing import Any

from django.core import checks
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.models import Q

from .consumer import Consumer


def validate_consumer(given: Consumer) -> list[checks.CheckMessage]:
    consumer: Any = given  # its options may be anything a user set
    label = type(consumer).__name__
    errors: list[checks.CheckMessage] = []

    def error(msg: str, id: str, hint: str | None = None) -> None:
        errors.append(checks.Error(f"Consumer {label}: {msg}", hint=hint, id=id))

    name = consumer.name
    if not isinstance(name, str) or not name or len(name) > 200:
        error(
            "name must be a non-empty string of at most 200 characters.",
            "dbworker.E201",
            'Set `name = "my_consumer_v1"` (the checkpoint identity; keep it stable).',
        )
    model = consumer.model
    if not (isinstance(model, type) and issubclass(model, models.Model)):
        error("model must be a concrete model class.", "dbworker.E202")
    elif model._meta.abstract:
        error(f"model {model.__name__} is abstract.", "dbworker.E202")
    else:
        try:
            field = model._meta.get_field(consumer.position_field)
        except FieldDoesNotExist:
            error(
                f"position_field {consumer.position_field!r} is not a field of {model.__name__}.",
                "dbworker.E203",
            )
        else:
            if not isinstance(field, models.IntegerField | models.AutoField) or not (
                field.unique or field.primary_key
            ):
                error(
                    f"position_field {consumer.position_field!r} must be a unique integer "
                    "field (sequence-backed, like the primary key).",
                    "dbworker.E203",
                )
    if consumer.scope is not None and not isinstance(consumer.scope, Q):
        error("scope must be a django.db.models.Q or None.", "dbworker.E204")
    for attr, minimum in (("batch_size", 1), ("max_failures", 1)):
        value = getattr(consumer, attr)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            error(f"{attr} must be an integer >= {minimum}, not {value!r}.", "dbworker.E205")
    for attr in ("batch_timeout", "poll_interval", "gap_threshold", "max_poll_interval"):
        value = getattr(consumer, attr)
        if attr in ("gap_threshold", "max_poll_interval") and value is None:
            continue
        if not _number(value) or value <= 0:
            error(f"{attr} must be a positive finite number, not {value!r}.", "dbworker.E205")
    if not _number(consumer.batch_pause) or consumer.batch_pause < 0:
        error(
            f"batch_pause must be a finite number >= 0, not {consumer.batch_pause!r}.",
            "dbworker.E205",
        )
    if type(consumer).handle_batch is Consumer.handle_batch:
        error("does not define handle_batch(rows).", "dbworker.E206")
    if not isinstance(consumer.transactional, bool):
        error("transactional must be True or False.", "dbworker.E205")
    return errors


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
