"""Who may do what in the operations console (issue 42), through the Django test client
with staff users who hold the view permission only, or the change permission:

- every action and view that changes something requires a permission, checked before
  anything runs; no admin of the package offers one to view-only staff;
- pages read and show only what the user may see: the job list reads no job before the
  permission check, operation URLs answer 403 whether or not the job exists, the
  workers and schedules pages show the jobs of other models only to users who may view
  them (and only the rows their admin gives them);
- no admin page imports a module, or builds a class, that the worker registry names;
- a schedule declared in code is switched off, not deleted (a worker would register it
  again, switched on); one no worker declares is deleted, and the deletion audited;
  checked with real ``runworker`` processes re-syncing the schedules;
- no search of any admin of the package answers 500 (SQLite, PostgreSQL, MariaDB).
"""

import datetime
import signal
import sys
import time

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_dbworker import Periodic
from django_dbworker.admin import WorkerJobAdmin
from django_dbworker.control.models import AuditEntry, Pause, Schedule, ScheduleTick
from django_dbworker.control.pause import pause
from django_dbworker.maintenance.scheduler import Scheduler
from django_dbworker.models import WorkerProcess
from django_dbworker.tasks.models import TaskJob
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp import handlers as h
from tests.testapp.models import ManagedJob, QueueJob, ReportJob

pytestmark = pytest.mark.django_db

PAUSES = "/admin/django_dbworker/pause/"
SCHEDULES = "/admin/django_dbworker/schedule/"
SCHEDULED = "tests.testapp.handlers.ScheduledHandler"


@pytest.fixture
def staff(client, django_user_model):
    """Log ``client`` in as a new staff user holding the permissions ``codenames``."""
    made = []

    def login(*codenames):
        user = django_user_model.objects.create_user(f"staff{len(made)}", is_staff=True)
        user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
        assert user.user_permissions.count() == len(codenames)
        made.append(user)
        client.force_login(user)
        return client

    return login


def package_admins():
    """Every admin of the package on the site, and the test project's job admins."""
    return {
        model: model_admin
        for model, model_admin in admin.site._registry.items()
        if type(model_admin).__module__.startswith("django_dbworker")
        or isinstance(model_admin, WorkerJobAdmin)
    }


def changelist_of(model):
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def change_of(obj):
    opts = obj._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])


def operation(pk, name):
    return reverse("admin:testapp_queuejob_dbworker", args=[pk, name])


def offered(response):
    form = response.context["action_form"]
    return [] if form is None else [value for value, _ in form.fields["action"].choices if value]


def act(client, url, action, rows, **extra):
    data = {"action": action, "_selected_action": [r.pk for r in rows], "index": 0, **extra}
    return client.post(url, data)


def trail():
    return list(AuditEntry.objects.order_by("id").values_list("actor", "action", "target"))


def label(job):
    return f"{job._meta.label}:{job.pk}"


def worker_row(**fields):
    now = timezone.now()
    defaults = {"worker_id": "w:1:a", "hostname": "w", "pid": 1, "handlers": []}
    return WorkerProcess.objects.create(
        **{**defaults, **fields}, started_at=now, last_heartbeat_at=now
    )


# -- 1. every action that changes something requires a permission --------------------


def test_resuming_and_switching_need_the_change_permission(staff):
    pause("reports", by="ops")
    schedule = Schedule.objects.create(name="nightly", expression="0 3 * * *", target="t")
    viewer = staff("view_pause", "view_schedule")
    assert offered(viewer.get(PAUSES)) == []
    assert offered(viewer.get(SCHEDULES)) == []
    act(viewer, PAUSES, "resume_selected", Pause.objects.all())
    act(viewer, SCHEDULES, "disable_selected", [schedule])
    assert Pause.objects.filter(name="reports").exists()
    assert Schedule.objects.get().enabled
    assert trail() == [("ops", "pause", "reports")]

    operator = staff("view_pause", "change_pause", "view_schedule", "change_schedule")
    assert offered(operator.get(PAUSES)) == ["resume_selected"]
    assert offered(operator.get(SCHEDULES)) == ["enable_selected", "disable_selected"]
    act(operator, PAUSES, "resume_selected", Pause.objects.all())
    act(operator, SCHEDULES, "disable_selected", [schedule])
    assert not Pause.objects.exists()
    assert not Schedule.objects.get().enabled
    assert trail() == [
        ("ops", "pause", "reports"),
        ("staff1", "resume", "reports"),
        ("staff1", "disable schedule", "nightly"),
    ]


def test_no_admin_of_the_package_offers_an_action_to_view_only_staff(rf, django_user_model):
    admins = package_admins()
    user = django_user_model.objects.create_user("viewer", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            codename__in=[f"view_{model._meta.model_name}" for model in admins]
        )
    )
    request = rf.get("/")
    request.user = django_user_model.objects.get(pk=user.pk)  # no permission cache
    actions = {model._meta.label: list(ma.get_actions(request)) for model, ma in admins.items()}
    assert actions == {model._meta.label: [] for model in admins}


def test_every_action_of_the_package_declares_its_permission(rf, admin_user):
    request = rf.get("/")
    request.user = admin_user
    undeclared = [
        f"{model._meta.label}: {name}"
        for model, model_admin in package_admins().items()
        for name, action in model_admin.get_actions(request).items()
        # Django 6.1 gives Action objects (unpacking them is deprecated), 5.2 and 6.0 tuples.
        if not getattr(getattr(action, "func", None) or action[0], "allowed_permissions", None)
    ]
    assert undeclared == []


# -- 3. permission first, per model ------------------------------------------------------


def test_the_job_list_reads_no_job_before_the_permission_check(staff):
    JobFactory.create_batch(2)
    outsider = staff()  # staff, without any permission on jobs
    with CaptureQueriesContext(connection) as queries:
        assert outsider.get(changelist_of(QueueJob)).status_code == 403
    assert [q["sql"] for q in queries if "testapp_queuejob" in q["sql"].lower()] == []


def test_operation_urls_answer_403_whether_or_not_the_job_exists(staff):
    job = JobFactory(state="failed")
    missing = job.pk + 1000
    outsider = staff()
    for pk in (job.pk, missing):
        assert outsider.get(operation(pk, "live")).status_code == 403
        assert outsider.get(operation(pk, "retry")).status_code == 403
        assert outsider.post(operation(pk, "retry")).status_code == 403
        assert outsider.get(operation(pk, "no-such-operation")).status_code == 403
    viewer = staff("view_queuejob")
    for pk in (job.pk, missing):
        assert viewer.get(operation(pk, "retry")).status_code == 403
        assert viewer.post(operation(pk, "cancel")).status_code == 403
    assert viewer.get(operation(job.pk, "live")).status_code == 200
    assert viewer.get(operation(missing, "live")).status_code == 404  # they may see jobs
    assert QueueJob.objects.get(pk=job.pk).state == "failed"


def test_the_workers_page_shows_only_the_jobs_the_user_may_open(staff):
    queue = JobFactory(state="processing", progress={"text": "queue-checkin"})
    report = ReportJob.objects.create(
        tenant="t", state="processing", progress={"text": "report-checkin"}
    )
    # Not among the rows ManagedJob's admin gives (its default manager hides it).
    hidden = ManagedJob.objects.create(
        state="processing", hidden=True, progress={"text": "hidden-checkin"}
    )
    worker = worker_row(jobs=[label(queue), label(report), label(hidden)], num_jobs=3)
    reader = staff("view_workerprocess", "view_queuejob", "view_managedjob")
    with CaptureQueriesContext(connection) as queries:
        page = reader.get(change_of(worker)).content.decode()
    assert "queue-checkin" in page
    assert change_of(queue) in page
    assert "report-checkin" not in page
    assert "testapp.ReportJob" not in page
    assert "hidden-checkin" not in page
    assert change_of(hidden) not in page
    assert "2 job(s) you may not view" in page
    assert [q["sql"] for q in queries if "testapp_reportjob" in q["sql"].lower()] == []

    page = staff("view_workerprocess").get(change_of(worker)).content.decode()
    assert "checkin" not in page
    assert "3 job(s) you may not view" in page


def test_the_schedules_page_reads_no_job_of_a_model_the_user_may_not_view(staff):
    report = ReportJob.objects.create(tenant="t", state="failed")
    schedule = Schedule.objects.create(
        name="reports", expression="0 3 * * *", target="t", last_job=label(report)
    )
    viewer = staff("view_schedule")
    for url in (SCHEDULES, change_of(schedule)):
        with CaptureQueriesContext(connection) as queries:
            page = viewer.get(url).content.decode()
        assert [q["sql"] for q in queries if "testapp_reportjob" in q["sql"].lower()] == []
        assert "failed" not in page
        assert change_of(report) not in page

    reader = staff("view_schedule", "view_reportjob")
    page = reader.get(SCHEDULES).content.decode()
    assert ">failed<" in page
    assert change_of(report) in page
    report.delete()
    assert "not found (deleted?)" in reader.get(SCHEDULES).content.decode()


# -- 4. registry names are labels --------------------------------------------------------

BAIT = "tests.testapp.registry_bait"


class Built(h.BehaviorHandler):
    """Counts how often it is built (a registry row names it)."""

    made = 0

    def __init__(self, **options):
        Built.made += 1
        super().__init__(**options)


def test_no_admin_page_imports_or_builds_what_the_worker_registry_names(admin_client):
    sys.modules.pop(BAIT, None)
    Built.made = 0
    names = [f"{BAIT}.Bait", f"{__name__}.Built"]
    job = JobFactory(state="processing")
    queued = JobFactory()
    worker = worker_row(handlers=names, jobs=[label(job)], num_jobs=1)
    Schedule.objects.create(name="nightly", expression="0 3 * * *", target=names[0])
    # A task run's row names its task too: its page does not import it either.
    task = TaskJob.objects.create(task_path=f"{BAIT}.task", state="failed")
    pages = [
        change_of(task),
        changelist_of(QueueJob),
        reverse("admin:testapp_queuejob_dashboard"),
        change_of(job),
        change_of(queued),
        operation(queued.pk, "live"),
        operation(queued.pk, "cancel"),
        change_of(worker),
        f"{PAUSES}add/",
        SCHEDULES,
        f"{SCHEDULES}{Schedule.objects.get().pk}/delete/",
    ]
    for url in pages:
        assert admin_client.get(url).status_code == 200, url
    # A registry name is still a name to pause by: a label, not code.
    assert admin_client.post(f"{PAUSES}add/", {"name": names[0]}).status_code == 302
    call_command("dbworker", "pause", names[1])
    assert set(Pause.objects.values_list("name", flat=True)) == set(names)
    assert BAIT not in sys.modules
    assert Built.made == 0


# -- 7. deleting a schedule ----------------------------------------------------------------


def delete_url(schedule):
    return reverse("admin:django_dbworker_schedule_delete", args=[schedule.pk])


class Retired(h.BehaviorHandler):
    schedules = [Periodic("0 3 * * *", name="retired-report")]


def ticks():
    return QueueJob.objects.filter(behavior="tick").count()


def stop(worker):
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_schedule_declared_in_code_is_switched_off_not_deleted(admin_client, settings, spawn):
    """Deleted, a switched-off schedule came back switched on with the next worker, and
    nothing in the audit trail said so. It is refused, with the reason; the switch-off
    holds through the next worker's passes."""
    settings.DBWORKER = {**settings.DBWORKER, "HANDLERS": [SCHEDULED]}
    stop_first = spawn("runworker", SCHEDULED)
    wait_until(lambda: ticks() > 0, 30, message="a first tick")
    stop(stop_first)
    schedule = Schedule.objects.get(name="every-second")
    act(admin_client, SCHEDULES, "disable_selected", [schedule])
    refused = admin_client.post(delete_url(schedule), {"post": "yes"}).content.decode()
    assert f"every-second: declared in code by {SCHEDULED}" in refused
    act(admin_client, SCHEDULES, "delete_selected", [schedule], post="yes")
    assert Schedule.objects.filter(name="every-second", enabled=False).exists()
    assert trail() == [("admin", "disable schedule", "every-second")]

    before = ticks()
    # The next worker's first pass prunes this old tick record, then syncs the schedules.
    old = ScheduleTick.objects.create(
        schedule="every-second", tick=timezone.now() - datetime.timedelta(days=2)
    )
    worker = spawn("runworker", SCHEDULED)
    wait_until(
        lambda: not ScheduleTick.objects.filter(pk=old.pk).exists(),
        30,
        message="the next worker's first pass",
    )
    wait_until(lambda: Schedule.objects.filter(name="every-second").exists(), 10)
    time.sleep(1.5)  # a tick's time: a schedule registered again would have run
    assert not Schedule.objects.get(name="every-second").enabled
    assert ticks() == before
    # The same row is the one that worker follows: switched on, it ticks again.
    act(admin_client, SCHEDULES, "enable_selected", [schedule])
    wait_until(lambda: ticks() > before, 30, message="a tick after switching on")
    stop(worker)


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_schedule_no_worker_declares_is_deleted_and_audited(admin_client, settings, spawn):
    settings.DBWORKER = {**settings.DBWORKER, "HANDLERS": [SCHEDULED]}
    Scheduler([Retired()])._pass(timezone.now())  # a handler since removed from the code
    retired = Schedule.objects.get(name="retired-report")
    assert admin_client.post(delete_url(retired), {"post": "yes"}).status_code == 302
    assert not Schedule.objects.filter(name="retired-report").exists()
    assert trail() == [("admin", "delete schedule", "retired-report")]
    worker = spawn("runworker", SCHEDULED)
    wait_until(lambda: ticks() > 0, 30, message="the worker's schedule")
    stop(worker)
    assert list(Schedule.objects.values_list("name", flat=True)) == ["every-second"]


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_a_schedule_whose_handler_a_live_worker_runs_is_not_deleted(admin_client, spawn):
    """The handler is not in DBWORKER["HANDLERS"] (the worker was given it on its command
    line): the admin cannot read its schedules, and keeps them while it runs."""
    worker = spawn("runworker", SCHEDULED)
    wait_until(lambda: ticks() > 0, 30, message="a first tick")
    schedule = Schedule.objects.get(name="every-second")
    refused = admin_client.post(delete_url(schedule), {"post": "yes"}).content.decode()
    assert f"a live worker runs {SCHEDULED}" in refused
    assert Schedule.objects.filter(pk=schedule.pk).exists()
    assert trail() == []
    stop(worker)  # removes its registry row
    assert admin_client.post(delete_url(schedule), {"post": "yes"}).status_code == 302
    assert trail() == [("admin", "delete schedule", "every-second")]


# -- 11. search ------------------------------------------------------------------------------

NUMBER = "9" * 5000


def test_no_search_of_any_admin_of_the_package_fails(admin_client):
    JobFactory(state="failed", failure_message=f"E=mc² {NUMBER}")
    failing = []
    for term in ("²", NUMBER, "١٢٣", "1" * 30, "-1", "1e3"):
        for model in package_admins():
            response = admin_client.get(changelist_of(model), {"q": term})
            if response.status_code != 200:
                failing.append((model._meta.label, term[:10], response.status_code))
    assert failing == []


def test_a_number_that_is_no_job_id_is_searched_as_words(admin_client):
    squared = JobFactory(state="failed", failure_message="ValueError: x² is negative")
    long = JobFactory(state="failed", failure_message=f"OverflowError: {NUMBER}")

    def found(term):
        response = admin_client.get(changelist_of(QueueJob), {"q": term})
        assert response.status_code == 200
        return [job.pk for job in response.context["cl"].result_list]

    assert found("x²") == [squared.pk]
    assert found(NUMBER) == [long.pk]
    assert found(str(long.pk)) == [long.pk]
    assert found("1" * 30) == []  # an id no job has (past any key's range)
