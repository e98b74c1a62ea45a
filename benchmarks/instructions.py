"""Instructions per drained job, counted by valgrind: a figure that does not move with
the machine's load, so that a change to the worker's Python can be judged by it.

    python -m benchmarks.instructions [--jobs N] [--handler H] [--handlers K] [--reps R]

On the benchmark project's table (``BENCH_DATABASE_URL``, default the harness's
``dbworker_bench``), R times each: ``runworker --burst`` with K handler threads and
prefetch K under ``valgrind --tool=callgrind``, once on an empty queue and once on N
no-op jobs; prints (instructions with the jobs − without) / N as JSON.

Timing a drain on a shared 2-core machine moves ±10 % from run to run; the count moves
by less than 0.1 %. It counts every thread of the worker (dispatcher, handler threads,
writer), not the server's work. Under valgrind the worker runs about 50 times slower,
one thread at a time: claims may come out another size than at full speed, so compare
counts with each other, never with a timed figure. Needs ``valgrind`` (Debian's
package).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOOP = "benchmarks.benchproject.handlers.NoopHandler"


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "benchmarks.benchproject.settings",
        "PYTHONPATH": str(ROOT),
    }


def _driver(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "benchmarks.ours_driver", *args],
        cwd=ROOT,
        env=_env(),
        check=True,
        capture_output=True,
    )


def instructions(jobs: int, handler: str, handlers: int) -> int:
    """Instructions of one ``runworker --burst`` draining ``jobs`` fresh jobs."""
    _driver("reset")
    if jobs:
        _driver("enqueue", str(jobs))
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-m",
            "django",
            "runworker",
            handler,
            "--num-handlers",
            str(handlers),
            "--prefetch",
            str(handlers),
            "--burst",
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"runworker under valgrind failed ({done.returncode}):\n{done.stderr}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--handler", default=NOOP)
    parser.add_argument("--handlers", type=int, default=64)
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    _driver("setup")
    per_job = []
    for _ in range(args.reps):
        empty = instructions(0, args.handler, args.handlers)
        full = instructions(args.jobs, args.handler, args.handlers)
        per_job.append((full - empty) / args.jobs)
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "handlers": args.handlers,
                "instructions_per_job": statistics.median(per_job),
                "values": per_job,
            }
        )
    )


if __name__ == "__main__":
    main()
