"""The admin as the operations console, through the Django test client."""

import json
import re
import signal
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_dbworker import operations
from django_dbworker.models import WorkerProcess
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp.models import ManagedJob, QueueJob, ReportJob

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
    assert "host:<wbr>1:<wbr>abc" in html  # the worker column
    # The processing job's heartbeat age, under its state.
    assert re.search(
        r'class="dbworker-beat">heartbeat <span class="dbworker-nowrap">3\.\d s ago', html
    )


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
    assert QueueJob.objects.get(pk=later.pk).process_after is None  # claimable now
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
    ("op", "before", "after", "question", "effect"),
    [
        ("cancel", {}, "canceled", "Cancel job {}?", "it becomes canceled now"),
        ("retry", {"state": "failed"}, "queued", "Retry job {}?", "keeping its 0 failure(s)"),
        (
            "retry-reset",
            {"state": "canceled", "num_failures": 3},
            "queued",
            "Retry job {} with fresh counters?",
            "set to 0",
        ),
        (
            "run-now",
            {"process_after": timezone.now() + timedelta(hours=2)},
            "queued",
            "Run job {} now?",
            "it can be claimed now",
        ),
    ],
)
def test_job_buttons_ask_for_confirmation_then_post_acts(
    admin_client, op, before, after, question, effect
):
    job = JobFactory(**before)
    page = admin_client.get(change(job)).content.decode()
    # A link to the confirmation page, in the operations box, not a form among the tools.
    assert f'href="{operation(job, op)}" data-operation="{op}"' in page
    assert 'class="object-tools"' in page
    assert "dbworker-operations" in page
    confirm = admin_client.get(operation(job, op))
    assert confirm.status_code == 200
    assert confirm.templates[0].name == "admin/django_dbworker/confirm_operation.html"
    html = confirm.content.decode()
    assert f"<h1>{question.format(job.pk)}</h1>" in html
    assert effect in html
    assert 'name="csrfmiddlewaretoken"' in html
    assert states(job) == [before.get("state", "queued")]  # a GET changes nothing
    if op == "run-now":
        assert QueueJob.objects.get(pk=job.pk).process_after > timezone.now()
    assert not LogEntry.objects.exists()
    response = admin_client.post(operation(job, op))
    assert response.status_code == 302
    assert response["Location"] == change(job)
    assert states(job) == [after]
    if op == "run-now":
        assert QueueJob.objects.get(pk=job.pk).process_after is None


def test_cancel_confirmation_of_a_running_job_names_its_worker(admin_client):
    job = JobFactory(state="processing", worker_hostname="build-2:518:77be01")
    html = admin_client.get(operation(job, "cancel")).content.decode()
    assert "running on worker build-2:518:77be01" in html
    assert "at its next heartbeat" in html


def test_an_operation_that_does_not_apply_says_why_and_offers_no_form(admin_client):
    job = JobFactory(state="completed")
    response = admin_client.get(operation(job, "cancel"))
    assert response.status_code == 200
    html = response.content.decode()
    assert f"Job {job.pk} is completed: there is nothing to cancel." in html
    assert 'method="post"' not in html.split('id="content-main"', 1)[1]


def test_forged_operations_do_not_act(client, admin_user):
    """Only a POST with the CSRF token acts: not a GET (a link, an <img src>), not a
    cross-site POST without the token, not another method."""
    client.force_login(admin_user)
    job = JobFactory()
    assert client.get(operation(job, "cancel")).status_code == 200
    assert client.head(operation(job, "cancel")).status_code == 200
    assert client.put(operation(job, "cancel")).status_code == 405
    assert client.delete(operation(job, "cancel")).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(admin_user)
    assert strict.post(operation(job, "cancel")).status_code == 403
    assert states(job) == ["queued"]
    assert not LogEntry.objects.exists()


def test_run_now_button_and_unknown_operations(admin_client):
    job = JobFactory(process_after=timezone.now() + timedelta(hours=2))
    admin_client.post(operation(job, "run-now"))
    assert QueueJob.objects.get(pk=job.pk).process_after is None
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
    failed = JobFactory(
        state="failed", failure_message=f"{SCRIPT} failed", worker_hostname=f"{SCRIPT}:2:y"
    )
    pages = [
        admin_client.get(changelist()).content.decode(),
        admin_client.get(change(job)).content.decode(),
        json.loads(admin_client.get(operation(job, "live")).content)["html"],
        admin_client.get(operation(job, "cancel")).content.decode(),
        admin_client.get(operation(failed, "retry")).content.decode(),
        admin_client.get(operation(failed, "cancel")).content.decode(),  # does not apply
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
    assert "dbworker-operations" not in page.content.decode()
    assert viewer.get(operation(job, "live")).status_code == 200
    assert viewer.get(operation(job, "retry")).status_code == 403


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


def test_the_live_workers_view_offers_no_actions_and_no_delete(admin_client):
    now = timezone.now()
    worker = WorkerProcess.objects.create(
        worker_id="w:1:a", hostname="w", pid=1, started_at=now, last_heartbeat_at=now
    )
    url = reverse("admin:django_dbworker_workerprocess_changelist")
    response = admin_client.get(url)
    assert response.context["action_form"] is None
    html = response.content.decode()
    assert "delete_selected" not in html
    assert 'name="_selected_action"' not in html
    delete = reverse("admin:django_dbworker_workerprocess_delete", args=[worker.pk])
    assert admin_client.get(delete).status_code == 403
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    forged = {"action": "delete_selected", "_selected_action": [worker.pk], "post": "yes"}
    admin_client.post(url, forged)
    assert WorkerProcess.objects.filter(pk=worker.pk).exists()
    detail = admin_client.get(
        reverse("admin:django_dbworker_workerprocess_change", args=[worker.pk])
    ).content.decode()
    assert "deletelink" not in detail
    assert ">–<" in detail  # no jobs in flight: the empty mark, like every empty value


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


# -- a job model with a default manager of its own ---------------------------------------


def test_actions_work_on_a_model_whose_default_manager_is_not_workerjobqueryset(admin_client):
    """ManagedJob.objects returns a plain QuerySet: the admin must not need its methods."""
    url = reverse("admin:testapp_managedjob_changelist")
    queued, failed = ManagedJob.objects.create(), ManagedJob.objects.create(state="failed")
    later = ManagedJob.objects.create(process_after=timezone.now() + timedelta(hours=1))

    def run(action, jobs, **extra):
        data = {"action": action, "_selected_action": [j.pk for j in jobs], **extra}
        response = admin_client.post(url, data, follow=True)
        assert response.status_code == 200
        return [str(m) for m in response.context["messages"]]

    assert run("cancel_jobs", [queued])[0].startswith("Canceled 1 job(s)")
    assert run("retry_jobs_reset_counters", [failed, queued])[0].startswith("Queued 2 job(s)")
    assert run("run_now", [later]) == ["1 job(s) can be claimed now"]
    message = run(
        "schedule_jobs", [later], apply="1", process_after_0="2031-01-02", process_after_1="03:04"
    )
    assert message[0].startswith("1 job(s) will not run before 2031-01-02 03:04")
    assert [ManagedJob.objects.get(pk=j.pk).state for j in (queued, failed)] == ["queued"] * 2
    assert ManagedJob.objects.get(pk=later.pk).process_after.year == 2031


# -- audit trail -------------------------------------------------------------------------


def history(job):
    return list(
        LogEntry.objects.filter(
            content_type=ContentType.objects.get_for_model(QueueJob), object_id=str(job.pk)
        )
        .order_by("id")
        .values_list("user__username", "action_flag", "change_message")
    )


def test_actions_and_buttons_are_recorded_in_the_jobs_history(admin_client, admin_user):
    queued, running = JobFactory(), JobFactory(state="processing")
    failed, done = JobFactory(state="failed"), JobFactory(state="completed")
    later = JobFactory(process_after=timezone.now() + timedelta(hours=1))
    act(admin_client, "cancel_jobs", [queued, running, done])
    admin_client.post(operation(failed, "retry-reset"))
    act(admin_client, "run_now", [later])
    act(
        admin_client,
        "schedule_jobs",
        [later, done],
        apply="1",
        process_after_0="2031-01-02",
        process_after_1="03:04:05",
    )
    user = admin_user.username
    assert history(queued) == [(user, CHANGE, "Canceled (dbworker action)")]
    assert history(running) == [(user, CHANGE, "Cancellation requested (dbworker action)")]
    assert history(failed) == [(user, CHANGE, "Retried, with fresh counters (dbworker job page)")]
    assert history(later) == [
        (user, CHANGE, "Run now (dbworker action)"),
        (user, CHANGE, "Scheduled, not before 2031-01-02 03:04:05 UTC (dbworker action)"),
    ]
    assert history(done) == []  # nothing happened to it
    page = admin_client.get(reverse("admin:testapp_queuejob_history", args=[queued.pk]))
    assert "Canceled (dbworker action)" in page.content.decode()


# -- how the list shows jobs ---------------------------------------------------------------


class _Cells(HTMLParser):
    """The job list's cells: {pk: {column: text}} (columns from their field-… class)."""

    def __init__(self):
        super().__init__()
        self.rows, self.row, self.column, self.text = {}, None, None, []

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.row = {}
        classes = (dict(attrs).get("class") or "").split()
        column = next((c[len("field-") :] for c in classes if c.startswith("field-")), None)
        if tag in ("td", "th") and column and self.row is not None:
            self.column, self.text = column, []

    def handle_data(self, data):
        if self.column:
            self.text.append(data)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.column:
            self.row[self.column] = "".join(self.text).strip()
            self.column = None
        elif tag == "tr" and self.row and "id" in self.row:
            self.rows[int(self.row["id"])] = self.row
            self.row = None


def cells(html):
    parser = _Cells()
    parser.feed(html)
    return parser.rows


def test_times_in_the_list_show_seconds_in_the_sites_time_zone(admin_client, settings):
    at = datetime(2026, 11, 23, 16, 34, 55, 123456, tzinfo=UTC)
    job = JobFactory(
        state="completed",
        queued_at=at,
        started_at=at + timedelta(seconds=1),
        finished_at=at + timedelta(seconds=3),
    )
    row = cells(admin_client.get(changelist()).content.decode())[job.pk]
    assert (row["queued"], row["started"], row["finished"]) == (
        "2026-11-23 16:34:55",
        "2026-11-23 16:34:56",
        "2026-11-23 16:34:58",
    )
    settings.TIME_ZONE = "Europe/Berlin"
    row = cells(admin_client.get(changelist()).content.decode())[job.pk]
    assert row["queued"] == "2026-11-23 17:34:55"


def test_empty_cells_all_show_the_same_mark(admin_client):
    never_run = JobFactory()
    running = JobFactory(
        state="processing", started_at=timezone.now(), last_heartbeat_at=timezone.now()
    )
    rows = cells(admin_client.get(changelist()).content.decode())
    empty = rows[never_run.pk]
    for column in ("started", "finished", "duration", "worker", "failure"):
        assert empty[column] == "–", (column, empty)
    assert rows[running.pk]["finished"] == "–"
    for row in rows.values():
        for column, text in row.items():
            assert text not in ("", "-", "\xa0"), (column, row)


def test_a_requeued_jobs_failure_is_labelled_as_the_previous_attempts(admin_client):
    retried = JobFactory(state="queued", failure_message="RuntimeError: boom\nTraceback ...")
    running = JobFactory(state="processing", failure_message="OSError: disk full")
    failed = JobFactory(state="failed", failure_message="ValueError: now")
    rows = cells(admin_client.get(changelist()).content.decode())
    assert rows[retried.pk]["failure"] == "previous attempt: RuntimeError: boom"
    assert rows[running.pk]["failure"] == "previous attempt: OSError: disk full"
    assert rows[failed.pk]["failure"] == "ValueError: now"
    page = admin_client.get(change(retried)).content.decode()
    assert "Failure of the previous attempt" in page
    assert '<h3 class="dbworker-heading">Failure</h3>' not in page
    page = admin_client.get(change(failed)).content.decode()
    assert '<h3 class="dbworker-heading">Failure</h3>' in page
    assert "previous attempt" not in page


def test_the_job_list_shows_the_limits_in_use_escaped(admin_client, settings):
    settings.DBWORKER = {
        **settings.DBWORKER,
        "HANDLERS": ["tests.testapp.handlers.LimitedReportHandler"],
    }
    ReportJob.objects.create(tenant=SCRIPT, state="processing", worker_hostname="w:1:a")
    ReportJob.objects.create(tenant="acme", kind="weekly", state="processing")
    ReportJob.objects.create(tenant="acme", kind="monthly")
    html = admin_client.get(reverse("admin:testapp_reportjob_changelist")).content.decode()
    assert "limits of <code>tests.testapp.handlers.LimitedReportHandler</code>" in html
    assert "<dd>2/4 running</dd>" in html
    assert SCRIPT not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;: 1" in html
    # Another model's list shows no limits of this handler.
    assert "limits of" not in admin_client.get(changelist()).content.decode()


def test_retrying_jobs_whose_unique_key_is_held_retries_the_others(admin_client):
    """A failed unique job whose key another active job now holds: the retry used to be
    a 500 page (IntegrityError) for the whole selection, from the list and the job page,
    and an IntegrityError from ``.retry()``."""
    blocked = ReportJob.objects.create(tenant="acme", state="failed")
    holder = ReportJob.objects.create(tenant="acme")  # queued: holds ("acme", "daily")
    free = ReportJob.objects.create(tenant="globex", state="failed")
    twin_a = ReportJob.objects.create(tenant="initech", state="canceled")
    twin_b = ReportJob.objects.create(tenant="initech", state="failed")  # the same key
    url = reverse("admin:testapp_reportjob_changelist")
    data = {
        "action": "retry_jobs",
        "_selected_action": [blocked.pk, free.pk, twin_a.pk, twin_b.pk],
        "index": 0,
    }
    response = admin_client.post(url, data, follow=True)
    assert response.status_code == 200
    states_now = dict(ReportJob.objects.values_list("pk", "state"))
    assert (states_now[blocked.pk], states_now[free.pk]) == ("failed", "queued")
    assert sorted([states_now[twin_a.pk], states_now[twin_b.pk]]) == ["failed", "queued"]
    first_twin = twin_a if states_now[twin_a.pk] == "queued" else twin_b
    other_twin = twin_b if first_twin is twin_a else twin_a
    retried, held = messages_of(response)
    assert retried.startswith("Queued 2 job(s) to run again now")
    assert held == (
        f"Not retried: job {blocked.pk} (its unique key is held by job {holder.pk}), "
        f"job {other_twin.pk} (its unique key is held by job {first_twin.pk})."
    )
    # The job page's button, and the queryset method, say the same.
    page = reverse("admin:testapp_reportjob_dbworker", args=[blocked.pk, "retry"])
    response = admin_client.post(page, follow=True)
    assert response.status_code == 200
    assert f"job {blocked.pk} (its unique key is held by job {holder.pk})" in " ".join(
        messages_of(response)
    )
    assert ReportJob.objects.filter(pk=blocked.pk).retry() == 0
    result = operations.retry(ReportJob.objects.filter(pk__in=[blocked.pk, other_twin.pk]))
    assert result == operations.Retried([], {blocked.pk: holder.pk, other_twin.pk: first_twin.pk})
    ReportJob.objects.filter(pk=holder.pk).update(state="completed")
    assert ReportJob.objects.filter(pk=blocked.pk).retry() == 1  # the key is free again
