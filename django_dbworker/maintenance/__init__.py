"""Maintenance: passes over job tables that keep them healthy (the resetter of
stalled jobs, retention; later schedules). Builds on ``sql`` and ``runtime``; a
worker runs them through the narrow ``run_once()`` interface it is given."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import conf
from ..handler import Handler
from .resetter import Resetter
from .retention import Maintenance, Retention


def maintenance_factory(
    handlers: Sequence[Handler], *, reset: bool = True
) -> Callable[[Callable[..., list[Any]]], Maintenance]:
    """What ``Worker(maintenance=…)`` takes: the resetter of ``handlers`` (sparing the
    jobs its worker holds; none with ``reset=False``) and their retention."""

    def build(spare: Callable[..., list[Any]]) -> Maintenance:
        resetter = Resetter(handlers, spare=spare) if reset else None
        return Maintenance(resetter, Retention(handlers), conf.get("RETENTION_INTERVAL"))

    return build
