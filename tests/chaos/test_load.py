"""Load: 4 worker processes through a big queue; each worker's memory stays flat."""

import time
from pathlib import Path

import pytest
from django.db.models import Count

from tests.testapp.models import QueueJob

from .conftest import ROW_LOCKS_ONLY, Fleet, counts, say, scale, unfinished, within

pytestmark = [
    pytest.mark.chaos,
    *ROW_LOCKS_ONLY,
    pytest.mark.django_db(transaction=True),
]

HANDLER = "tests.testapp.handlers.LoadHandler"
JOBS = scale(8_000, 100_000)
WORKERS = 4
#: RSS growth allowed after warm-up (the first quarter of a worker's jobs): allocator
#: noise, not a leak. A leak of 1 KB per job would be 25 MB per worker in the full run.
ALLOWED_GROWTH_MB = scale(8, 10)


def rss_mb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.mark.timeout(scale(240, 1800))
def test_worker_memory_stays_flat_over_the_queue(spawn):
    batch = 10_000
    for start in range(0, JOBS, batch):
        QueueJob.objects.bulk_create(
            (QueueJob() for _ in range(min(batch, JOBS - start))), batch_size=batch
        )
    started = time.monotonic()
    fleet = Fleet(spawn, HANDLER, WORKERS, "--num-handlers", "8", "--no-resetter")
    pids = {proc.proc.pid: proc for proc in fleet.procs}
    samples = {pid: [] for pid in pids}  # (jobs done, RSS MB)
    deadline = started + within(200, 1700)
    while unfinished() > 0:
        assert time.monotonic() < deadline, f"unfinished: {counts()}"
        done = dict(
            QueueJob.objects.filter(state="completed")
            .values_list("worker_hostname")
            .annotate(n=Count("pk"))
            .order_by()
        )
        for pid in pids:
            jobs = sum(n for worker, n in done.items() if worker.split(":")[1] == str(pid))
            samples[pid].append((jobs, rss_mb(pid)))
        time.sleep(0.5)
    duration = time.monotonic() - started
    assert fleet.replace_dead() == 0, fleet.output()
    assert set(fleet.stop()) == {0}, fleet.output()
    assert counts() == {"completed": JOBS}

    lines = []
    for pid, points in samples.items():
        total = points[-1][0]
        warm = next(rss for jobs, rss in points if jobs >= total / 4)
        peak_after = max(rss for jobs, rss in points if jobs >= total / 4)
        growth = peak_after - warm
        lines.append(
            f"pid {pid}: {total} jobs, RSS {points[0][1]:.0f} MB at start, {warm:.0f} MB after "
            f"a quarter, peak {peak_after:.0f} MB after that (+{growth:.1f} MB)"
        )
        assert total >= JOBS / WORKERS / 4, "a worker did hardly any work"
        assert growth <= ALLOWED_GROWTH_MB, lines[-1]
    say(
        f"{JOBS} jobs, {WORKERS} workers x 8 handlers, {duration:.0f}s, "
        f"{JOBS / duration:.0f} jobs/s\n" + "\n".join(lines)
    )
