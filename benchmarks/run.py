"""The benchmark harness: ``python -m benchmarks --help``.

Drains N pre-enqueued jobs with one worker process per system and reads
throughput back from the database; measures pickup latency into an idle worker
(open-loop arrivals) and the bulk-enqueue rate; optionally the same on the
peers (each in its own venv), the SQL-only ceiling, the growth check, and how fast
a consumer follows an event table (part ``consumers``).
Writes one JSON document (``--out``) and a plot (``--plot``); see docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from . import pg, sql_baseline
from .stats import percentile, summary
from .systems import (
    ACK,
    IN_FLIGHT,
    NOOP,
    OURS_ONLY,
    PEERS,
    ROOT,
    SLEEP,
    DriverError,
    Ours,
    OursMariaDB,
    OursOnPool,
    OursPooled,
    OursTasks,
    System,
)

RESULTS = ROOT / "benchmarks" / "results"

#: Concurrency used for the latency runs: the engine's tutorial setting for ours, the
#: library default (pgqueuer batch 10) or the figure quoted for it (procrastinate 10).
LATENCY_KNOB = {
    "django_dbworker": 4,
    "django_dbworker-pool": 4,
    "django_dbworker-pgbouncer-transaction": 4,
    "django_dbworker-pgbouncer-session": 4,
    "pgqueuer": 10,
    "procrastinate": 10,
    "django-tasks-db": 1,
}


def log(message: str) -> None:
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument(
        "--pg",
        default=os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432"),
        help="PostgreSQL server (user@host:port, no database): %(default)s. Databases\n"
        "dbworker_bench and dbworker_bench_<peer> are dropped and created on it.",
    )
    p.add_argument(
        "--peers", action="store_true", help="also run pgqueuer, procrastinate, django-tasks-db"
    )
    p.add_argument(
        "--systems",
        help="comma-separated subset of: django_dbworker, django_dbworker-tasks, "
        "django_dbworker-pool (its handler on runworker --pool N), "
        "django_dbworker-pgbouncer-transaction, django_dbworker-pgbouncer-session\n"
        "(ours through a PgBouncer of its own: needs pgbouncer), pgqueuer, procrastinate, "
        "django-tasks-db",
    )
    p.add_argument(
        "--parts",
        default="throughput,latency,sql,growth",
        help="comma-separated parts to run (default: %(default)s; also: consumers, backlogs, "
        "fairness)",
    )
    p.add_argument(
        "--database",
        default="dbworker_bench",
        help="database of django_dbworker (dropped and created): %(default)s",
    )
    p.add_argument(
        "--handlers",
        default="1,4,16,64",
        help="handler threads (ours) / concurrency (procrastinate)",
    )
    p.add_argument(
        "--pgqueuer-batch",
        default="10,50,100",
        help="pgqueuer batch sizes to try (its best is kept)",
    )
    p.add_argument(
        "--variants",
        default=f"{NOOP},{SLEEP},{ACK}",
        help=f"handlers: no-op, a 1 ms sleep, the no-op with ack_each_job ({ACK}, ours only),\n"
        f"the no-op with limits that do not bind ({', '.join(OURS_ONLY[1:])}, ours only)",
    )
    p.add_argument(
        "--ours-prefetch",
        default="handlers",
        help="runworker --prefetch for the drains: a number, or 'handlers' (= --num-handlers)",
    )
    p.add_argument(
        "--processes",
        default="1",
        help="worker processes, a list; >1 is passed to runworker as --processes P\n"
        "(peers: P worker processes are started)",
    )
    p.add_argument("--reps", type=int, default=5, help="repetitions (median and range reported)")
    p.add_argument("--jobs", type=int, help="jobs per drain for every system (default: per system)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the per-system job counts")
    p.add_argument("--latency-samples", type=int, default=200)
    p.add_argument("--latency-interval", type=float, default=0.05, help="seconds between enqueues")
    p.add_argument("--ours-interval", type=float, help="runworker --interval for the latency runs")
    p.add_argument("--growth-finished", default="10000,1000000")
    p.add_argument("--growth-backlog", type=int, default=1_000_000)
    p.add_argument("--growth-claims", type=int, default=2000)
    p.add_argument(
        "--backlog-waiting",
        type=int,
        default=1_000_000,
        help="part backlogs: jobs scheduled for later, and as many retries waiting",
    )
    p.add_argument("--backlog-due", type=int, default=20_000, help="part backlogs: jobs due now")
    p.add_argument(
        "--fair-backlog",
        type=int,
        default=100_000,
        help="part fairness: tenant A's backlog (tenants B and C then enqueue 100 jobs each)",
    )
    p.add_argument("--growth-batch", type=int, default=10)
    p.add_argument("--consumer-events", type=int, default=200_000, help="events per drain")
    p.add_argument("--consumer-batch-sizes", default="100,1000")
    p.add_argument(
        "--consumer-loop",
        choices=["batches", "worker"],
        default="batches",
        help="drain with the batch loop alone, or the worker's consumer thread "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--consumer-live-rate",
        type=int,
        default=50_000,
        help="events/s a live writer inserts while a consumer (batch 100) follows (0: off)",
    )
    p.add_argument("--consumer-live-seconds", type=float, default=15.0)
    p.add_argument(
        "-v", "--verbosity", type=int, default=1, help="runworker -v (default 1, as shipped)"
    )
    p.add_argument(
        "--quick", action="store_true", help="a smoke run: 1 rep, 10%% jobs, 40 latency samples"
    )
    p.add_argument("--timeout", type=float, default=900, help="seconds one drain may take")
    p.add_argument("--out", help="JSON file (default benchmarks/results/<UTC time>.json)")
    p.add_argument("--plot", help="PNG plot (default: the JSON path with .png; 'none' for no plot)")
    args = p.parse_args(argv)
    if args.quick:
        args.reps = 1
        args.scale = min(args.scale, 0.1)
        args.latency_samples = min(args.latency_samples, 40)
        args.growth_finished = "10000,100000"
        args.growth_backlog = min(args.growth_backlog, 100_000)
        args.growth_claims = min(args.growth_claims, 300)
        args.backlog_waiting = min(args.backlog_waiting, 100_000)
        args.backlog_due = min(args.backlog_due, 5_000)
        args.fair_backlog = min(args.fair_backlog, 20_000)
        args.consumer_events = min(args.consumer_events, 20_000)
        args.consumer_live_seconds = min(args.consumer_live_seconds, 3.0)
    return args


# -- processes ---------------------------------------------------------------------------


def start(
    cmds: list[list[str]], env: dict[str, str], logfile: Path
) -> list[subprocess.Popen[bytes]]:
    out = logfile.open("ab")
    return [
        subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True)
        for cmd in cmds
    ]


def stop(procs: list[subprocess.Popen[bytes]], sig: int = signal.SIGTERM, wait: float = 20) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
    deadline = time.monotonic() + wait
    for proc in procs:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# -- scenarios ---------------------------------------------------------------------------


#: Jobs per drain of the ack-each variant: one commit (an fsync) per job bounds it
#: to a few hundred jobs/s on a small disk.
ACK_JOBS = 2_000


def jobs_for(system: System, args: argparse.Namespace, variant: str = NOOP) -> int:
    default = ACK_JOBS if variant == ACK else system.default_jobs
    return args.jobs or max(int(default * args.scale), 50)


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that have ended."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_workers(
    system: System, knob: int, variant: str, processes: int, logfile: Path, timeout: float
) -> tuple[float, float]:
    """Start the drain's workers and wait for them: (wall seconds, their CPU seconds)."""
    cpu = children_cpu()
    procs = start(system.workers(knob, variant, processes, drain=True), system.env(), logfile)
    started = time.monotonic()
    try:
        for proc in procs:
            proc.wait(max(timeout - (time.monotonic() - started), 1))
    except subprocess.TimeoutExpired:
        stop(procs, signal.SIGKILL)
        raise DriverError(f"drain did not end within {timeout:g}s; log: {logfile}") from None
    wall = time.monotonic() - started
    codes = [proc.returncode for proc in procs]
    if any(codes):
        raise DriverError(f"worker exited with {codes}:\n{tail(logfile)}")
    return wall, children_cpu() - cpu


#: The CPU seconds workers spend starting and stopping over an empty queue, per
#: (system, knob, variant, processes): taken off a drain's CPU, so that what is left
#: is what the jobs cost.
_idle_cpu: dict[tuple[str, int, str, int], float] = {}


def idle_cpu(
    system: System, knob: int, variant: str, processes: int, logdir: Path, timeout: float
) -> float:
    key = (system.name, knob, variant, processes)
    if key not in _idle_cpu:
        system.reset()
        logfile = logdir / f"{system.name}-{variant}-{knob}-{processes}-idle.log"
        _idle_cpu[key] = min(
            run_workers(system, knob, variant, processes, logfile, timeout)[1] for _ in range(2)
        )
    return _idle_cpu[key]


def drain_once(
    system: System, knob: int, variant: str, processes: int, n: int, logdir: Path, timeout: float
) -> dict[str, float]:
    """One drain of ``n`` jobs: the rate, the enqueue rate, and per job the commits, the
    workers' CPU (start-up and shut-down taken off) and the WAL the system's tables took
    (``pg_walinspect``: other databases of the server do not count)."""
    idle = idle_cpu(system, knob, variant, processes, logdir, timeout)
    system.reset()
    enqueued = system.enqueue(n, variant)
    system.vacuum()
    before = system.commits()
    wal = system.log_counter()
    logfile = logdir / f"{system.name}-{variant}-{knob}-{processes}.log"
    wall, cpu = run_workers(system, knob, variant, processes, logfile, timeout)
    after = system.commits()
    wal_bytes = wal.bytes()
    count, seconds = system.measure()
    if count != n or seconds <= 0:
        raise DriverError(f"{count} of {n} jobs finished; log: {logfile}")
    return {
        "jobs_per_s": n / seconds,
        "enqueue_per_s": n / enqueued["seconds"],
        "commits_per_job": (after - before) / n,
        "wall_s": wall,
        "cpu_us_per_job": max(cpu - idle, 0.0) * 1e6 / n,
        "wal_bytes_per_job": sum(wal_bytes.values()) / n,
    }


def latency_once(
    system: System, args: argparse.Namespace, logdir: Path, rep: int, plain_sql: bool = False
) -> dict[str, Any]:
    """Pickup latency into an idle worker; ``plain_sql``: of rows another service
    inserts with a plain INSERT (ours only: the wake-up triggers)."""
    system.reset()
    name = f"{system.name}{'-sql' if plain_sql else ''}"
    starts = logdir / f"latency-{name}-{rep}-start.txt"
    enqueues = logdir / f"latency-{name}-{rep}-enqueue.txt"
    logfile = logdir / f"latency-{name}.log"
    cmds = system.workers(LATENCY_KNOB[system.name], NOOP, 1, drain=False, latency=True)
    if isinstance(system, Ours) and args.ours_interval is not None:
        cmds = [[*cmd, "--interval", str(args.ours_interval)] for cmd in cmds]
    procs = start(cmds, system.env(BENCH_LATENCY_FILE=str(starts)), logfile)
    try:
        time.sleep(3.0)  # connected, idle and listening before the first job
        if any(proc.poll() is not None for proc in procs):
            raise DriverError(f"latency worker exited early:\n{tail(logfile)}")
        subprocess.run(
            system.latency_enqueue(
                args.latency_samples,
                args.latency_interval,
                str(enqueues),
                **({"plain_sql": True} if plain_sql else {}),
            ),
            cwd=ROOT,
            env=system.env(),
            check=True,
            capture_output=True,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if starts.exists() and len(starts.read_text().splitlines()) >= args.latency_samples:
                break
            time.sleep(0.2)
    finally:
        stop(procs)
    started = (
        dict(line.split() for line in starts.read_text().splitlines()) if starts.exists() else {}
    )
    latencies = []
    for line in enqueues.read_text().splitlines():
        job_id, committed = line.split()
        if job_id in started:
            latencies.append((float(started[job_id]) - float(committed)) * 1000)
    if not latencies:
        raise DriverError(f"no job started; log: {logfile}")
    return {
        "p50_ms": percentile(latencies, 50),
        "p90_ms": percentile(latencies, 90),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies),
        "samples": len(latencies),
        "missing": args.latency_samples - len(latencies),
    }


# -- the run -----------------------------------------------------------------------------


def machine_info(dsn: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "loadavg_at_start": os.getloadavg(),
    }
    try:
        info["postgres"] = pg.server_info(dsn)
    except Exception as exc:
        info["postgres"] = f"unavailable: {exc}"
    return info


def git_info() -> dict[str, Any]:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD"),
        "package_dirty": bool(git("status", "--porcelain", "--", "django_dbworker")),
    }


def choose_systems(args: argparse.Namespace) -> list[System]:
    names = ["django_dbworker"]
    if args.peers:
        names += list(PEERS)
    if args.systems:
        names = [n.strip() for n in args.systems.split(",")]
    systems: list[System] = []
    for name in names:
        if name in ("django_dbworker", "ours"):
            ours = Ours(args.pg, verbosity=args.verbosity, prefetch=args.ours_prefetch)
            ours.db = args.database
            ours.dsn = pg.with_db(args.pg, ours.db)
            systems.append(ours)
        elif name.startswith("django_dbworker-pgbouncer-"):
            mode = name.rsplit("-", 1)[1]
            if mode not in OursPooled.modes:
                raise SystemExit(f"unknown system {name!r}")
            systems.append(
                OursPooled(args.pg, mode, verbosity=args.verbosity, prefetch=args.ours_prefetch)
            )
        elif name == OursOnPool.name:
            systems.append(
                OursOnPool(args.pg, verbosity=args.verbosity, prefetch=args.ours_prefetch)
            )
        elif name == OursMariaDB.name:
            systems.append(
                OursMariaDB(args.pg, verbosity=args.verbosity, prefetch=args.ours_prefetch)
            )
        elif name == OursTasks.name:
            systems.append(
                OursTasks(args.pg, verbosity=args.verbosity, prefetch=args.ours_prefetch)
            )
        elif name in PEERS:
            systems.append(PEERS[name](args.pg))
        else:
            raise SystemExit(f"unknown system {name!r}")
    return systems


def knobs_for(system: System, args: argparse.Namespace) -> list[int]:
    if system.name == "pgqueuer":
        return ints(args.pgqueuer_batch)
    if system.name == "django-tasks-db":
        return [1]
    return ints(args.handlers)


def run(args: argparse.Namespace) -> dict[str, Any]:
    systems = choose_systems(args)
    try:
        return run_systems(args, systems)
    finally:
        for system in systems:
            system.close()  # a pooler it started


def run_systems(args: argparse.Namespace, systems: list[System]) -> dict[str, Any]:
    parts = set(args.parts.split(","))
    started_at = datetime.datetime.now(datetime.UTC)
    t0 = time.monotonic()
    logdir = Path(tempfile.mkdtemp(prefix="dbworker-bench-"))
    log(f"logs in {logdir}")
    result: dict[str, Any] = {
        "started_at": started_at.isoformat(timespec="seconds"),
        "options": {k: v for k, v in vars(args).items() if k not in ("out", "plot")},
        "machine": machine_info(pg.with_db(args.pg, "postgres")),
        "git": git_info(),
        "versions": {},
        "throughput": [],
        "latency": [],
        "errors": [],
    }

    def error(what: str, exc: BaseException) -> None:
        log(f"ERROR {what}: {exc}")
        result["errors"].append({"what": what, "error": str(exc)[-3000:]})

    ready: list[System] = []
    for system in systems:
        try:
            log(f"preparing {system.name}")
            system.install()
            system.prepare(args.pg)
            result["versions"][system.name] = system.versions()
            ready.append(system)
        except Exception as exc:
            error(f"prepare {system.name}", exc)

    processes = ints(args.processes)
    variants = args.variants.split(",")
    if "throughput" in parts:
        scenarios = [
            (system, knob, variant, procs)
            for system in ready
            for variant in variants
            for procs in processes
            for knob in knobs_for(system, args)
            if variant not in OURS_ONLY or system.name == Ours.name
        ]
        runs: dict[tuple[str, int, str, int], list[dict[str, float]]] = {}
        failed: set[tuple[str, int, str, int]] = set()
        for rep in range(args.reps):
            for system, knob, variant, procs in scenarios:  # interleaved: drift hits all alike
                key = (system.name, knob, variant, procs)
                if key in failed:
                    continue
                n = jobs_for(system, args, variant)
                try:
                    measured = drain_once(system, knob, variant, procs, n, logdir, args.timeout)
                except Exception as exc:
                    failed.add(key)
                    error(f"throughput {key}", exc)
                    continue
                runs.setdefault(key, []).append(measured)
                log(
                    f"rep {rep + 1}/{args.reps} {system.name} {variant} {system.knob}={knob} "
                    f"P={procs}: {measured['jobs_per_s']:.0f} jobs/s, "
                    f"enqueue {measured['enqueue_per_s']:.0f}/s, "
                    f"{measured['commits_per_job']:.2f} commits/job, "
                    f"{measured['cpu_us_per_job']:.1f} µs CPU/job, "
                    f"{measured['wal_bytes_per_job']:.0f} B WAL/job"
                )
        by_name = {s.name: s for s in ready}
        for (name, knob, variant, procs), measured in runs.items():
            system = by_name[name]
            result["throughput"].append(
                {
                    "system": name,
                    "label": system.label,
                    "knob": system.knob,
                    "value": IN_FLIGHT.get(variant, knob),
                    "variant": variant,
                    "processes": procs,
                    "jobs": jobs_for(system, args, variant),
                    **{
                        metric: summary([m[metric] for m in measured])
                        for metric in (
                            "jobs_per_s",
                            "enqueue_per_s",
                            "commits_per_job",
                            "wall_s",
                            "cpu_us_per_job",
                            "wal_bytes_per_job",
                        )
                    },
                }
            )

    if "latency" in parts:
        samples: dict[str, list[dict[str, Any]]] = {}
        # Ours twice: enqueued through the ORM, and inserted with plain SQL.
        runs_of = [(s, False) for s in ready] + [(s, True) for s in ready if s.name == Ours.name]
        for rep in range(args.reps):
            for system, plain_sql in runs_of:
                name = f"{system.name} (plain SQL)" if plain_sql else system.name
                try:
                    measured = latency_once(system, args, logdir, rep, plain_sql)
                except Exception as exc:
                    error(f"latency {name}", exc)
                    continue
                samples.setdefault(name, []).append(measured)
                log(
                    f"rep {rep + 1}/{args.reps} latency {name}: p50 "
                    f"{measured['p50_ms']:.1f} ms, p99 {measured['p99_ms']:.1f} ms"
                )
        for name, measured in samples.items():
            result["latency"].append(
                {
                    "system": name,
                    "knob_value": LATENCY_KNOB[name.split(" ")[0]],
                    "samples_per_rep": args.latency_samples,
                    "interval_s": args.latency_interval,
                    "p50_ms": summary([m["p50_ms"] for m in measured]),
                    "p90_ms": summary([m["p90_ms"] for m in measured]),
                    "p99_ms": summary([m["p99_ms"] for m in measured]),
                    "max_ms": max(m["max_ms"] for m in measured),
                    "missing": sum(m["missing"] for m in measured),
                }
            )

    ours = next((s for s in ready if isinstance(s, Ours)), None)
    if "sql" in parts and ours is not None:
        result["sql"] = []
        pgbench = pg.pgbench_available()
        if not pgbench:
            log("pgbench not found: SQL baseline with the psycopg loop only")
        configs = sql_baseline.configs(pgbench, args.scale)
        values: dict[int, list[float]] = {}
        for rep in range(args.reps):
            for i, (kind, batch, clients, n) in enumerate(configs):
                try:
                    rate = sql_baseline.measure_once(ours.dsn, kind, batch, clients, n)
                except Exception as exc:
                    error(f"sql {kind} batch {batch}", exc)
                    continue
                values.setdefault(i, []).append(rate)
                name = sql_baseline.label(kind, batch, clients)
                log(f"rep {rep + 1}/{args.reps} {name}: {rate:.0f} jobs/s")
        for i, rates in values.items():
            result["sql"].append(
                {**sql_baseline.describe(*configs[i]), "jobs_per_s": summary(rates)}
            )

    if "growth" in parts and ours is not None:
        log("growth check")
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.growth",
                    "--finished",
                    args.growth_finished,
                    "--claims",
                    str(args.growth_claims),
                    "--batch",
                    str(args.growth_batch),
                    "--backlog",
                    str(args.growth_backlog),
                    "--reps",
                    str(min(args.reps, 3)),
                ],
                cwd=ROOT,
                env=ours.env(),
                capture_output=True,
                text=True,
                check=True,
            )
            result["growth"] = json.loads(proc.stdout.splitlines()[-1])
            slower = ", ".join(
                f"{name}: {percent:+.1f}%"
                for name, percent in result["growth"]["slowdown_percent"].items()
            )
            log(f"growth: claims against the smallest table: {slower}")
        except subprocess.CalledProcessError as exc:
            error("growth", RuntimeError(exc.stderr))
        except Exception as exc:
            error("growth", exc)

    if "backlogs" in parts and ours is not None:
        log("backlogs: jobs for later beside the claims")
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.backlogs",
                    "--waiting",
                    str(args.backlog_waiting),
                    "--due",
                    str(args.backlog_due),
                    "--latency-samples",
                    str(args.latency_samples // 2),
                    "--reps",
                    str(min(args.reps, 3)),
                ],
                cwd=ROOT,
                env=ours.env(),
                capture_output=True,
                text=True,
                check=True,
            )
            result["backlogs"] = json.loads(proc.stdout.splitlines()[-1])
            ratios = ", ".join(f"{c}: {r:.2f}" for c, r in result["backlogs"]["ratio"].items())
            log(f"backlogs: claim time against the empty table: {ratios}")
        except subprocess.CalledProcessError as exc:
            error("backlogs", RuntimeError(exc.stderr))
        except Exception as exc:
            error("backlogs", exc)

    if "fairness" in parts and ours is not None:
        log("fairness: two small tenants behind a large one's backlog")
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "benchmarks.fairness", "--backlog", str(args.fair_backlog)]
                + ["--reps", str(min(args.reps, 3))],
                cwd=ROOT,
                env=ours.env(),
                capture_output=True,
                text=True,
                check=True,
            )
            result["fairness"] = fair = json.loads(proc.stdout.splitlines()[-1])
            waits = ", ".join(
                f"{case} p99 {row['wait_p99_ms']['median']:.0f} ms"
                for case, row in fair["cases"].items()
            )
            ratio = fair["throughput_ratio"]
            log(f"fairness: B/C waits {waits}; throughput fair/ordered {ratio:.2f}")
        except subprocess.CalledProcessError as exc:
            error("fairness", RuntimeError(exc.stderr))
        except Exception as exc:
            error("fairness", exc)

    if "consumers" in parts and ours is not None:
        log("consumers")
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.consumers",
                    "--events",
                    str(args.consumer_events),
                    "--batch-sizes",
                    args.consumer_batch_sizes,
                    "--reps",
                    str(min(args.reps, 3)),
                    "--loop",
                    args.consumer_loop,
                ],
                cwd=ROOT,
                env=ours.env(),
                capture_output=True,
                text=True,
                check=True,
            )
            result["consumers"] = json.loads(proc.stdout.splitlines()[-1])
            for size, rate in result["consumers"]["batch_sizes"].items():
                log(f"consumers: batch {size}: {rate['median']:.0f} events/s")
            if "live" in result["consumers"]:
                log(f"consumers: {live_text(result['consumers']['live'])}")
        except subprocess.CalledProcessError as exc:
            error("consumers", RuntimeError(exc.stderr))
        except Exception as exc:
            error("consumers", exc)

    result["summary"] = summarise(result)
    result["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    result["duration_s"] = round(time.monotonic() - t0, 1)
    result["machine"]["loadavg_at_end"] = os.getloadavg()
    result["logs"] = str(logdir)
    return result


def _paired(rows: list[dict[str, Any]], variant: str, value: int) -> list[float]:
    """Repetition by repetition, our ``variant`` over our no-op at the same knob."""

    def values(of: str) -> list[float]:
        for row in rows:
            mine = row["system"] == "django_dbworker" and row["processes"] == 1
            if mine and row["variant"] == of and row["value"] == value:
                return list(row["jobs_per_s"]["values"])
        return []

    return [a / b for a, b in zip(values(variant), values(NOOP), strict=False) if b]


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """Best configuration per system and variant (one process), and the ratios ours/peer."""
    best: dict[str, dict[str, Any]] = {}
    for row in result["throughput"]:
        if row["processes"] != 1:
            continue
        slot = best.setdefault(row["variant"], {})
        current = slot.get(row["system"])
        if current is None or row["jobs_per_s"]["median"] > current["jobs_per_s"]:
            slot[row["system"]] = {
                "knob": row["knob"],
                "value": row["value"],
                "jobs_per_s": row["jobs_per_s"]["median"],
                "min": row["jobs_per_s"]["min"],
                "max": row["jobs_per_s"]["max"],
            }
    ratios: dict[str, Any] = {}
    for variant, systems in best.items():
        ours = systems.get("django_dbworker")
        if ours is None:
            continue
        for name, peer in systems.items():
            if name != "django_dbworker":
                ratios.setdefault(name, {})[f"throughput_{variant}"] = (
                    ours["jobs_per_s"] / peer["jobs_per_s"]
                )
    # Same concurrency, side by side (procrastinate's concurrency = our handler threads).
    same: dict[str, dict[int, float]] = {}
    rows = {
        (r["system"], r["variant"], r["value"]): r
        for r in result["throughput"]
        if r["processes"] == 1
    }
    for (name, variant, value), row in rows.items():
        mine = rows.get(("django_dbworker", variant, value))
        if name == "procrastinate" and mine is not None:
            same.setdefault(f"procrastinate_{variant}", {})[value] = (
                mine["jobs_per_s"]["median"] / row["jobs_per_s"]["median"]
            )
    latency = {row["system"]: row for row in result["latency"]}
    if "django_dbworker" in latency:
        mine = latency["django_dbworker"]
        for name, row in latency.items():
            if not name.startswith("django_dbworker"):
                ratios.setdefault(name, {})["latency_p50"] = (
                    mine["p50_ms"]["median"] / row["p50_ms"]["median"]
                )
                ratios.setdefault(name, {})["latency_p99"] = (
                    mine["p99_ms"]["median"] / row["p99_ms"]["median"]
                )
    pooled: dict[str, list[float]] = {}
    for row in result["throughput"]:
        if row["variant"] == NOOP:
            pooled.setdefault(row["system"], []).extend(row["enqueue_per_s"]["values"])
    enqueue = {name: summary(values) for name, values in pooled.items()}
    sql_ratios = {}
    ours_noop = best.get(NOOP, {}).get("django_dbworker")
    if ours_noop is not None:
        for row in result.get("sql", []):
            sql_ratios[row["label"]] = ours_noop["jobs_per_s"] / row["jobs_per_s"]["median"]
    # Each job acknowledged on its own, against the SQL loop that does the same
    # (one claim and one completion statement per job, one process).
    ours_ack = best.get(ACK, {}).get("django_dbworker")
    per_job = [r for r in result.get("sql", []) if r["kind"] != "pgbench" and r["batch"] == 1]
    if ours_ack is not None and per_job:
        sql_ratios[f"{ACK} / {per_job[0]['label']}"] = (
            ours_ack["jobs_per_s"] / per_job[0]["jobs_per_s"]["median"]
        )
    # What limits that do not bind cost: the no-op with them over the no-op, same run;
    # also per repetition (the variants run in turn, so a host that slows down for a
    # while slows both sides of a pair): the median of those ratios.
    for variant in OURS_ONLY[1:]:
        limited = best.get(variant, {}).get("django_dbworker")
        if limited is not None and ours_noop is not None:
            sql_ratios[f"{variant} / {NOOP}"] = limited["jobs_per_s"] / ours_noop["jobs_per_s"]
            pairs = _paired(result["throughput"], variant, limited["value"])
            if pairs:
                sql_ratios[f"{variant} / {NOOP} (paired)"] = statistics.median(pairs)
    return {
        "best": best,
        "ratios_ours_over_peer": ratios,
        "ratios_same_concurrency": same,
        "ratios_ours_over_sql": sql_ratios,
        "enqueue_per_s": enqueue,
    }


def report(result: dict[str, Any]) -> str:
    """A plain-text digest of the run (printed on stderr)."""
    lines = [f"run {result['started_at']} → {result['finished_at']} ({result['duration_s']:.0f} s)"]
    lines.append("throughput, jobs/s (median [min–max]):")
    for row in sorted(
        result["throughput"], key=lambda r: (r["variant"], r["system"], r["processes"], r["value"])
    ):
        s = row["jobs_per_s"]
        lines.append(
            f"  {row['variant']:8} {row['system']:16} {row['knob']}={row['value']:<4} "
            f"P={row['processes']}: "
            f"{s['median']:9.0f} [{s['min']:.0f}–{s['max']:.0f}]  "
            f"commits/job {row['commits_per_job']['median']:.2f}  "
            f"CPU/job {row.get('cpu_us_per_job', {}).get('median', float('nan')):.1f} µs  "
            f"WAL/job {row.get('wal_bytes_per_job', {}).get('median', float('nan')):.0f} B"
        )
    for row in result["latency"]:
        lines.append(
            f"latency {row['system']:16} p50 {row['p50_ms']['median']:8.1f} ms  "
            f"p90 {row.get('p90_ms', row['p50_ms'])['median']:8.1f} ms  "
            f"p99 {row['p99_ms']['median']:8.1f} ms"
        )
    for row in result.get("sql", []):
        s = row["jobs_per_s"]
        lines.append(f"{row['label']}: {s['median']:.0f} [{s['min']:.0f}–{s['max']:.0f}]")
    if "growth" in result:
        g = result["growth"]
        sizes = ", ".join(
            f"{k}: {v['median_ms']:.3f} ms ({g['slowdown_percent'][k]:+.1f}%)"
            for k, v in g["sizes"].items()
        )
        lines.append(f"growth: claim of {g['batch']} by finished rows — {sizes}")
    if "consumers" in result:
        c = result["consumers"]
        for size, s in c["batch_sizes"].items():
            lines.append(
                f"consumer, batch {size}: {s['median']:.0f} [{s['min']:.0f}–{s['max']:.0f}] "
                f"events/s ({c['events']} events)"
            )
        if "live" in c:
            lines.append(f"consumer, {live_text(c['live'])}")
    summary_ = result["summary"]
    for name, value in summary_["enqueue_per_s"].items():
        lines.append(f"enqueue {name}: {value['median']:.0f} jobs/s")
    for name, ratios in summary_["ratios_ours_over_peer"].items():
        text = ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
        lines.append(f"ours / {name}: {text}")
    for name, ratio in summary_["ratios_ours_over_sql"].items():
        lines.append(f"ours / {name}: {ratio:.2f}")
    for error in result["errors"]:
        lines.append(f"ERROR {error['what']}: {error['error'][:300]}")
    return "\n".join(lines)


def live_text(live: dict[str, Any]) -> str:
    lag = live["lag_rows"]
    return (
        f"following a live writer at {live['written_per_s']:.0f} events/s (batch "
        f"{live['batch_size']}): lag p50 {lag['p50']} / max {lag['max']} rows, at the head "
        f"{live['at_head_after_writer_s']:.2f} s after the last commit"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) if args.out else RESULTS / f"{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        result = run(args)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except Exception:
        traceback.print_exc()
        return 1
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(report(result), file=sys.stderr)
    log(f"results: {out}")
    if args.plot != "none":
        plot_path = Path(args.plot) if args.plot else out.with_suffix(".png")
        try:
            from .plot import plot

            plot(result, plot_path)
            log(f"plot: {plot_path}")
        except ImportError:
            log("matplotlib not installed (pip install -e . --group bench): no plot")
    print(json.dumps(result["summary"], indent=2))
    return 1 if result["errors"] else 0
