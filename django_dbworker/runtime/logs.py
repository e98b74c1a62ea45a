"""One log schema for the engine.

Every record the engine logs carries ``extra`` fields from ``extra()``: the
``action`` (what happened: ``claimed``, ``completed``, ``reset``, …), the
``worker`` (its id) and the job or jobs (``job_id``/``job_ids``) and
``handler`` where there are some. Log handlers and formatters can rely on
them (a JSON formatter, say); later signals and metrics fire at the same
points.

Logger names are stable (see docs/operations.md): ``django_dbworker.worker``
(lifecycle, claims, outages), ``.lane``, ``.attempt``, ``.writer`` (outcomes),
``.heartbeat``, ``.notify`` (the listener), ``.registry``, ``.resetter``,
``.maintenance`` (a pass that failed), ``.retention``, ``.scheduler``,
``.supervisor``, ``.db`` (connections). ``django_dbworker`` is their parent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def extra(
    action: str,
    *,
    worker: str | None = None,
    job: Any = None,
    jobs: Iterable[Any] | None = None,
    handler: str | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The ``extra`` of a log record: the action, and the worker, job(s) and handler
    where given."""
    fields: dict[str, Any] = {"action": action}
    if worker is not None:
        fields["worker"] = worker
    if job is not None:
        fields["job_id"] = job
    if jobs is not None:
        fields["job_ids"] = list(jobs)
    if handler is not None:
        fields["handler"] = handler
    fields.update(more)
    return fields
