"""Jobs that wait for later: do they cost the claims anything?

    DJANGO_SETTINGS_MODULE=benchmarks.benchproject.settings \\
        python -m benchmarks.backlogs [--waiting 1000000] [--due 20000] [--handlers 64] \\
        [--claims 2000] [--batch 10] [--latency-samples 100] [--reps 3]

Four tables, filled afresh for each measure, interleaved rep by rep: ``empty`` (only
the jobs due now), ``scheduled`` (``--waiting`` queued jobs for tomorrow),
``retrying`` (as many errored jobs whose retry is tomorrow) and ``both``. For each:

- ``claim``: the worker's claim statement (prepared, ``--batch`` rows), ``--claims``
  times, each batch completed; only the claims are timed (as ``benchmarks.growth``);
- ``drain``: ``runworker --burst`` of the no-op handler with ``--handlers`` threads
  over ``--due`` jobs due now: jobs/s from the first start to the last finish;
- ``latency`` (``empty`` and ``both``): an idle ``runworker`` (the latency handler,
  4 threads), and ``--latency-samples`` jobs created one by one through the ORM, each
  for 0.3 s after it is created: from each job's ``process_after`` to its start in
  a handler thread (the same machine's clock).

Prints JSON; ``ratio`` is each case's median claim time over ``empty``'s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.benchproject.settings")

import django

django.setup()

from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from benchmarks.benchproject.models import BenchJob  # noqa: E402
from benchmarks.growth import time_claims  # noqa: E402
from benchmarks.peers.common import emit  # noqa: E402
from benchmarks.stats import percentile  # noqa: E402

TABLE = BenchJob._meta.db_table
ROOT = Path(__file__).resolve().parent.parent
CASES = ("empty", "scheduled", "retrying", "both")
HANDLERS = "benchmarks.benchproject.handlers"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def fill(case: str, waiting: int, due: int) -> None:
    """The case's waiting rows (older ids), then ``due`` queued rows due now."""
    insert = (
        f"INSERT INTO {TABLE} (state, num_failures, process_after, tenant) "
        "SELECT %s, %s, now() + interval '1 day', n %% 100 FROM generate_series(1, %s) AS n"
    )
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY CASCADE")
        if case in ("scheduled", "both"):
            cursor.execute(insert, ["queued", 0, waiting])
        if case in ("retrying", "both"):
            cursor.execute(insert, ["errored", 1, waiting])
        cursor.execute(
            f"INSERT INTO {TABLE} (state, tenant) SELECT 'queued', n %% 100 "
            "FROM generate_series(1, %s) AS n",
            [due],
        )
        cursor.execute(f"VACUUM ANALYZE {TABLE}")


def runworker(*args: str) -> list[str]:
    return [sys.executable, "-m", "django", "runworker", *args, "-v", "0"]


def drain(handlers: int, due: int, timeout: float) -> float:
    """``runworker --burst`` over the due jobs: jobs/s, from the database's times."""
    subprocess.run(
        runworker(f"{HANDLERS}.NoopHandler", "--num-handlers", str(handlers), "--burst"),
        cwd=ROOT,
        check=True,
        timeout=timeout,
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*), extract(epoch from max(finished_at) - min(started_at)) "
            f"FROM {TABLE} WHERE state = 'completed'"
        )
        count, seconds = cursor.fetchone()
    if count != due:
        raise RuntimeError(f"{count} of {due} jobs completed")
    return due / float(seconds)


def scheduled_latency(samples: int, ahead: float) -> list[float]:
    """Milliseconds from each job's ``process_after`` to its start in a handler thread,
    into an idle worker; the jobs created one at a time, ``ahead`` seconds early."""
    with connection.cursor() as cursor:  # the due jobs of the fill: gone, the rest stays
        cursor.execute(f"DELETE FROM {TABLE} WHERE process_after IS NULL")
    with tempfile.TemporaryDirectory() as tmp:
        starts = Path(tmp) / "starts.txt"
        worker = subprocess.Popen(
            runworker(f"{HANDLERS}.LatencyHandler", "--num-handlers", "4"),
            cwd=ROOT,
            env={**os.environ, "BENCH_LATENCY_FILE": str(starts)},
        )
        try:
            time.sleep(3.0)  # idle and listening
            due = {}
            for _ in range(samples):
                when = timezone.now() + timedelta(seconds=ahead)
                due[BenchJob.objects.create(process_after=when).pk] = when.timestamp()
                time.sleep(ahead / 3)  # several wait at once, each its own time
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if starts.exists() and len(starts.read_text().splitlines()) >= samples:
                    break
                time.sleep(0.2)
        finally:
            worker.terminate()
            worker.wait(30)
        started = dict(line.split() for line in starts.read_text().splitlines())
    return [(float(started[str(pk)]) - at) * 1000 for pk, at in due.items() if str(pk) in started]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--waiting", type=int, default=1_000_000)
    parser.add_argument("--due", type=int, default=20_000)
    parser.add_argument("--handlers", type=int, default=64)
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--latency-samples", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    measured: dict[str, dict[str, list[float]]] = {c: {} for c in CASES}
    for rep in range(args.reps):
        for case in CASES:  # interleaved: drift hits every case
            fill(case, args.waiting, args.claims * args.batch + 1000)
            times = time_claims(args.claims, args.batch)
            claim_ms = statistics.median(times) * 1000
            fill(case, args.waiting, args.due)
            rate = drain(args.handlers, args.due, args.timeout)
            row = measured[case]
            row.setdefault("claim_ms", []).append(claim_ms)
            row.setdefault("jobs_per_s", []).append(rate)
            line = f"rep {rep + 1} {case}: claim {claim_ms:.3f} ms, drain {rate:.0f} jobs/s"
            if case in ("empty", "both"):
                latencies = scheduled_latency(args.latency_samples, 0.3)
                row.setdefault("p50_ms", []).append(percentile(latencies, 50))
                row.setdefault("p99_ms", []).append(percentile(latencies, 99))
                row.setdefault("missing", []).append(args.latency_samples - len(latencies))
                line += (
                    f", scheduled start p50 {row['p50_ms'][-1]:.1f} ms p99 {row['p99_ms'][-1]:.1f}"
                )
            log(line)
    result: dict[str, Any] = {"options": vars(args), "cases": {}}
    for case, row in measured.items():
        result["cases"][case] = {
            name: {"median": statistics.median(values), "values": values}
            for name, values in row.items()
        }
    empty = result["cases"]["empty"]["claim_ms"]["median"]
    result["ratio"] = {case: result["cases"][case]["claim_ms"]["median"] / empty for case in CASES}
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY CASCADE")
    emit(result)


if __name__ == "__main__":
    main(sys.argv[1:])
