"""The ``DBWORKER`` settings dict, merged over its defaults."""

from __future__ import annotations

import functools
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

DEFAULTS: dict[str, Any] = {
    # Dotted paths of the handlers runworker and runresetter use when given none.
    "HANDLERS": [],
    # Seconds between two passes of the stalled-job resetter (runresetter and the
    # resetter inside runworker).
    "RESET_INTERVAL": 10.0,
    # Seconds a bookkeeping statement (claim, heartbeat, outcome, log) may run or
    # wait for a lock on PostgreSQL before it gives up and is retried. None: no limit.
    "STATEMENT_TIMEOUT": 10.0,
    # Prepare the bookkeeping statements on PostgreSQL (server-side). None: as the
    # database's OPTIONS["prepare_threshold"] says when it is given, else on a direct
    # connection and never through a pooler (sql.pooler). True: always (a pooler that
    # keeps prepared statements, PgBouncer >= 1.21). False: never.
    "PREPARED_STATEMENTS": None,
    # On PostgreSQL, enqueueing through the ORM sends NOTIFY and workers LISTEN, so
    # an idle worker starts a new job at once instead of at its next poll. Polling
    # goes on as the fallback. False: workers only poll (and back off while idle).
    "NOTIFY": True,
    # Where no NOTIFY comes (SQLite, MariaDB, NOTIFY off): seconds between two looks
    # of an idle worker at each job table's largest key (one read of the primary key's
    # end); a larger one makes it claim at once. None: workers only poll.
    "PROBE_INTERVAL": 0.05,
    # The DATABASES alias workers LISTEN through (None: the job tables' own), or a
    # dict {job tables' alias: alias to LISTEN through}: a direct connection to the
    # same database when the jobs go through a pooler in transaction mode.
    "LISTEN_DATABASE": None,
    # The connections one worker process may hold (your pooler's or server's limit
    # divided by the worker processes you run). None: not checked. The system check
    # dbworker.W007 warns when the handlers' settings may need more.
    "CONNECTION_BUDGET": None,
    # With NOTIFY on: ``migrate`` installs triggers on each job table (PostgreSQL) so
    # rows inserted or made claimable by plain SQL, another service or COPY wake idle
    # workers too (one notification per INSERT statement). False removes them.
    "NOTIFY_TRIGGERS": True,
    # PostgreSQL: the share of each page (%) an INSERT fills in the job tables, set by
    # ``migrate``. The room left keeps a claim's and an outcome's new row version on
    # the row's own page: less WAL per job (sql.tables). None: migrate leaves the
    # tables' fillfactor as it is.
    "FILLFACTOR": 50,
    # Longest failure_message stored; the rest is cut with a marker.
    "MAX_FAILURE_MESSAGE_LENGTH": 10_000,
    # Longest "out" of one execution-log entry; the rest is cut with a marker.
    "MAX_LOG_OUTPUT_LENGTH": 100_000,
    # A job's whole execution log: most entries, and most characters of their keys,
    # commands and outputs. Past either the oldest entries are dropped, and a first
    # entry says how many. The worker writes the whole log at each change: this is
    # what one write costs at most (and what the admin's job page reads).
    "MAX_LOG_ENTRIES": 200,
    "MAX_LOG_LENGTH": 1_000_000,
    # Seconds a dead worker's row stays in the worker registry before the resetter
    # removes it.
    "WORKER_RETENTION": 3600.0,
    # Seconds between two retention passes (handlers' ``retention``: deleting old
    # finished jobs) of runworker. None: workers never delete anything.
    "RETENTION_INTERVAL": 60.0,
    # Partitioned job tables (django_dbworker.partitions, PostgreSQL): the days after
    # today whose partitions each retention pass makes ahead, and the seconds making
    # or detaching a partition may wait for its lock on the table before it is left
    # to the next pass (claims queue behind that wait).
    "PARTITIONS_AHEAD": 3,
    "PARTITION_LOCK_TIMEOUT": 1.0,
    # Seconds runworker and runresetter wait for a database they cannot reach at
    # start (one line per try) before they fail. Outages after a start are waited
    # out for as long as they last.
    "STARTUP_TIMEOUT": 60.0,
    # Middleware around every attempt of every handler, outermost first: dotted paths
    # of factories (see django_dbworker.middleware).
    "MIDDLEWARE": [],
    # Seconds the per-minute statistics of finished jobs (the admin's dashboard) are
    # kept; the resetter deletes older rows. None: workers write none.
    "STATS_RETENTION": 7 * 86400.0,
    # Slots of one shared pool that every handler of a runworker process runs on
    # (runworker --pool overrides it): each handler gets the free slots in proportion to
    # its weight among those with jobs. None: each handler has num_handlers threads.
    "POOL": None,
    # Dotted paths of consumer classes the system checks validate and dbworker_consumers
    # lists (runworker runs the ones it is given).
    "CONSUMERS": [],
    # Consumers (docs/consumers.md). Seconds after its last registry heartbeat a worker
    # counts as dead: its consumers are reassigned and may be started elsewhere.
    "CONSUMER_LEASE": 15.0,
    # Seconds between two rebalancing rounds (one worker leads each round).
    "CONSUMER_REBALANCE_INTERVAL": 5.0,
    # Seconds a missing position is waited for before a consumer passes it (audited in
    # ConsumerGapSkip). Longer than your longest inserting transaction.
    "CONSUMER_GAP_THRESHOLD": 30.0,
    # The bearer token a scraper sends to contrib.prometheus.metrics_view
    # ("Authorization: Bearer <token>"). None: the view serves staff users only.
    "METRICS_TOKEN": None,
}


@functools.cache
def get_settings() -> dict[str, Any]:
    user = getattr(settings, "DBWORKER", {})
    merged = dict(DEFAULTS)
    if isinstance(user, dict):
        merged.update(user)
    return merged


def get(name: str) -> Any:
    return get_settings()[name]


def require_app() -> None:
    """Say what to do when a module of our models is imported (a job model imports
    ``WorkerJob``) while ``django_dbworker`` is not installed: Django's own error is
    about the first table we define."""
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured

    if not apps.is_installed("django_dbworker"):
        raise ImproperlyConfigured(
            'django_dbworker is not installed: add "django_dbworker" to INSTALLED_APPS '
            "(job models need its tables), then run migrate"
        )


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == "DBWORKER":
        get_settings.cache_clear()


setting_changed.connect(_reload)
