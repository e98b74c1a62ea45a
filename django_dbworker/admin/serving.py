"""Who serves a job model: its handlers, the live workers that run them, what is paused.

The handlers are those ``DBWORKER["HANDLERS"]`` names (``known_handlers``). The worker
registry says which of them live workers run, by name: its names are labels, never
imported (a row of that table is data, not code for the web process to run). The task
handlers are not among them: their budgets import the task a row names
(``TaskJob.task_path``), which a page must not do either. The registry is small (a row
per worker process): it is read whole, once per page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import router
from django.db.models import Model

from ..control.models import Pause
from ..handler import Handler, known_handlers
from ..models import WorkerProcess


@dataclass
class Serving:
    """The handlers of one job model, and the registry and pauses as read once."""

    handlers: list[Handler]
    workers: list[WorkerProcess]
    pauses: dict[str, Pause] = field(default_factory=dict)

    def live_workers(self, handler: Handler) -> list[WorkerProcess]:
        """The live workers (``WorkerProcess.is_alive``) that run ``handler``."""
        name = handler.get_name()
        return [w for w in self.workers if w.is_alive() and name in _names(w.handlers)]

    def silent_workers(self, handler: Handler) -> list[WorkerProcess]:
        """Workers that ran ``handler`` and stopped heartbeating (not yet pruned)."""
        name = handler.get_name()
        return [w for w in self.workers if not w.is_alive() and name in _names(w.handlers)]

    def pause_of(self, handler: Handler, job: Any = None) -> Pause | None:
        """The pause that holds ``handler`` (or the queue of ``job``), if any."""
        pause = self.pauses.get(handler.get_name())
        if pause is None and job is not None and handler.queue_field:
            queue = getattr(job, handler.queue_field, None)
            pause = self.pauses.get(f"{handler.queue_pause_prefix()}{queue}")
        return pause

    def paused_queues(self, handler: Handler) -> list[Pause]:
        """The pauses of single queues of ``handler``."""
        prefix = handler.queue_pause_prefix()
        if not handler.queue_field:
            return []
        return [p for name, p in self.pauses.items() if name.startswith(prefix)]


def _names(value: Any) -> list[str]:
    return [str(name) for name in value] if isinstance(value, list) else []


def handlers_of(model: type[Model]) -> list[Handler]:
    """The handlers of ``model`` that ``DBWORKER["HANDLERS"]`` names, one per name."""
    return [h for h in known_handlers() if h.model is model]


def serving(model: type[Model]) -> Serving:
    """The handlers of ``model``, the worker registry and the pauses (two queries), read
    from the database of ``model``'s jobs: workers register, and pauses are written,
    beside the jobs they serve or hold (django_dbworker.databases)."""
    alias = router.db_for_read(model)
    try:
        workers = list(WorkerProcess.objects.using(alias).order_by("hostname", "pid"))
    except Exception:  # no registry table yet (migrate not run): nobody is known
        workers = []
    try:
        pauses = {p.name: p for p in Pause.objects.using(alias)}
    except Exception:
        pauses = {}
    return Serving(handlers_of(model), workers, pauses)
