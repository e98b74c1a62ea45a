"""What a no-op ``django.tasks`` task costs a worker beside a no-op WorkerJob.

    python -m benchmarks.task_cost [--jobs N] [--reps R] [--handlers H] [--variants jobs,logs,bare]

One ``runworker --burst`` process drains N no-op items per variant, the variants
interleaved, R times: the WorkerJob no-op; the WorkerJob no-op logging the two
records Django's receivers of the tasks signals log per task (what a tasks layer
that cost nothing would reach: its ceiling on this engine); tasks as shipped (Django's default
logging: its two INFO records per task are built, then dropped); tasks with the
``django.tasks`` logger at WARNING; tasks with Django's own log receivers
disconnected (the signals are still sent, to no one). For each: the worker's CPU
time per item (user + system, of the whole process) and the drain rate (first
start to last finish, from the table), median of R. The differences between the
rows are what Django's receivers and the tasks layer cost (docs/benchmarks.md §
Tasks). Database: ``BENCH_BASE_DSN`` (default ``postgresql://postgres@127.0.0.1:5432``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

from .systems import NOOP, ROOT, TASK_LOGS, Ours, OursTasks, System

#: name: (label, system, its handler, environment of the worker)
VARIANTS: dict[str, tuple[str, str, str, dict[str, str]]] = {
    "jobs": ("WorkerJob no-op", "jobs", NOOP, {}),
    "logs": ("WorkerJob no-op + Django's two task log records", "jobs", TASK_LOGS, {}),
    "tasks": ("task, Django's default logging", "tasks", NOOP, {}),
    "warning": (
        "task, django.tasks at WARNING",
        "tasks",
        NOOP,
        {"BENCH_TASKS_LOG_LEVEL": "WARNING"},
    ),
    "bare": (
        "task, Django's log receivers disconnected",
        "tasks",
        NOOP,
        {"BENCH_TASKS_RECEIVERS": "none"},
    ),
}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def worker_cpu(system: System, handler: str, extra: dict[str, str], handlers: int) -> float:
    """CPU seconds of one ``runworker --burst`` over what is queued."""
    (command,) = system.workers(handlers, handler, 1, drain=True)
    before = _children_cpu()  # the enqueueing driver has been waited for: not counted
    worker = subprocess.run(
        command, cwd=ROOT, env=system.env(**extra), capture_output=True, text=True, timeout=600
    )
    if worker.returncode:
        raise SystemExit(f"runworker exited with {worker.returncode}:\n{worker.stderr[-2000:]}")
    return _children_cpu() - before


def drain(
    system: System, handler: str, extra: dict[str, str], n: int, handlers: int
) -> tuple[float, float]:
    """(worker CPU seconds per item, items/s) of one ``runworker --burst`` draining
    ``n`` no-ops; the CPU of a run over an empty queue (start-up, shutdown) is not
    counted."""
    system.reset()
    idle = worker_cpu(system, handler, extra, handlers)
    system.enqueue(n, NOOP)
    system.vacuum()
    cpu = (worker_cpu(system, handler, extra, handlers) - idle) / n
    count, seconds = system.measure()
    if count != n or seconds <= 0:
        raise SystemExit(f"{count} of {n} items finished")
    return cpu, n / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--handlers", type=int, default=64)
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="of %(default)s (the first is the 100 %%)"
    )
    parser.add_argument("--out", help="write the figures as JSON here too")
    args = parser.parse_args(argv)
    base = os.environ.get("BENCH_BASE_DSN", "postgresql://postgres@127.0.0.1:5432")
    systems = {"jobs": Ours(base), "tasks": OursTasks(base)}
    for system in systems.values():
        system.prepare(base)
    variants = [VARIANTS[name] for name in args.variants.split(",")]
    figures: dict[str, dict[str, list[float]]] = {
        label: {"cpu_us": [], "rate": []} for label, *_ in variants
    }
    for rep in range(args.reps):
        for label, kind, handler, extra in variants:
            cpu, rate = drain(systems[kind], handler, extra, args.jobs, args.handlers)
            figures[label]["cpu_us"].append(cpu * 1e6)
            figures[label]["rate"].append(rate)
            print(f"rep {rep + 1}, {label}: {rate:,.0f}/s", file=sys.stderr)
    reference = statistics.median(figures[variants[0][0]]["rate"])
    print(
        f"| {args.jobs:,} items, {args.handlers} handler threads, median of {args.reps} "
        "| worker CPU µs/item | items/s | of the first rate |"
    )
    print("|---|---:|---:|---:|")
    for label, values in figures.items():
        rate = statistics.median(values["rate"])
        print(
            f"| {label} | {statistics.median(values['cpu_us']):.0f} | {rate:,.0f} "
            f"| {rate / reference:.0%} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
