"""The task handlers the admin explains a task with: those ``runworker --tasks`` runs
for each ``DatabaseBackend`` of ``TASKS``, and those the worker registry names
(``runworker --tasks --queue …``: ``tasks:<backend>[<queues>]``, `` async`` for the
``async def`` tasks), each built from its backend's settings. A registry label is read
as a name only: one of a backend ``TASKS`` does not have, or of queues it does not
serve, is left out, and nothing it says is imported."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ..handler import Handler
from . import compat

#: ``tasks:<backend>[<queue>,…]`` (``*``: every queue), then `` async`` or nothing.
LABEL = re.compile(r"^tasks:(?P<alias>[^\[\]:]+)\[(?P<queues>[^\[\]]*)\](?P<kind> async)?$")


def task_serving_handlers(workers: Iterable[Any]) -> list[Handler]:
    """The task handlers of the settings' backends, then those of the registry's
    labels (``workers``: ``WorkerProcess`` rows), one per name."""
    if not compat.AVAILABLE:
        return []
    from .handler import AsyncTaskHandler, TaskHandler, task_handlers

    try:
        found: dict[str, Handler] = {h.get_name(): h for h in task_handlers()}
    except ValueError:  # TASKS has no DatabaseBackend
        return []
    backends = compat.tasks.task_backends
    for worker in workers:
        labels = worker.handlers if isinstance(worker.handlers, list) else []
        for label in labels:
            match = LABEL.match(str(label))
            if match is None or str(label) in found:
                continue
            alias = match["alias"]
            backend = _backend(backends, alias)
            if backend is None:
                continue
            queues = None if match["queues"] == "*" else match["queues"].split(",")
            if queues is not None and backend.queues and not set(queues) <= set(backend.queues):
                continue
            if queues is None and backend.queues:
                continue  # a backend with QUEUES names them
            kind = AsyncTaskHandler if match["kind"] else TaskHandler
            handler = kind(alias, queues, backend.engine)
            if handler.get_name() == str(label):
                found[handler.get_name()] = handler
    return list(found.values())


def _backend(backends: Any, alias: str) -> Any:
    """The ``DatabaseBackend`` of ``TASKS[alias]``, or None."""
    from .backend import DatabaseBackend

    if alias not in backends.settings:
        return None
    backend = backends[alias]
    return backend if isinstance(backend, DatabaseBackend) else None
