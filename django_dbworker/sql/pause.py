"""The claim's pause guard: a claim takes nothing of a paused handler or queue.

The guard is part of the claim statement itself, so a pause is seen by the first claim
that starts after it commits, on every worker, at the cost of one lookup in a small
unique index per claim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import connections, models

if TYPE_CHECKING:
    from ..handler import Handler
    from .jobs import JobStatements


def not_paused(
    handler: Handler, stmts: JobStatements, alias: str, pauses: type[models.Model]
) -> tuple[str, dict[str, Any]]:
    """The condition (and its parameters) that keeps the claims of ``handler`` off its
    jobs while it, or the queue of a job, has a row in ``pauses`` (the ``Pause``
    model), in the job table's database ``alias``: a pause is written beside the jobs it
    holds, whatever a router says of the ``Pause`` model (``django_dbworker.databases``)."""
    quote = connections[alias].ops.quote_name
    exact = stmts.dialect.exact  # byte for byte, whatever the collations (MariaDB)
    names = f"{quote(pauses._meta.db_table)}.{quote('name')}"
    match = f"{names} = {exact('%(dbw_pause)s')}"
    params: dict[str, Any] = {"dbw_pause": handler.get_name()}
    if handler.queue_field:
        column = f"{stmts.table}.{stmts.column(handler.queue_field)}"
        match += f" OR {names} = {exact(stmts.dialect.concat('%(dbw_pause_queue)s', column))}"
        params["dbw_pause_queue"] = handler.queue_pause_prefix()
    return f"NOT EXISTS (SELECT 1 FROM {quote(pauses._meta.db_table)} WHERE {match})", params
