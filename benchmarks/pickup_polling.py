"""Pickup latency where workers poll (MariaDB; SQLite), with the default poll settings.

One ``runworker`` of the example project idles; a job is enqueued every 0.5-3 s
(random); the figure is ``started_at - queued_at`` per job (both the database's
clock). Run from the checkout, against a database ``make demo`` migrated::

    DATABASE_URL=mysql://root@127.0.0.1:3306/dbworker_demo \
        .venv/bin/python -m benchmarks.pickup_polling 25
"""

import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
sys.path.insert(0, str(ROOT))
import django  # noqa: E402

django.setup()
from example_project.example.models import ExampleJob, Repository  # noqa: E402

repo = Repository.objects.first() or Repository.objects.create(
    name="r", url="https://example.invalid/r.git"
)
worker = subprocess.Popen(
    [sys.executable, "manage.py", "runworker", "example_project.example.workers.ExampleHandler"]
    + ["-v0"],
    cwd=ROOT,
)
time.sleep(4)
samples = []
try:
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 25):
        time.sleep(random.uniform(0.5, 3.0))
        job = ExampleJob.objects.create(repository=repo, seconds=0.0)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            job.refresh_from_db()
            if job.started_at:
                break
            time.sleep(0.01)
        samples.append((job.started_at - job.queued_at).total_seconds() * 1000)
finally:
    worker.terminate()
    worker.wait(30)
samples.sort()
q = statistics.quantiles(samples, n=100)
print(
    f"n={len(samples)} p50={statistics.median(samples):.0f} ms p90={q[89]:.0f} ms "
    f"max={samples[-1]:.0f} ms"
)
