"""Waiting for results (issue 44, item 5): how soon a waiter wakes after the outcome,
and what the outcome NOTIFY costs the writer.

    BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/dbworker_bench \\
        python -m benchmarks.waiting [--samples 200] [--jobs 20000] [--out FILE]

1. Wake-up latency: one ``runworker`` (the no-op handler, 4 threads) runs jobs that come
   due 0.3 s after they are enqueued, one every 20 ms; a thread per job waits for it
   (``waiting.wait_for``: the hub, no reload) from before it is claimed. Each sample is
   the waiter's wake-up (wall clock) minus the row's ``finished_at`` (the outcome
   statement's time, before its commit: the figure is an upper bound of the time after
   the commit). Database and benchmark run on one host: one clock.
2. The NOTIFY's cost: the same worker drains ``--jobs`` queued no-op jobs, alternately
   with a hub waiting in this process (on a job no one runs: the workers find its
   session and NOTIFY after each statement that ends jobs) and without one (they send
   none), ``--reps`` times each; the drain rate from the rows' times (medians
   compared). The load average at the end is in the result: on a shared machine the
   drains vary more between reps than between the two modes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.benchproject.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402
from django.utils import timezone  # noqa: E402

from benchmarks.benchproject.models import BenchJob, OtherBenchJob  # noqa: E402
from benchmarks.stats import percentile  # noqa: E402
from django_dbworker import waiting  # noqa: E402

TABLE = BenchJob._meta.db_table
HANDLER = "benchmarks.benchproject.handlers.NoopHandler"


def start_worker() -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "django", "runworker", HANDLER, "--num-handlers", "4"]
    return subprocess.Popen([*command, "--no-resetter", "-v", "0"])


def latency(samples: int) -> dict[str, Any]:
    lock = threading.Lock()
    woke: dict[Any, float] = {}
    threads = []

    def wait(job: BenchJob) -> None:
        waiting.wait_for(job, 60)
        with lock:
            woke[job.pk] = time.time()

    for _ in range(samples):
        job = BenchJob.objects.create(process_after=timezone.now() + timedelta(seconds=0.3))
        thread = threading.Thread(target=wait, args=(job,), daemon=True)
        thread.start()
        threads.append(thread)
        time.sleep(0.02)
    for thread in threads:
        thread.join(60)
    finished = dict(BenchJob.objects.filter(pk__in=list(woke)).values_list("pk", "finished_at"))
    delays = [(woke[pk] - finished[pk].timestamp()) * 1000 for pk in woke]
    return {
        "samples": len(delays),
        "p50_ms": percentile(delays, 50),
        "p90_ms": percentile(delays, 90),
        "p99_ms": percentile(delays, 99),
        "max_ms": max(delays),
    }


def drain(jobs: int, with_hub: bool) -> float:
    """Jobs per second one worker drains, with a waiting hub in this process or none."""
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY CASCADE")
        cursor.execute(
            f"INSERT INTO {TABLE} (state) SELECT 'queued' FROM generate_series(1, %s)", [jobs]
        )
        cursor.execute(f"VACUUM ANALYZE {TABLE}")
    stop = threading.Event()
    if with_hub:
        never = OtherBenchJob.objects.create(process_after=timezone.now() + timedelta(days=1))

        def hold() -> None:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    waiting.wait_for(never, 1.0)

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        time.sleep(1.5)  # the hub is up; workers look for it every second
    worker = start_worker()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            left = BenchJob.objects.exclude(state="completed").count()
            if not left:
                break
            time.sleep(0.2)
    finally:
        worker.terminate()
        worker.wait(30)
        stop.set()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM {TABLE}"
        )
        (seconds,) = cursor.fetchone()
    if with_hub:
        OtherBenchJob.objects.all().delete()
    return jobs / float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY CASCADE")
    worker = start_worker()
    try:
        time.sleep(2.0)
        woken = latency(args.samples)
    finally:
        worker.terminate()
        worker.wait(30)
    waiting.hub().close()
    rates: dict[str, list[float]] = {"hub": [], "no_hub": []}
    for _ in range(args.reps):
        for with_hub in (False, True):
            rates["hub" if with_hub else "no_hub"].append(drain(args.jobs, with_hub))
            waiting.hub().close()
    middle = {name: percentile(values, 50) for name, values in rates.items()}
    result = {
        "wake_up_after_outcome": woken,
        "drain_jobs_per_s": rates,
        "drain_median_jobs_per_s": middle,
        "notify_cost": 1 - middle["hub"] / middle["no_hub"],
        "load_average": os.getloadavg()[0],
    }
    connections.close_all()
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
