"""Controls under load (issue 12): pause during a drain by real workers, and
``enqueue_unique`` from many processes at once. Full sizes with DBWORKER_CHAOS_FULL=1."""

import os
import subprocess
import sys
import time

import pytest

from django_dbworker.control.pause import pause, resume
from tests import conftest
from tests.conftest import ROOT, assert_no_claim_began_after, database_now
from tests.testapp.models import ReportJob

from .conftest import Fleet, say, scale, wait_for

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.django_db(transaction=True),
]

HANDLER = "tests.testapp.handlers.ReportHandler"
ACTIVE = ("queued", "processing", "errored")


@pytest.mark.timeout(scale(180, 900))
def test_a_pause_during_a_drain_stops_claims_at_once_and_resume_finishes_it(spawn):
    jobs = scale(2_000, 10_000)
    ReportJob.objects.bulk_enqueue(
        ReportJob(tenant=f"t{i}", payload={"seconds": 0.002}) for i in range(jobs)
    )
    fleet = Fleet(spawn, HANDLER, 2, "--num-handlers", "4", "--prefetch", "4")
    wait_for(
        lambda: ReportJob.objects.filter(state="completed").count() >= jobs // 3, 120, "a third"
    )
    pause(HANDLER, by="chaos")
    paused_at = database_now()
    wait_for(lambda: not ReportJob.objects.filter(state="processing").exists(), 30, "running jobs")
    time.sleep(2.0)  # many claim intervals: the workers keep polling
    assert_no_claim_began_after(paused_at, ReportJob, in_flight=2 * (4 + 4))
    latest = max(ReportJob.objects.exclude(started_at=None).values_list("started_at", flat=True))
    waiting = ReportJob.objects.filter(state="queued").count()
    resume(HANDLER, by="chaos")
    resumed = time.monotonic()
    wait_for(lambda: not ReportJob.objects.filter(state__in=ACTIVE).exists(), 120, "the drain")
    drained = time.monotonic() - resumed
    assert set(fleet.stop()) == {0}, fleet.output()
    completed = ReportJob.objects.filter(state="completed").count()
    say(
        f"pause during a drain of {jobs}: {waiting} waited, latest claim "
        f"{(latest - paused_at).total_seconds():+.3f}s from the pause, the rest drained "
        f"{drained:.1f}s after resume, completed {completed}"
    )
    assert waiting > 0
    assert completed == jobs


ENQUEUER = """
import sys, django
django.setup()
from tests.testapp.models import ReportJob
made = 0
for _ in range(int(sys.argv[1])):
    made += ReportJob.objects.enqueue_unique(tenant="same", payload={"seconds": 0})[1]
print(made)
"""


@pytest.mark.timeout(scale(180, 900))
def test_enqueue_unique_from_many_processes_keeps_one_active_job(spawn):
    processes, each = scale((4, 200), (10, 1_000))
    fleet = Fleet(spawn, HANDLER, 1, "--num-handlers", "2")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    env["DATABASE_URL"] = conftest.test_database_url()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ENQUEUER, str(each)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,  # not a terminal's: no Ctrl-C supervisor
        )
        for _ in range(processes)
    ]
    most_active, samples = 0, 0
    while any(p.poll() is None for p in procs):
        most_active = max(most_active, ReportJob.objects.filter(state__in=ACTIVE).count())
        samples += 1
    outputs = [p.communicate(timeout=60) for p in procs]
    errors = [err for (_, err), p in zip(outputs, procs, strict=True) if p.returncode]
    assert errors == [], "\n".join(errors)
    made = sum(int(out) for out, _ in outputs)
    wait_for(lambda: not ReportJob.objects.filter(state__in=ACTIVE).exists(), 60, "the last job")
    assert set(fleet.stop()) == {0}, fleet.output()
    say(
        f"enqueue_unique: {processes} processes x {each} calls on one key, {made} jobs made, "
        f"most active at once {most_active} ({samples} samples)"
    )
    assert most_active == 1
    assert made == ReportJob.objects.count() >= 2  # the worker freed the key now and then
