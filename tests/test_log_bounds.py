"""Execution logs have bounds as a whole (issue 42, item 9): 300 entries of 100 kB
made a 30 MB log that the worker wrote whole at every change, that the job page and
its live refresh rendered whole every 2 s, and that the job list read for each of its
rows. The same tests on SQLite, PostgreSQL and MariaDB."""

import json

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.factories import JobFactory
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob

pytestmark = pytest.mark.django_db(transaction=True)


def entries(count, size):
    return [
        {
            "key": f"step-{i}",
            "command": ["make", f"part-{i}"],
            "start_time": "2026-11-28T09:00:00+00:00",
            "exit_code": 0,
            "out": f"{i:08d}" + "x" * (size - 8),
            "duration_ms": 5,
        }
        for i in range(count)
    ]


def operation(job, name):
    return reverse("admin:testapp_queuejob_dbworker", args=[job.pk, name])


def test_a_worker_keeps_the_last_entries_of_a_large_log_and_says_how_many_it_dropped(
    run_worker,
):
    """300 entries of 100 kB: the row holds the last MAX_LOG_LENGTH (1,000,000)
    characters' worth of entries, and a first entry saying how many went."""
    job = JobFactory(behavior="big_log", payload={"entries": 300, "size": 100_000})
    assert run_worker(h.BehaviorHandler(), burst=True).join() == 0
    job.refresh_from_db()
    assert job.state == "completed", job.failure_message
    marker, *kept = job.execution_logs
    assert marker["key"] == "(earlier entries dropped)"
    assert marker["dropped"] + len(kept) == 300
    assert [e["key"] for e in kept] == [f"step-{i}" for i in range(300 - len(kept), 300)]
    assert sum(len(e["key"]) + len("".join(e["command"])) + len(e["out"]) for e in kept) <= (
        1_000_000
    )
    assert len(json.dumps(job.execution_logs)) < 1_100_000


@override_settings(DBWORKER={"MAX_LOG_ENTRIES": 5})
def test_the_number_of_entries_is_bounded_too(run_worker):
    job = JobFactory(behavior="big_log", payload={"entries": 50, "size": 10})
    assert run_worker(h.BehaviorHandler(), burst=True).join() == 0
    job.refresh_from_db()
    assert [e["key"] for e in job.execution_logs] == [
        "(earlier entries dropped)",
        *(f"step-{i}" for i in range(45, 50)),
    ]
    assert job.execution_logs[0]["dropped"] == 45


def test_the_job_page_and_its_live_refresh_show_the_last_entries(admin_client):
    """A log as large as any row may hold (written by an older release, or by plain
    SQL): the page and the live JSON show its last 20 entries and each output's last
    10,000 characters; the whole log is a link away."""
    job = JobFactory(state="processing", execution_logs=entries(300, 20_000))
    page = admin_client.get(reverse("admin:testapp_queuejob_change", args=[job.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert len(page.content) < 400_000
    assert "280 earlier entries not shown" in html
    assert "step-299" in html
    assert "step-279<" not in html
    assert "its last 10000 characters, 10000 earlier ones" in html
    live = admin_client.get(operation(job, "live"))
    assert len(live.content) < 300_000
    assert "280 earlier entries not shown" in json.loads(live.content)["html"]
    whole = admin_client.get(operation(job, "log"))
    assert whole.status_code == 200
    assert whole["Content-Type"] == "application/json"
    assert [e["key"] for e in whole.json()] == [f"step-{i}" for i in range(300)]


def test_the_whole_log_needs_the_view_permission_on_that_job(client, django_user_model):
    job = JobFactory(execution_logs=entries(2, 10))
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(operation(job, "log")).status_code == 403
    assert client.get(reverse("admin:testapp_queuejob_dbworker", args=[0, "log"])).status_code == (
        403
    )
    user.user_permissions.add(Permission.objects.get(codename="view_queuejob"))
    assert client.get(operation(job, "log")).status_code == 200
    assert client.get(reverse("admin:testapp_queuejob_dbworker", args=[0, "log"])).status_code == (
        404
    )


def test_the_task_list_reads_no_arguments_results_or_tracebacks(admin_client):
    """The tasks' list: arguments, return values and each attempt's traceback are read
    on a task's page only (and nothing deferred is read row by row)."""
    from django_dbworker.tasks.models import TaskJob
    from tests.testapp import tasks as t

    for i in range(5):
        t.add.enqueue(i, 1)
    TaskJob.objects.update(errors=[{"traceback": "x" * 1000}], return_value={"big": "y" * 100})
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(reverse("admin:dbworker_tasks_taskjob_changelist"))
    assert page.status_code == 200
    table = TaskJob._meta.db_table
    rows = [
        q["sql"]
        for q in queries.captured_queries
        if table in q["sql"] and "task_path" in q["sql"] and not q["sql"].startswith("EXPLAIN")
    ]
    assert len(rows) == 1, rows  # one query for the page's rows, none per row
    for column in ("execution_logs", "history", "args", "return_value", "errors", "options"):
        assert f"{column}" not in rows[0].split(" FROM ")[0], column


def test_the_job_list_does_not_read_logs_or_history(admin_client):
    JobFactory.create_batch(
        3, execution_logs=entries(2, 10), history=[{"outcome": "errored", "message": "x"}]
    )
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(reverse("admin:testapp_queuejob_changelist"))
    assert page.status_code == 200
    table = QueueJob._meta.db_table
    listed = [
        q["sql"]
        for q in queries.captured_queries
        if "worker_hostname" in q["sql"] and not q["sql"].startswith("EXPLAIN")  # plans only
    ]
    assert listed, [q["sql"] for q in queries.captured_queries]
    for sql in listed:
        assert table in sql
        assert "execution_logs" not in sql
        assert "history" not in sql


@pytest.mark.parametrize(
    ("key", "value"),
    [("MAX_LOG_ENTRIES", 0), ("MAX_LOG_LENGTH", 99), ("MAX_LOG_LENGTH", 1.5e6)],
)
def test_bad_log_bounds_are_refused(settings, key, value):
    from django_dbworker.checks import check_settings_and_handlers

    settings.DBWORKER = {key: value}
    messages = [m.msg for m in check_settings_and_handlers() if m.id == "dbworker.E001"]
    assert any(key in m and "must be an integer" in m for m in messages), messages
