"""The handler threads the admin shows (issue 42, items 15(c) and 24): of a shared
pool, its size; per handler, its own threads and its own jobs in flight."""

import signal

import pytest
from django.db.models import Q
from django.test import override_settings
from django.urls import reverse

from django_dbworker.models import WorkerProcess
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.test_pool import HEAVY, LIGHT, PoolHeavy, PoolLight
from tests.testapp.handlers import BehaviorHandler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

ONE_THREAD = "tests.test_admin_threads.OneThreadHandler"
NINE_THREADS = "tests.test_admin_threads.NineThreadsHandler"


class OneThreadHandler(BehaviorHandler):
    num_handlers = 1
    dequeue_filter = Q(behavior="sleep")


class NineThreadsHandler(BehaviorHandler):
    num_handlers = 9
    dequeue_filter = ~Q(behavior="sleep")


@override_settings(DBWORKER={"HANDLERS": [ONE_THREAD, NINE_THREADS]})
def test_busy_threads_of_a_handler_of_one_thread(spawn, admin_client):
    """Issue 42, 24: "busy threads 1 / 10" for a handler of one thread (its worker ran
    another handler of 9 threads): each handler's own jobs over its own threads."""
    job = JobFactory(behavior="sleep", payload={"seconds": 3})
    worker = spawn("runworker", ONE_THREAD, NINE_THREADS)
    label = f"testapp.QueueJob:{job.pk}"
    wait_until(
        lambda: any(label in w.jobs for w in WorkerProcess.objects.all()),
        30,
        0.05,
        "the job in flight",
    )
    board = admin_client.get(reverse("admin:testapp_queuejob_dashboard")).context["board"]
    rows = {row.name: row for row in board.rows}
    assert (rows[ONE_THREAD].busy, rows[ONE_THREAD].threads) == (1, 1)
    assert (rows[NINE_THREADS].busy, rows[NINE_THREADS].threads) == (0, 9)
    html = admin_client.get(reverse("admin:testapp_queuejob_dashboard")).content.decode()
    assert '<td class="dbworker-num" data-figure="busy">1 / 1</td>' in html
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output


@override_settings(DBWORKER={"HANDLERS": [LIGHT, HEAVY]})
def test_the_threads_of_a_shared_pool_are_its_size(spawn, admin_client):
    """Issue 42, 15(c): ``runworker --pool 4`` with handlers whose ceilings are 4 and 3
    showed 7 handler threads in the admin and on the dashboard."""
    worker = spawn("runworker", LIGHT, HEAVY, "--pool", "4")
    row = wait_until(
        lambda: WorkerProcess.objects.filter(pool__isnull=False).first(), 30, 0.1, "the worker"
    )
    assert row.num_handlers == 4
    light, heavy = PoolLight().get_name(), PoolHeavy().get_name()
    assert row.threads == {light: 4, heavy: 3}
    listing = admin_client.get(reverse("admin:django_dbworker_workerprocess_changelist"))
    assert '<td class="field-num_handlers">4</td>' in listing.content.decode()
    board = admin_client.get(reverse("admin:testapp_queuejob_dashboard")).context["board"]
    rows = {r.name: r for r in board.rows}
    assert (rows[light].threads, rows[heavy].threads) == (4, 3)
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output
