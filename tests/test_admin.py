"""The admin as the operations console, through the Django test client."""

import json
import signal
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from django_dbworker.models import WorkerProcess
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp.models import QueueJob

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:testapp_queuejob_changelist"
SCRIPT = "<script>alert(1)</script>"


def changelist():
    return reverse(CHANGELIST)


def change(job):
    return reverse("admin:testapp_queuejob_change", args=[job.pk])


def operation(job, name):
    return reverse("admin:testapp_queuejob_dbworker", args=[job.pk, name])


def act(client, action, jobs, **extra):
    data = {"action": action, "_selected_action": [j.pk for j in jobs], "index": 0, **extra}
    return client.post(changelist(), data, follow=True)


def states(*jobs):
    return [QueueJob.objects.get(pk=j.pk).state for j in jobs]


def messages_of(response):
    return [str(m) for m in response.context["messages"]]


@pytest.fixture
def viewer(client, django_user_model):
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_queuejob"))
    client.force_login(user)
    return client


@pytest.fixture
def outsider(client, django_user_model):
    user = django_user_model.objects.create_user("outsider", password="pw", is_staff=True)
    client.force_login(user)
    return client


# -- changelist ------------------------------------------------------------------------


def test_changelist_shows_counts_per_state_and_the_columns(admin_client):
    JobFactory.create_batch(3)
    JobFactory(state="failed", failure_message="RuntimeError: boom\n\nTraceback ...")
    JobFactory(
        state="processing",
        started_at=timezone.now(),
        last_heartbeat_at=timezone.now() - timedelta(seconds=3),
        worker_hostname="host:1:abc",
    )
    response = admin_client.get(changelist())
    assert response.status_code == 200
    counts = {c["state"]: c["count"] for c in response.context["dbworker_counts"]}
    assert counts == {
        "queued": 3,
        "processing": 1,
        "completed": 0,
        "errored": 0,
        "failed": 1,
        "canceled": 0,
    }
    assert response.context["dbworker_total"] == 5
    html = response.content.decode()
    assert "RuntimeError: boom" in html
    assert "Traceback" not in html  # only the first line in the list
    assert "host:1:abc" in html
    assert " ago" in html  # heartbeat age of the processing job


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("state__exact=failed", {"failed"}),
        ("heartbeat=stalled", {"stalled"}),
        ("heartbeat=live", {"live", "canceling"}),
        ("cancel_requested=yes", {"canceling"}),
        ("worker=host%3A2%3Ax", {"live"}),
        ("q=needle", {"failed"}),
    ],
)
def test_filters_and_search(admin_client, query, expected):
    now = timezone.now()
    jobs = {
        "failed": JobFactory(state="failed", failure_message="ValueError: needle in it"),
        "stalled": JobFactory(
            state="processing", last_heartbeat_at=now - timedelta(hours=1), worker_hostname="h:1:x"
        ),
        "live": JobFactory(state="processing", last_heartbeat_at=now, worker_hostname="host:2:x"),
        "canceling": JobFactory(state="processing", cancel=True, last_heartbeat_at=now),
        "queued": JobFactory(),
    }
    response = admin_client.get(f"{changelist()}?{query}")
    shown = {obj.pk for obj in response.context["cl"].result_list}
    assert shown == {jobs[name].pk for name in expected}


def test_search_by_id(admin_client):
    JobFactory.create_batch(3)
    job = JobFactory()
    response = admin_client.get(f"{changelist()}?q={job.pk}")
    assert [obj.pk for obj in response.context["cl"].result_list] == [job.pk]


# -- actions ---------------------------------------------------------------------------


def test_cancel_action(admin_client):
    queued, errored = JobFactory(), JobFactory(state="errored")
    running = JobFactory(state="processing", last_heartbeat_at=timezone.now())
    done = JobFactory(state="completed")
    response = act(admin_client, "cancel_jobs", [queued, errored, running, done])
    assert states(queued, errored, running, done) == [
        "canceled",
        "canceled",
        "processing",
        "completed",
    ]
    assert QueueJob.objects.get(pk=running.pk).cancel
    (message,) = messages_of(response)
    assert message.startswith("Canceled 2 job(s); asked the workers of 1 running job(s)")
    assert "skipped 1 (already finished, or cancellation already requested)" in message


@pytest.mark.parametrize(
    ("action", "counters"), [("retry_jobs", (2, 1)), ("retry_jobs_reset_counters", (0, 0))]
)
def test_retry_actions(admin_client, action, counters):
    failed = JobFactory(state="failed", num_failures=2, num_resets=1, failure_message="x")
    canceled = JobFactory(state="canceled", num_failures=2, num_resets=1)
    running = JobFactory(state="processing")
    response = act(admin_client, action, [failed, canceled, running])
    assert states(failed, canceled, running) == ["queued", "queued", "processing"]
    job = QueueJob.objects.get(pk=failed.pk)
    assert (job.num_failures, job.num_resets) == counters
    assert job.process_after is None
    assert not job.cancel
    (message,) = messages_of(response)
    assert message.startswith("Queued 2 job(s) to run again now")
    assert "skipped 1 (only failed, errored and canceled jobs are retried)" in message


def test_run_now_action(admin_client):
    later = JobFactory(process_after=timezone.now() + timedelta(days=1))
    due = JobFactory()
    response = act(admin_client, "run_now", [later, due])
    assert QueueJob.objects.get(pk=later.pk).process_after <= timezone.now()
    assert messages_of(response) == [
        "1 job(s) can be claimed now; skipped 1 (only queued or errored jobs scheduled for later)"
    ]


def test_schedule_action_asks_for_a_time_then_applies_it(admin_client):
    queued, done = JobFactory(), JobFactory(state="completed")
    page = act(admin_client, "schedule_jobs", [queued, done])
    assert page.templates[0].name == "admin/django_dbworker/schedule.html"
    assert QueueJob.objects.get(pk=queued.pk).process_after is None
    response = act(
        admin_client,
        "schedule_jobs",
        [queued, done],
        apply="1",
        process_after_0="2031-01-02",
        process_after_1="03:04:00",
    )
    job = QueueJob.objects.get(pk=queued.pk)
    assert job.process_after.year == 2031
    assert job.state == "queued"
    assert QueueJob.objects.get(pk=done.pk).process_after is None
    (message,) = messages_of(response)
    assert message.startswith("1 job(s) will not run before 2031-01-02 03:04")


# -- the job page ----------------------------------------------------------------------


def test_job_page_shows_everything_read_only_with_its_buttons(admin_client):
    job = JobFactory(
        state="failed",
        failure_message="RuntimeError: boom\n\nTraceback (most recent call last):\n  ...",
        execution_logs=[
            {
                "key": "clone",
                "command": ["git", "clone", "https://example.com/r.git"],
                "start_time": "2026-11-22T10:00:00+00:00",
                "duration_ms": 1500,
                "exit_code": 0,
                "out": "Cloning...\n" * 200,
            },
            {"key": "test", "command": ["make", "test"], "exit_code": 2, "out": "FAILED\n"},
        ],
    )
    response = admin_client.get(change(job))
    html = response.content.decode()
    assert "Traceback (most recent call last)" in html  # in full
    assert "git clone https://example.com/r.git" in html
    assert "output (200 lines)" in html
    assert '<details class="dbworker-out">' in html  # the long output starts collapsed
    assert '<details class="dbworker-out" open>' in html
    assert "took 1.5 s" in html
    labels = [b["label"] for b in response.context["dbworker_buttons"]]
    assert labels == ["Retry", "Retry with fresh counters"]
    form = response.context["adminform"].form
    assert "state" not in form.fields
    assert "execution_logs" not in form.fields
    assert "behavior" in form.fields  # domain fields stay editable


def test_bookkeeping_fields_cannot_be_changed_through_the_form(admin_client):
    job = JobFactory(state="processing", worker_hostname="w:1:a", behavior="ok")
    data = {
        "behavior": "fail",
        "payload": "{}",
        "priority": 0,
        "size": 1,
        "state": "completed",
        "worker_hostname": "forged",
        "num_failures": 9,
    }
    response = admin_client.post(change(job), data)
    assert response.status_code == 302, response.content.decode()[:2000]
    job.refresh_from_db()
    assert (job.behavior, job.state, job.worker_hostname, job.num_failures) == (
        "fail",
        "processing",
        "w:1:a",
        0,
    )


@pytest.mark.parametrize(
    ("op", "before", "after"),
    [
        ("cancel", {}, "canceled"),
        ("retry", {"state": "failed"}, "queued"),
        ("retry-reset", {"state": "canceled", "num_failures": 3}, "queued"),
    ],
)
def test_job_buttons_post_only(admin_client, op, before, after):
    job = JobFactory(**before)
    assert admin_client.get(operation(job, op)).status_code == 405
    response = admin_client.post(operation(job, op))
    assert response.status_code == 302
    assert response["Location"] == change(job)
    assert states(job) == [after]


def test_run_now_button_and_unknown_operations(admin_client):
    job = JobFactory(process_after=timezone.now() + timedelta(hours=2))
    admin_client.post(operation(job, "run-now"))
    assert QueueJob.objects.get(pk=job.pk).process_after <= timezone.now()
    assert admin_client.post(operation(job, "explode")).status_code == 404
    assert (
        admin_client.post(
            reverse("admin:testapp_queuejob_dbworker", args=[0, "cancel"])
        ).status_code
        == 404
    )


def test_live_endpoint(admin_client):
    job = JobFactory(state="processing", last_heartbeat_at=timezone.now(), worker_hostname="w:1:x")
    data = json.loads(admin_client.get(operation(job, "live")).content)
    assert data["state"] == "processing"
    assert data["processing"] is True
    assert "w:1:x" in data["html"]
    assert "data-live-url" in data["html"]


# -- escaping --------------------------------------------------------------------------


def test_text_from_jobs_is_escaped_everywhere(admin_client):
    job = JobFactory(
        state="processing",
        failure_message=f"{SCRIPT} in the message",
        worker_hostname=f"{SCRIPT}:1:x",
        execution_logs=[{"key": SCRIPT, "command": ["echo", SCRIPT], "out": SCRIPT}],
    )
    pages = [
        admin_client.get(changelist()).content.decode(),
        admin_client.get(change(job)).content.decode(),
        json.loads(admin_client.get(operation(job, "live")).content)["html"],
    ]
    for html in pages:
        assert "<script>alert" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


# -- permissions -----------------------------------------------------------------------


def test_view_permission_shows_jobs_but_no_actions_or_buttons(viewer):
    job = JobFactory(state="failed")
    response = viewer.get(changelist())
    assert response.status_code == 200
    assert response.context["action_form"] is None or not [
        c for c in response.context["action_form"].fields["action"].choices if c[0]
    ]
    page = viewer.get(change(job))
    assert page.status_code == 200
    assert page.context["dbworker_buttons"] == []
    assert viewer.get(operation(job, "live")).status_code == 200


def test_forged_posts_without_change_permission_are_refused(viewer):
    failed, queued = JobFactory(state="failed"), JobFactory()
    act(viewer, "retry_jobs", [failed])
    act(viewer, "cancel_jobs", [queued])
    assert viewer.post(operation(failed, "retry")).status_code == 403
    assert viewer.post(operation(queued, "cancel")).status_code == 403
    assert states(failed, queued) == ["failed", "queued"]


def test_no_view_permission_no_access(outsider):
    job = JobFactory()
    assert outsider.get(changelist()).status_code == 403
    assert outsider.get(operation(job, "live")).status_code == 403
    assert outsider.post(operation(job, "cancel")).status_code == 403
    assert states(job) == ["queued"]


def test_change_permission_is_enough_for_the_actions(client, django_user_model):
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    for codename in ("view_queuejob", "change_queuejob"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    job = JobFactory()
    act(client, "cancel_jobs", [job])
    assert states(job) == ["canceled"]


# -- live workers ----------------------------------------------------------------------


def test_worker_registry_lists_live_and_silent_workers_read_only(admin_client):
    now = timezone.now()
    job = JobFactory(state="processing")
    alive = WorkerProcess.objects.create(
        worker_id="alive:1:a",
        hostname="alive",
        pid=1,
        handlers=["tests.Handler"],
        num_handlers=4,
        jobs=[f"testapp.QueueJob:{job.pk}"],
        num_jobs=1,
        started_at=now,
        last_heartbeat_at=now,
    )
    WorkerProcess.objects.create(
        worker_id="dead:2:b",
        hostname="dead",
        pid=2,
        started_at=now - timedelta(hours=2),
        last_heartbeat_at=now - timedelta(hours=1),
    )
    html = admin_client.get(reverse("admin:django_dbworker_workerprocess_changelist")).content
    html = html.decode()
    assert "alive:1:a" in html
    assert "dead:2:b" in html
    assert "silent (dead?)" in html
    assert ">alive<" in html
    detail = admin_client.get(
        reverse("admin:django_dbworker_workerprocess_change", args=[alive.pk])
    ).content.decode()
    assert change(job) in detail  # jobs in flight link to their job page
    assert admin_client.get(reverse("admin:django_dbworker_workerprocess_add")).status_code == 403


# -- with a real worker ----------------------------------------------------------------


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_cancel_from_the_admin_stops_a_running_job_within_two_heartbeats(admin_client, spawn):
    job = JobFactory(behavior="sleep", payload={"seconds": 60})
    worker = spawn("runworker", "tests.testapp.handlers.SlowHeartbeatHandler", "--no-resetter")
    wait_until(lambda: states(job) == ["processing"], 30, message="the job to start")
    act(admin_client, "cancel_jobs", [job])
    asked = timezone.now()
    wait_until(lambda: states(job) == ["canceled"], 10, message="the job to be canceled")
    finished = QueueJob.objects.get(pk=job.pk).finished_at
    # SlowHeartbeatHandler.heartbeat_interval is 0.5 s: two intervals.
    assert (finished - asked).total_seconds() < 2 * 0.5
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_failed_job_retried_from_the_admin_is_completed_by_a_running_worker(admin_client, spawn):
    job = JobFactory(behavior="fail_times", payload={"times": 1}, state="failed", num_failures=1)
    worker = spawn("runworker", "tests.testapp.handlers.BehaviorHandler", "--no-resetter")
    act(admin_client, "retry_jobs", [job])
    wait_until(lambda: states(job) == ["completed"], 20, message="the retried job")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output
