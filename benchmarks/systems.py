"""The queues under test, each behind the same small interface.

A system knows how to set up its database, empty it, enqueue a backlog through
its own documented API, start its worker, and read first start / last finish
back from its tables. Everything a peer runs happens in its own venv through a
driver module (``benchmarks/peers/*``); the harness only talks SQL to read the
results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import mariadb, pg
from .peers import venvs
from .wal import WalCounter

ROOT = Path(__file__).resolve().parents[1]

NOOP, SLEEP = "noop", "sleep1ms"
#: Ours only: the no-op handler with ack_each_job (one completion per statement).
ACK = "noop-ack"
#: Ours only: the no-op handler with limits that do not bind: all of them, the
#: concurrency limits (per handler and per key), the rate limits (the same).
LIMITS, CONCURRENCY_LIMITS, RATE_LIMITS = "noop-limits", "noop-concurrency", "noop-rate"
#: Ours only: rate limits that do not bind either, but refill slowly (the burst covers
#: every key's jobs): each claim writes its buckets, where ``noop-rate``'s refill
#: before the claim commits.
SLOW_RATE_LIMITS = "noop-rate-slow"
#: Ours only: ``async def handle`` on the worker's event loop: the no-op, an
#: ``await asyncio.sleep(0.001)``, and 1,000 jobs in flight awaiting 100 ms each.
ASYNC_NOOP, ASYNC_SLEEP, ASYNC_WAIT = "async-noop", "async-sleep1ms", "async-wait100ms"
#: Ours only (``benchmarks.task_cost``): the no-op logging the two records Django's
#: receivers of the tasks signals log per task.
TASK_LOGS = "noop-task-logs"
#: Ours only: one INSERT per job through the ORM (a ``BenchNote``), by default, and
#: with ``atomic = True`` (the INSERT and the completion in one transaction, issue 44).
INSERT, INSERT_ATOMIC = "insert", "insert-atomic"
OURS_ONLY = (
    ACK,
    LIMITS,
    CONCURRENCY_LIMITS,
    RATE_LIMITS,
    SLOW_RATE_LIMITS,
    ASYNC_NOOP,
    ASYNC_SLEEP,
    ASYNC_WAIT,
    INSERT,
    INSERT_ATOMIC,
)
#: Variants that fix their own concurrency whatever --handlers says.
IN_FLIGHT = {ASYNC_WAIT: 1000}


class DriverError(RuntimeError):
    pass


class System:
    name = ""
    label = ""
    #: What the concurrency knob of this system is called in the results.
    knob = "handlers"
    #: Jobs drained per repetition when --jobs is not given (about 2–10 s each here).
    default_jobs = 10_000
    #: Tables emptied between repetitions (and vacuumed after the backlog is in).
    tables: tuple[str, ...] = ()
    vacuum_tables: tuple[str, ...] = ()
    measure_sql = ""

    def __init__(self, base_dsn: str) -> None:
        self.db = f"dbworker_bench_{self.name.replace('-', '_')}"
        self.dsn = pg.with_db(base_dsn, self.db)
        self.python = sys.executable

    # -- subprocesses ------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT)
        env["BENCH_DATABASE_URL"] = self.dsn
        env.update(extra)
        return env

    def driver(self, *args: str) -> list[str]:
        raise NotImplementedError

    def call(self, *args: str) -> dict[str, Any]:
        """Run a driver command; return the JSON it printed last."""
        proc = subprocess.run(
            self.driver(*args), cwd=ROOT, env=self.env(), capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise DriverError(
                f"{self.name} driver {' '.join(args[:1])} failed ({proc.returncode}):\n"
                f"{proc.stderr[-3000:]}"
            )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else {}

    # -- the interface -----------------------------------------------------------------

    def install(self) -> None:
        """Install the system's packages (peers: their venv)."""

    def prepare(self, base_dsn: str) -> None:
        """A fresh database with the system's schema."""
        pg.recreate_database(base_dsn, self.db)
        self.call("setup")

    def reset(self) -> None:
        pg.execute(self.dsn, f"TRUNCATE {', '.join(self.tables)} RESTART IDENTITY CASCADE")

    def enqueue(self, n: int, variant: str) -> dict[str, Any]:
        return self.call("enqueue", str(n))

    def vacuum(self) -> None:
        pg.execute(self.dsn, *(f"VACUUM ANALYZE {table}" for table in self.vacuum_tables))

    def measure(self) -> tuple[int, float]:
        """(jobs finished, seconds from the first start to the last finish), from the DB."""
        row = pg.one(self.dsn, self.measure_sql)
        count, seconds = row
        return int(count or 0), float(seconds or 0.0)

    def commits(self) -> float:
        """Transactions committed in the system's database so far."""
        return float(pg.commits(self.dsn))

    def log_counter(self) -> Any:
        """What counts the log a drain writes (``.bytes()`` after it, by kind)."""
        return WalCounter(self.dsn, list(self.tables))

    def workers(
        self, knob: int, variant: str, processes: int, *, drain: bool, latency: bool = False
    ) -> list[list[str]]:
        """The worker command lines to start (several for several processes)."""
        raise NotImplementedError

    def latency_enqueue(
        self, count: int, interval: float, out: str, *, plain_sql: bool = False
    ) -> list[str]:
        command = "latency-enqueue-sql" if plain_sql else "latency-enqueue"
        return self.driver(command, str(count), str(interval), out)

    def versions(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        """Stop what ``prepare`` started (a pooler)."""


class Ours(System):
    name = "django_dbworker"
    label = "django_dbworker"
    knob = "handlers"
    default_jobs = 10_000
    tables = ("benchproject_benchjob",)
    vacuum_tables = tables
    measure_sql = (
        "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) "
        "FROM benchproject_benchjob WHERE state = 'completed'"
    )
    handlers = {
        NOOP: "benchmarks.benchproject.handlers.NoopHandler",
        TASK_LOGS: "benchmarks.benchproject.handlers.TaskLogsNoopHandler",
        SLEEP: "benchmarks.benchproject.handlers.SleepHandler",
        ACK: "benchmarks.benchproject.handlers.AckEachNoopHandler",
        INSERT: "benchmarks.benchproject.handlers.InsertHandler",
        INSERT_ATOMIC: "benchmarks.benchproject.handlers.AtomicInsertHandler",
        LIMITS: "benchmarks.benchproject.handlers.LimitedNoopHandler",
        CONCURRENCY_LIMITS: "benchmarks.benchproject.handlers.ConcurrencyLimitedNoopHandler",
        RATE_LIMITS: "benchmarks.benchproject.handlers.RateLimitedNoopHandler",
        SLOW_RATE_LIMITS: "benchmarks.benchproject.handlers.SlowRateLimitedNoopHandler",
        ASYNC_NOOP: "benchmarks.benchproject.handlers.AsyncNoopHandler",
        ASYNC_SLEEP: "benchmarks.benchproject.handlers.AsyncSleepHandler",
        ASYNC_WAIT: "benchmarks.benchproject.handlers.AsyncWaitHandler",
        "latency": "benchmarks.benchproject.handlers.LatencyHandler",
    }

    def __init__(self, base_dsn: str, verbosity: int = 1, prefetch: str = "handlers") -> None:
        super().__init__(base_dsn)
        self.prefetch = prefetch
        self.db = "dbworker_bench"
        self.dsn = pg.with_db(base_dsn, self.db)
        self.verbosity = verbosity
        self._processes_supported: bool | None = None

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(DJANGO_SETTINGS_MODULE="benchmarks.benchproject.settings", **extra)

    def driver(self, *args: str) -> list[str]:
        return [self.python, "-m", "benchmarks.ours_driver", *args]

    def runworker(self, *args: str) -> list[str]:
        return [self.python, "-m", "django", "runworker", *args]

    def processes_supported(self) -> bool:
        if self._processes_supported is None:
            help_text = subprocess.run(
                self.runworker("--help"), cwd=ROOT, env=self.env(), capture_output=True, text=True
            ).stdout
            self._processes_supported = "--processes" in help_text
        return self._processes_supported

    def workers(
        self, knob: int, variant: str, processes: int, *, drain: bool, latency: bool = False
    ) -> list[list[str]]:
        handler = self.handlers["latency" if latency else variant]
        knob = IN_FLIGHT.get(variant, knob)
        args = [handler, "--num-handlers", str(knob), "-v", str(self.verbosity)]
        if not latency:
            prefetch = str(knob) if self.prefetch == "handlers" else self.prefetch
            args += ["--prefetch", prefetch]
        if drain:
            args.append("--burst")
        if processes != 1:
            if not self.processes_supported():
                raise DriverError("runworker has no --processes option yet: run with --processes 1")
            args += ["--processes", str(processes)]
        return [self.runworker(*args)]

    def versions(self) -> dict[str, str]:
        import django
        import psycopg

        import django_dbworker

        return {
            "django-dbworker": django_dbworker.__version__,
            "Django": django.__version__,
            "psycopg": psycopg.__version__,
            "python": sys.version.split()[0],
        }


class OursMariaDB(Ours):
    """django_dbworker with its job table on MariaDB (issue 32): the same project,
    handlers and driver, ``BENCH_MARIADB_URL`` (default ``mysql://root@127.0.0.1:3306``)
    for the server. Commits are not counted (NaN); the log is InnoDB's redo log of the
    whole server (``mariadb.RedoCounter``)."""

    name = "django_dbworker-mariadb"
    label = "django_dbworker (MariaDB)"
    measure_sql = (
        "SELECT count(*), TIMESTAMPDIFF(MICROSECOND, min(started_at), max(finished_at)) / 1e6 "
        "FROM benchproject_benchjob WHERE state = 'completed'"
    )

    def __init__(self, base_dsn: str, verbosity: int = 1, prefetch: str = "handlers") -> None:
        super().__init__(base_dsn, verbosity, prefetch)
        self.db = "dbworker_bench_mariadb"
        server = os.environ.get("BENCH_MARIADB_URL", "mysql://root@127.0.0.1:3306")
        self.dsn = f"{server.rstrip('/')}/{self.db}"

    def prepare(self, base_dsn: str) -> None:
        mariadb.recreate_database(self.dsn)
        self.call("setup")

    def reset(self) -> None:
        mariadb.execute(
            self.dsn,
            "SET FOREIGN_KEY_CHECKS = 0",
            *(f"TRUNCATE {table}" for table in self.tables),
            "SET FOREIGN_KEY_CHECKS = 1",
        )

    def vacuum(self) -> None:
        mariadb.execute(self.dsn, *(f"ANALYZE TABLE {table}" for table in self.vacuum_tables))

    def measure(self) -> tuple[int, float]:
        [(count, seconds)] = mariadb.execute(self.dsn, self.measure_sql)
        return int(count or 0), float(seconds or 0.0)

    def commits(self) -> float:
        return float("nan")

    def log_counter(self) -> Any:
        return mariadb.RedoCounter(self.dsn)

    def versions(self) -> dict[str, str]:
        [(version,)] = mariadb.execute(self.dsn, "SELECT VERSION()")
        return {**super().versions(), "MariaDB": str(version)}


class OursTasks(Ours):
    """django_dbworker through Django's ``django.tasks``: ``@task`` functions,
    ``enqueue()``, ``runworker --tasks``. Drains only (no latency part)."""

    name = "django_dbworker-tasks"
    label = "django_dbworker (django.tasks)"
    tables = ("dbworker_tasks_taskjob",)
    vacuum_tables = tables
    measure_sql = (
        "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) "
        "FROM dbworker_tasks_taskjob WHERE state = 'completed'"
    )

    def __init__(self, base_dsn: str, verbosity: int = 1, prefetch: str = "handlers") -> None:
        super().__init__(base_dsn, verbosity, prefetch)
        self.db = "dbworker_bench_tasks"
        self.dsn = pg.with_db(base_dsn, self.db)

    def enqueue(self, n: int, variant: str) -> dict[str, Any]:
        return self.call("enqueue-tasks", str(n), variant)

    def workers(
        self, knob: int, variant: str, processes: int, *, drain: bool, latency: bool = False
    ) -> list[list[str]]:
        if latency or variant not in (NOOP, SLEEP):
            raise DriverError(f"{self.name}: only the drains of {NOOP} and {SLEEP}")
        (command,) = super().workers(knob, NOOP, processes, drain=drain)
        return [[*command[:4], "--tasks", *command[5:]]]


class OursOnPool(Ours):
    """django_dbworker with its one handler on a shared pool (``runworker --pool N``)
    instead of threads of its own (``--num-handlers N``): what the draw costs."""

    name = "django_dbworker-pool"
    label = "django_dbworker (--pool)"

    def __init__(self, base_dsn: str, verbosity: int = 1, prefetch: str = "handlers") -> None:
        super().__init__(base_dsn, verbosity, prefetch)
        self.db = "dbworker_bench_pool"
        self.dsn = pg.with_db(base_dsn, self.db)

    def workers(
        self, knob: int, variant: str, processes: int, *, drain: bool, latency: bool = False
    ) -> list[list[str]]:
        (command,) = super().workers(knob, variant, processes, drain=drain, latency=latency)
        return [["--pool" if arg == "--num-handlers" else arg for arg in command]]


class OursPooled(Ours):
    """django_dbworker through a PgBouncer of its own (tests/pooler.py) in ``mode``, with
    the library's defaults: the workers' and the enqueuers' connections go through it;
    the harness's own reads go to the server. The workers LISTEN through a direct alias
    in transaction mode and through the pooler in session mode
    (``DBWORKER["LISTEN_DATABASE"]``, as docs/operations.md says); without it, pickup is
    bound by polling."""

    modes = ("transaction", "session")
    #: Server connections of the pooler: session mode holds one per client.
    pool_sizes = {"transaction": 20, "session": 60}

    def __init__(
        self, base_dsn: str, mode: str, verbosity: int = 1, prefetch: str = "handlers"
    ) -> None:
        super().__init__(base_dsn, verbosity, prefetch)
        self.mode = mode
        self.name = f"django_dbworker-pgbouncer-{mode}"
        self.label = f"django_dbworker (PgBouncer, {mode} mode)"
        self.db = f"dbworker_bench_pgbouncer_{mode}"
        self.dsn = pg.with_db(base_dsn, self.db)
        self.bouncer: Any = None

    def prepare(self, base_dsn: str) -> None:
        from urllib.parse import urlsplit

        from tests.pooler import PgBouncer

        server = urlsplit(base_dsn)
        self.bouncer = PgBouncer(
            self.mode,
            server=f"{server.hostname or '127.0.0.1'}:{server.port or 5432}",
            users=(server.username or "postgres",),
            pool_size=self.pool_sizes[self.mode],
        ).start()
        super().prepare(base_dsn)

    def close(self) -> None:
        if self.bouncer is not None:
            self.bouncer.stop()
            self.bouncer = None

    def env(self, **extra: str) -> dict[str, str]:
        env = super().env(**extra)
        if self.bouncer is not None:
            env["BENCH_DATABASE_URL"] = self.bouncer.url(self.dsn)
            env["BENCH_POOLER"] = self.mode
            if self.mode == "transaction":
                env["BENCH_LISTEN_URL"] = self.dsn
        return env

    def versions(self) -> dict[str, str]:
        version = subprocess.run(["pgbouncer", "--version"], capture_output=True, text=True)
        return {**super().versions(), "pgbouncer": version.stdout.split("\n")[0]}


class Peer(System):
    module = ""

    def install(self) -> None:
        self.python = venvs.ensure(self.name)

    def driver(self, *args: str) -> list[str]:
        return [self.python, "-m", self.module, self.dsn, *args]

    def workers(
        self, knob: int, variant: str, processes: int, *, drain: bool, latency: bool = False
    ) -> list[list[str]]:
        sleep_ms = "1" if variant == SLEEP and not latency else "0"
        mode = "drain" if drain else "continuous"
        return [self.driver("work", str(knob), sleep_ms, mode) for _ in range(processes)]

    def versions(self) -> dict[str, str]:
        wanted = {pin.split("==")[0].split("[")[0].lower() for pin in venvs.PINS[self.name]}
        return {k: v for k, v in venvs.versions(self.name).items() if k.lower() in wanted}


class PgQueuer(Peer):
    name = "pgqueuer"
    label = "pgqueuer (asyncpg)"
    knob = "batch size"
    default_jobs = 20_000
    module = "benchmarks.peers.pgqueuer_driver"
    tables = ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics")
    vacuum_tables = ("pgqueuer", "pgqueuer_log")
    measure_sql = (
        "SELECT count(*) FILTER (WHERE status = 'successful'), extract(epoch FROM "
        "max(created) FILTER (WHERE status = 'successful') "
        "- min(created) FILTER (WHERE status = 'picked')) FROM pgqueuer_log"
    )


class Procrastinate(Peer):
    name = "procrastinate"
    label = "procrastinate"
    knob = "concurrency"
    default_jobs = 2_000
    module = "benchmarks.peers.procrastinate_driver"
    tables = (
        "procrastinate_jobs",
        "procrastinate_events",
        "procrastinate_workers",
        "procrastinate_periodic_defers",
    )
    vacuum_tables = ("procrastinate_jobs", "procrastinate_events")
    measure_sql = (
        "SELECT count(*) FILTER (WHERE type = 'succeeded'), extract(epoch FROM "
        "max(at) FILTER (WHERE type = 'succeeded') "
        "- min(at) FILTER (WHERE type = 'started')) FROM procrastinate_events"
    )


class DjangoTasksDb(Peer):
    name = "django-tasks-db"
    label = "django-tasks-db (db_worker)"
    knob = "threads"
    default_jobs = 500
    module = "benchmarks.peers.djtasks.driver"
    tables = ("django_tasks_database_dbtaskresult",)
    vacuum_tables = tables
    measure_sql = (
        "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) "
        "FROM django_tasks_database_dbtaskresult WHERE status = 'SUCCESSFUL'"
    )

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(DJANGO_SETTINGS_MODULE="benchmarks.peers.djtasks.settings", **extra)

    def driver(self, *args: str) -> list[str]:
        return [self.python, "-m", self.module, *args]

    def enqueue(self, n: int, variant: str) -> dict[str, Any]:
        return self.call("enqueue", str(n), "1" if variant == SLEEP else "0")

    def workers(
        self, knob: int, variant: str, processes: int, *, drain: bool, latency: bool = False
    ) -> list[list[str]]:
        # One task at a time per process: db_worker has no concurrency option.
        args = [self.python, "-m", "django", "db_worker", "--no-startup-delay"]
        if drain:
            args.append("--batch")
        return [args for _ in range(processes)]

    def latency_enqueue(self, count: int, interval: float, out: str) -> list[str]:
        return self.driver("latency-enqueue", str(count), str(interval), out)


PEERS = {cls.name: cls for cls in (PgQueuer, Procrastinate, DjangoTasksDb)}
