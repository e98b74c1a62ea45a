"""A task's "why is this job not running?" and the tasks' dashboard (issue 42, item
16): the handlers of ``runworker --tasks``, the queues a worker serves, and a paused task
queue named."""

import signal
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from django_dbworker.control.pause import pause
from django_dbworker.models import WorkerProcess
from django_dbworker.tasks.models import TaskJob
from tests.conftest import wait_until
from tests.testapp.tasks import add, send_welcome

pytestmark = pytest.mark.django_db

TASKS = "tasks:default[default,emails]"
EMAILS = "tasks:default[emails]"


def register(handlers, worker_id="w-1:10:abc", alive=True):
    beat = timezone.now() - timedelta(seconds=0 if alive else 3600)
    return WorkerProcess.objects.create(
        worker_id=worker_id,
        hostname="w-1",
        pid=10,
        handlers=list(handlers),
        num_handlers=4,
        started_at=beat,
        last_heartbeat_at=beat,
    )


def reasons(client, job):
    response = client.get(reverse("admin:dbworker_tasks_taskjob_change", args=[job.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    start = html.index("dbworker-reasons") if "dbworker-reasons" in html else 0
    return html[start : start + 3000]


def task_job(result):
    return TaskJob.objects.get(result_id=result.id)


def test_a_task_of_a_live_tasks_worker_names_its_handler_not_no_handler(admin_client):
    """Every task's page said "No handler serves dbworker_tasks.TaskJob … no worker in
    the registry runs one" while runworker --tasks ran."""
    job = task_job(add.enqueue(1, 2))
    register([TASKS, f"{TASKS} async"])
    text = reasons(admin_client, job)
    assert "No handler serves" not in text
    assert "Nothing holds it" in text


def test_a_task_without_a_tasks_worker_says_which_handler_to_run(admin_client):
    job = task_job(add.enqueue(1, 2))
    text = reasons(admin_client, job)
    assert "No handler serves" not in text
    assert f"No live worker runs handler {TASKS}" in text


def test_a_task_in_a_paused_queue_names_the_pause(admin_client):
    job = task_job(send_welcome.enqueue(7))
    register([TASKS, f"{TASKS} async"])
    pause("tasks:default:emails", by="ops", reason="mail server down")
    text = reasons(admin_client, job)
    assert "tasks:default:emails is paused by ops" in text
    assert "mail server down" in text
    # A task of another queue is not held by it.
    other = reasons(admin_client, task_job(add.enqueue(1, 1)))
    assert "paused" not in other


def test_a_task_of_a_worker_of_some_queues_only(admin_client):
    """``runworker --tasks --queue emails``: the queues its label names, built from
    the settings' backend (no import of anything the registry says)."""
    mail = task_job(send_welcome.enqueue(8))
    other = task_job(add.enqueue(1, 1))
    register([EMAILS, f"{EMAILS} async"])
    assert "Nothing holds it" in reasons(admin_client, mail)
    # The default queue's task: the backend's handler has no live worker.
    assert f"No live worker runs handler {TASKS}" in reasons(admin_client, other)


def test_a_registry_label_of_an_unknown_backend_is_no_handler(admin_client):
    job = task_job(add.enqueue(1, 2))
    register(["tasks:elsewhere[default]", "tasks:default[nowhere]", "tasks:default[emails"])
    text = reasons(admin_client, job)
    assert "elsewhere" not in text
    assert "nowhere" not in text
    assert f"No live worker runs handler {TASKS}" in text


def test_the_task_dashboard_shows_the_task_handlers_and_paused_queues(admin_client):
    send_welcome.enqueue(9)
    register([TASKS, f"{TASKS} async"])
    pause("tasks:default:emails")
    board = admin_client.get(reverse("admin:dbworker_tasks_taskjob_dashboard")).context["board"]
    rows = {row.name: row for row in board.rows}
    assert set(rows) == {TASKS, f"{TASKS} async"}
    assert rows[TASKS].queued == 1
    assert rows[TASKS].live_workers == 1
    assert rows[TASKS].paused == ["tasks:default:emails"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.subprocess
def test_the_page_of_a_task_waiting_in_a_queue_paused_while_runworker_tasks_runs(
    spawn, admin_client
):
    """End to end: ``runworker --tasks`` runs, the emails queue is paused; the task's
    page names the pause, and a task of the default queue runs."""
    pause("tasks:default:emails", by="ops", reason="mail server down")
    waiting = task_job(send_welcome.enqueue(5))
    worker = spawn("runworker", "--tasks")
    wait_until(
        lambda: any(w.is_alive() for w in WorkerProcess.objects.all()), 30, message="the worker"
    )
    ran = task_job(add.enqueue(2, 3))
    wait_until(lambda: TaskJob.objects.get(pk=ran.pk).state == "completed", 30, message="the task")
    text = reasons(admin_client, waiting)
    assert "No handler serves" not in text
    assert "No live worker" not in text
    assert "tasks:default:emails is paused by ops" in text
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output
