"""Ordinary handlers under faults: the guarantees with handler code as Django code is
written, not handlers that only sleep.

Every worker process runs four handlers: three on one table with disjoint
``dequeue_filter``s and different ``stalled_max_age`` (one saves its job mid-run,
uses the ORM in ``pre_dequeue`` and ``get_queryset`` and logs inside its own
transaction with its row locked; one is ``async def`` with the async ORM; one
allows only 1.5 s of silence), and one on a table keyed by UUID. Meanwhile
workers are killed with -9, every connection is terminated now and then, and an
operator cancels jobs from the admin. It runs on a plain job table and on a partitioned
one (``PartJob``, django_dbworker.partitions): there every outcome moves its row to the
day's partition while the others heartbeat, cancel and reset around it.
"""

import random
import signal
import time

import pytest
from django.db import connection
from django.urls import reverse

from tests.testapp.handlers import uuid_key
from tests.testapp.models import Event, PartJob, QueueJob, Repository, UUIDJob

from .conftest import (
    ROW_LOCKS_ONLY,
    Fleet,
    audit,
    counts,
    recorded_attempts,
    say,
    scale,
    terminate_backends,
    within,
)

pytestmark = [
    pytest.mark.chaos,
    *ROW_LOCKS_ONLY,
    pytest.mark.django_db(transaction=True),
]

HANDLERS = [
    f"tests.testapp.handlers.{name}"
    for name in ("OrdinarySaving", "OrdinaryAsync", "OrdinaryPlain", "OrdinaryUUID")
]
#: The same handlers on the partitioned table (PartJob).
PARTITIONED_HANDLERS = [
    f"tests.testapp.handlers.{name}"
    for name in ("PartSaving", "PartAsync", "PartPlain", "OrdinaryUUID")
]
#: table: (job model, handlers, jobs).
TABLES = {
    "plain": (QueueJob, HANDLERS, scale(1_500, 10_000)),
    "partitioned": (PartJob, PARTITIONED_HANDLERS, scale(600, 10_000)),
}
BEHAVIORS = ("save", "async", "plain")
UUID_JOBS = scale(300, 2_000)
WORKERS = scale(3, 4)
KILL_EVERY = scale((1.5, 3.0), (3.0, 6.0))
TERMINATE_EVERY = scale(2.5, 5.0)
CANCEL_EVERY = 1.0


def unfinished(model=QueueJob):
    final = ("completed", "failed", "canceled")
    return (
        model.objects.exclude(state__in=final).count()
        + UUIDJob.objects.exclude(state__in=final).count()
    )


def seconds():
    return {"seconds": round(random.uniform(0.02, 0.3), 3)}


def admin_cancel(client, ids, model=QueueJob):
    """What an operator does: select jobs in the changelist, run "Cancel selected jobs"."""
    response = client.post(
        reverse(f"admin:testapp_{model._meta.model_name}_changelist"),
        {"action": "cancel_jobs", "_selected_action": ids, "index": 0},
    )
    assert response.status_code == 302, response.content[:500]


@pytest.mark.timeout(scale(300, 3600))
@pytest.mark.parametrize(
    "table",
    [
        "plain",
        pytest.param(
            "partitioned",
            marks=pytest.mark.skipif(
                connection.vendor != "postgresql", reason="partitioned tables: PostgreSQL only"
            ),
        ),
    ],
)
def test_ordinary_handlers_under_kills_terminations_and_admin_cancels(
    spawn, client, django_user_model, table
):
    Job, handlers, jobs = TABLES[table]
    repository = Repository.objects.create(name="chaos")
    Job.objects.bulk_create(
        Job(behavior=random.choice(BEHAVIORS), repository=repository, payload=seconds())
        for _ in range(jobs)
    )
    UUIDJob.objects.bulk_create(UUIDJob(payload=seconds()) for _ in range(UUID_JOBS))
    client.force_login(django_user_model.objects.create_superuser("ops", password="pw"))

    started = time.monotonic()
    resetter = spawn("runresetter", *handlers, "--interval", "0.5")
    fleet = Fleet(spawn, handlers, WORKERS)  # each with its own resetter too
    # job id -> (clicked, answered): time.time() before the admin POST and after its
    # reply; the cancel committed in between.
    canceled = {}
    terminations = 0
    deadline = started + within(240, 3300)
    next_kill = time.monotonic() + random.uniform(*KILL_EVERY)
    next_cut = time.monotonic() + TERMINATE_EVERY / 2
    next_cancel = time.monotonic() + CANCEL_EVERY
    while (left := unfinished(Job)) > 0:
        assert time.monotonic() < deadline, f"jobs left unfinished: {counts(Job)}"
        assert fleet.replace_dead() == 0, "a worker died without being killed:\n" + fleet.output()
        now = time.monotonic()
        if now >= next_kill and left > 50:
            victim = fleet.kill_random()
            say(f"kill -9 {victim.proc.pid} ({fleet.kills} kills), {left} jobs left")
            next_kill = now + random.uniform(*KILL_EVERY)
        if now >= next_cut and left > 50:
            terminations += 1
            cut = terminate_backends()
            say(f"connections terminated, round {terminations}: {cut} connections")
            next_cut = now + TERMINATE_EVERY
        if now >= next_cancel and left > 50:
            ids = list(
                Job.objects.exclude(state__in=("completed", "canceled"))
                .exclude(pk__in=canceled)
                .order_by("?")
                .values_list("pk", flat=True)[:3]
            )
            if ids:
                clicked = time.time()
                admin_cancel(client, ids, Job)
                canceled.update(dict.fromkeys(ids, (clicked, time.time())))
            next_cancel = now + CANCEL_EVERY
        time.sleep(0.1)
    duration = time.monotonic() - started

    # No fault any more: every live worker must still serve every handler (none wedged).
    # (A worker restarted after the last kill must have started to serve any.)
    fleet.wait_started()
    final = Job.objects.bulk_create(
        Job(behavior=behavior, repository=repository, payload={"seconds": 0.2})
        for behavior in BEHAVIORS
        for _ in range(6 * WORKERS)
    )
    final_ids = [job.pk for job in final]
    deadline = time.monotonic() + 60
    while Job.objects.filter(pk__in=final_ids).exclude(state="completed").exists():
        assert time.monotonic() < deadline, f"the last batch was not finished: {counts(Job)}"
        time.sleep(0.2)
    live = {proc.proc.pid for proc in fleet.alive()}
    served = {
        (behavior, int(host.split(":")[1]))
        for behavior, host in Job.objects.filter(pk__in=final_ids).values_list(
            "behavior", "worker_hostname"
        )
    }
    wedged = sorted(
        {pid for pid in live for behavior in BEHAVIORS if (behavior, pid) not in served}
    )

    assert set(fleet.stop()) == {0}, fleet.output()
    resetter.signal(signal.SIGTERM)
    assert resetter.wait(30) == 0, resetter.output
    logs = fleet.output() + resetter.output

    report = audit(fleet.died_at, logs, final_states=("completed", "canceled"), model=Job)
    uuid_report = audit(
        fleet.died_at, model=UUIDJob, key=uuid_key, kinds=("uuid-start", "uuid-end")
    )

    # Cancels: each canceled job ends canceled (or completed by the attempt that was
    # already running), and no attempt of it starts after the operator's click.
    attempts = {}
    for attempt in recorded_attempts():
        attempts.setdefault(attempt.job_id, []).append(attempt)
    # An attempt that started before the cancel committed may still complete the job
    # (it ended before its next heartbeat saw the flag); none may start after it.
    dishonoured = []
    states = dict(Job.objects.filter(pk__in=canceled).values_list("pk", "state"))
    for pk, (clicked, answered) in canceled.items():
        starts = [a.start for a in attempts.get(pk, []) if a.start is not None]
        late = [t for t in starts if t > answered + 1.0]
        ok = states[pk] == "canceled" or (
            states[pk] == "completed" and any(t <= answered for t in starts)
        )
        if late or not ok:
            dishonoured.append((pk, states[pk], [round(t - clicked, 3) for t in starts]))
    honoured = len(canceled) - len(dishonoured)
    # Every failure was an attempt that ran (none errored before its handler started).
    started_attempts = {pk: len(spans) for pk, spans in attempts.items()}
    failed_unrun = sum(
        max(0, failures - started_attempts.get(pk, 0))
        for pk, failures in Job.objects.values_list("pk", "num_failures")
    )
    logged = Event.objects.count()

    say(
        f"ordinary handlers: {WORKERS} workers x 4 handlers, {fleet.kills} kills, "
        f"{terminations} rounds of terminated connections, {len(canceled)} admin cancels; "
        f"{report.summary()}; UUID table: {uuid_report.summary()}; cancels honoured "
        f"{honoured}/{len(canceled)}; workers wedged {len(wedged)}; jobs failed without "
        f"running {failed_unrun}; {logged} events; {duration:.0f}s"
    )
    assert report.problems == []
    assert not Event.objects.filter(kind="post_handle:not-its-attempt").exists()
    assert uuid_report.problems == []
    assert (report.lost, report.overlaps, uuid_report.lost, uuid_report.overlaps) == (0, 0, 0, 0)
    assert dishonoured == [], "(job, state, attempt starts after the click in s)"
    assert wedged == []
    assert failed_unrun == 0
    assert fleet.kills >= scale(3, 10)
    assert terminations >= 3
    assert len(canceled) >= 10
    saved = Job.objects.filter(behavior="save", state="completed").exclude(pk__in=final_ids)
    unsaved = [job.pk for job in saved if not (job.payload["saved"] >= 1 and job.execution_logs)]
    assert unsaved == [], "completed without their save or their execution log"
