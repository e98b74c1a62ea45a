"""The checks of the consumer settings and of ``DBWORKER["CONSUMERS"]``
(``dbworker.E201``–E208)."""

from __future__ import annotations

import math
from typing import Any

from django.core import checks

from .. import conf


@checks.register("dbworker")
def check_consumers(**kwargs: Any) -> list[checks.CheckMessage]:
    """The consumer settings (E207) and the consumers of ``DBWORKER["CONSUMERS"]``
    (E201–E206; E208 when one cannot be imported)."""
    from django.utils.module_loading import import_string

    from ..consumers import Consumer
    from ..consumers.checks import validate_consumer

    messages: list[checks.CheckMessage] = []
    for key in ("CONSUMER_LEASE", "CONSUMER_REBALANCE_INTERVAL", "CONSUMER_GAP_THRESHOLD"):
        value = conf.get(key)
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not (math.isfinite(value) and value > 0)
        ):
            messages.append(
                checks.Error(
                    f"DBWORKER[{key!r}] must be a positive finite number.", id="dbworker.E207"
                )
            )
    paths = conf.get("CONSUMERS")
    if not isinstance(paths, list | tuple):
        return [
            *messages,
            checks.Error(
                "DBWORKER['CONSUMERS'] must be a list of dotted paths.", id="dbworker.E208"
            ),
        ]
    for path in paths:
        try:
            cls = import_string(path)
        except ImportError as exc:
            messages.append(
                checks.Error(f"cannot import consumer {path!r}: {exc}", id="dbworker.E208")
            )
            continue
        if not (isinstance(cls, type) and issubclass(cls, Consumer)):
            messages.append(
                checks.Error(f"{path!r} is not a Consumer subclass.", id="dbworker.E208")
            )
            continue
        messages += validate_consumer(cls())
        from ..support import consumer_problems

        messages += consumer_problems(cls, path)
    return messages
