"""Several databases (docs/operations.md § Several databases): job models routed to two
PostgreSQL servers (tests/routers.py: TenantJob, ReportJob and the tasks' TaskJob on the
suite's own second server, tests/clusters.py; QueueJob on ``default``). One worker
serves both; each row the package keeps about a job table lives in that table's
database: pauses, rate buckets, schedules and their ticks, the audit trail of those, the
statistics, the worker registry. Workers run in this process; tests/chaos/test_multidb.py
kills a server under a ``runworker``."""

import datetime
import io
import logging
import time

import pytest
from django.core.management import call_command
from django.db import connections
from django.urls import reverse
from django.utils import timezone

from django_dbworker import Periodic
from django_dbworker.admin.dashboard import dashboard
from django_dbworker.admin.explain import explain
from django_dbworker.admin.serving import serving
from django_dbworker.control.models import AuditEntry, Pause, RateBucket, Schedule, ScheduleTick
from django_dbworker.control.pause import pause, paused, resume
from django_dbworker.control.schedules import set_schedule_enabled
from django_dbworker.maintenance.resetter import Resetter
from django_dbworker.maintenance.retention import Retention
from django_dbworker.maintenance.scheduler import Scheduler
from django_dbworker.models import WorkerProcess
from django_dbworker.stats import JobStats
from tests.conftest import wait_until
from tests.routers import SECOND, SecondRouter
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob, ReportJob, TenantJob

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "second"]),
    pytest.mark.postgres,
    pytest.mark.usefixtures("second_database"),
    # One second server per run of the suite: these tests go to one xdist process.
    pytest.mark.xdist_group("second_cluster"),
]


def states(model, using=None):
    rows = model.objects.using(using) if using else model.objects
    return sorted(rows.values_list("state", flat=True))


def on(alias, model, **filters):
    return model.objects.using(alias).filter(**filters)


class SecondReports(h.ReportHandler):
    """Report jobs (on ``second``), every second by cron."""

    name = "second-reports"
    num_handlers = 2
    schedules = [Periodic("* * * * * *", fields={"tenant": "cron"}, name="second-cron")]


class FailingAfterInsert(SecondReports):
    """Its scheduled job is inserted, then the enqueue fails: the tick must roll back
    with it."""

    def enqueue_scheduled(self, periodic):
        super().enqueue_scheduled(periodic)
        raise RuntimeError("failed after the insert")


def test_one_worker_serves_both_databases_and_registers_in_each(run_worker):
    """The registry row of a worker is in each database it claims from, listing the
    handlers of that database: the resetter, the consumers and "why is this job not
    running?" of a database read its own registry. Statistics go beside their jobs."""
    QueueJob.objects.bulk_create(QueueJob() for _ in range(5))
    TenantJob.objects.bulk_create(TenantJob(tenant=i) for i in range(5))
    assert not on("default", TenantJob).exists()
    tw = run_worker([h.BehaviorHandler(), h.LimitedHandler()])
    wait_until(lambda: states(QueueJob) == ["completed"] * 5, 20)
    wait_until(lambda: states(TenantJob) == ["completed"] * 5, 20)
    rows = {alias: list(on(alias, WorkerProcess)) for alias in ("default", "second")}
    assert [w.handlers for w in rows["default"]] == [[h.BehaviorHandler().get_name()]]
    assert [w.handlers for w in rows["second"]] == [[h.LimitedHandler().get_name()]]
    assert list(rows["second"][0].tables) == ["testapp.TenantJob"]
    assert tw.stop() == 0
    assert not WorkerProcess.objects.using("second").exists()  # a clean exit leaves both
    models = {a: set(on(a, JobStats).values_list("model", flat=True)) for a in rows}
    assert models == {"default": {"testapp.QueueJob"}, "second": {"testapp.TenantJob"}}


def test_a_pause_lives_with_its_jobs_and_holds_their_claims(run_worker, settings):
    """A pause is a condition of the claim statement: it must be in the jobs' database
    (of a handler the settings or a live worker name)."""
    handler = h.LimitedHandler()
    settings.DBWORKER = {**settings.DBWORKER, "HANDLERS": [handler.get_name()]}
    assert pause(handler.get_name(), by="ops") is True
    assert on("second", Pause, name=handler.get_name()).exists()
    assert list(on("second", AuditEntry).values_list("action", "target")) == [
        ("pause", handler.get_name())
    ]
    assert set(paused()) == {handler.get_name()}
    TenantJob.objects.bulk_create(TenantJob(tenant=i) for i in range(3))
    QueueJob.objects.create()
    tw = run_worker([h.BehaviorHandler(), handler])
    wait_until(lambda: states(QueueJob) == ["completed"], 10)
    time.sleep(0.5)  # several claim intervals
    assert states(TenantJob) == ["queued"] * 3
    assert resume(handler.get_name(), by="ops") is True
    wait_until(lambda: states(TenantJob) == ["completed"] * 3, 10)
    assert tw.stop() == 0
    assert not Pause.objects.using("default").exists()


def test_a_paused_task_queue_on_the_second_database(run_worker):
    """The tasks backend's jobs live where the router puts TaskJob, and so do the pauses
    of its queues; results are read from there."""
    from django_dbworker.tasks.handler import task_handlers
    from django_dbworker.tasks.models import TaskJob
    from tests.testapp import tasks as t

    pause("tasks:default:emails", by="ops")
    assert on("second", Pause, name="tasks:default:emails").exists()
    email, total = t.send_welcome.enqueue(5), t.add.enqueue(2, 3)
    assert on("second", TaskJob).count() == 2
    assert not on("default", TaskJob).exists()
    tw = run_worker(task_handlers())
    wait_until(lambda: total.refresh() or total.status == "SUCCESSFUL", 10)
    assert total.return_value == 5
    time.sleep(0.5)
    assert on("second", TaskJob, result_id=email.id).get().state == "queued"
    resume("tasks:default:emails")
    wait_until(lambda: email.refresh() or email.status == "SUCCESSFUL", 10)
    assert tw.stop() == 0


def test_rate_and_key_limits_spend_the_buckets_of_the_jobs_database(run_worker):
    TenantJob.objects.bulk_create(TenantJob(tenant=i % 2) for i in range(6))
    tw = run_worker(h.KeyRateLimitedHandler())
    wait_until(lambda: states(TenantJob) == ["completed"] * 6, 20)
    assert tw.stop() == 0
    assert set(on("second", RateBucket).values_list("key", flat=True)) <= {"0", "1"}
    assert not RateBucket.objects.using("default").exists()


def test_a_ticks_record_commits_with_its_job_on_the_jobs_database():
    """The tick's record, the job and the schedule's move are one transaction: in the
    job table's database. A failure after the job's insert leaves neither."""
    now = timezone.now()
    Scheduler([FailingAfterInsert()])._pass(now)
    Scheduler([FailingAfterInsert()])._pass(now + datetime.timedelta(seconds=2))
    assert not on("second", ReportJob).exists()
    assert not ScheduleTick.objects.using("default").exists()
    Scheduler([SecondReports()])._pass(now + datetime.timedelta(seconds=4))
    job = on("second", ReportJob, tenant="cron").get()  # later ticks: its key is held
    made = set(on("second", ScheduleTick).exclude(job="").values_list("job", flat=True))
    assert made == {f"testapp.ReportJob:{job.pk}"}
    assert on("second", Schedule, name="second-cron").get().last_tick is not None
    assert not Schedule.objects.using("default").exists()
    assert set_schedule_enabled("second-cron", False, by="ops") is True
    assert on("second", Schedule, name="second-cron").get().enabled is False
    assert on("second", AuditEntry, target="second-cron").exists()


def test_a_held_unique_key_is_found_on_the_jobs_database(caplog):
    """A tick whose job's unique key is held is skipped, naming the job that holds it."""
    holder, created = ReportJob.objects.enqueue_unique(tenant="cron")
    assert created
    assert holder._state.db == "second"
    assert ReportJob.objects.enqueue_unique(tenant="cron") == (holder, False)
    caplog.set_level(logging.INFO, "django_dbworker.scheduler")
    scheduler = Scheduler([SecondReports()])
    scheduler._pass(timezone.now())
    scheduler._pass(timezone.now() + datetime.timedelta(seconds=2))
    assert on("second", ReportJob).count() == 1
    assert f"held by testapp.ReportJob:{holder.pk}" in caplog.text
    assert on("second", Schedule, name="second-cron").get().skipped_ticks >= 1


def test_retention_deletes_on_the_jobs_database():
    old = timezone.now() - datetime.timedelta(days=2)
    TenantJob.objects.bulk_create(TenantJob(state="completed", finished_at=old) for _ in range(3))
    TenantJob.objects.create()
    handler = h.LimitedHandler(retention={"completed": datetime.timedelta(days=1)})
    retention = Retention([handler])
    try:
        retention.run_once()
    finally:
        retention.close()
    assert states(TenantJob, "second") == ["queued"]


def test_why_not_running_the_dashboard_and_the_status_read_the_jobs_database(run_worker, settings):
    # The admin knows the handlers the settings name (the registry's names are labels).
    settings.DBWORKER = {**settings.DBWORKER, "HANDLERS": ["tests.testapp.handlers.LimitedHandler"]}
    handler = h.LimitedHandler()
    name = handler.get_name()
    tw = run_worker(handler)
    job = TenantJob.objects.create(tenant=1)
    wait_until(lambda: states(TenantJob) == ["completed"], 10)
    pause(name, by="ops")
    waiting = TenantJob.objects.create(tenant=2)
    codes = [r.code for r in explain(waiting, serving(TenantJob))]
    assert "paused" in codes, codes
    assert "no_live_worker" not in codes, codes
    wait_until(lambda: on("second", JobStats).exists(), 10, message="the statistics")
    [row] = dashboard(TenantJob, serving(TenantJob)).rows
    assert row.name == name
    assert row.queued == 1
    out = io.StringIO()
    call_command("dbworker_status", stdout=out)
    assert f"paused: {name}" in out.getvalue()
    assert "1 worker process(es) registered" in out.getvalue()
    assert tw.stop() == 0
    assert job.pk


def test_the_resetter_of_one_database_goes_on_while_the_other_is_down(second_cluster, caplog):
    """A resetter serving both databases resets the stalled jobs of ``default`` while
    ``second`` is out of reach, and says so."""
    old = timezone.now() - datetime.timedelta(minutes=5)
    stalled = QueueJob.objects.create(
        state="processing", worker_hostname="gone:1:abc", started_at=old, last_heartbeat_at=old
    )
    resetter = Resetter([h.LimitedHandler(), h.BehaviorHandler()])
    second_cluster.crash()
    try:
        resetter.run_once()
        assert QueueJob.objects.get(pk=stalled.pk).state == "queued"
        assert "resetter: database 'second' failed" in caplog.text
    finally:
        resetter.close()
        second_cluster.start()
        second_cluster.wait_ready()
        connections["second"].close()


class NothingOfOursOnSecond(SecondRouter):
    """Sends the routed job models to ``second`` but keeps the package's tables off it."""

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        if app_label == "django_dbworker":
            return db != SECOND
        return super().allow_migrate(db, app_label, model_name, **hints)


def test_a_job_database_without_the_packages_tables_is_refused(settings):
    """dbworker.E015: a claim there would fail on the missing pause table at each try."""
    from django_dbworker.databases import check_tables_beside_jobs

    assert check_tables_beside_jobs() == []
    settings.DATABASE_ROUTERS = [f"{__name__}.NothingOfOursOnSecond"]
    [error] = check_tables_beside_jobs()
    assert error.id == "dbworker.E015"
    jobs = "dbworker_tasks.TaskJob, testapp.ReportJob, testapp.TenantJob"
    assert error.msg.startswith(f"{jobs}: jobs in database 'second', where the router's")
    assert "migrate --database second" in error.hint


def test_the_admin_lists_and_opens_the_rows_of_each_database(admin_client, settings):
    """The package's lists offer each database's rows (a "database" filter), and a row's
    page reads the database its list showed: ids repeat across databases."""
    limited = h.LimitedHandler().get_name()
    settings.DBWORKER = {**settings.DBWORKER, "HANDLERS": [limited]}
    pauses = reverse("admin:django_dbworker_pause_changelist")
    response = admin_client.post(
        reverse("admin:django_dbworker_pause_add"), {"name": limited, "reason": "r"}
    )
    assert response.status_code == 302
    assert on("second", Pause, name=limited).exists()

    def listed(url):
        return [str(p) for p in admin_client.get(url).context["cl"].result_list]

    assert listed(pauses) == []
    assert listed(f"{pauses}?database=second") == [limited]
    now = timezone.now()
    for alias in ("default", "second"):
        WorkerProcess.objects.using(alias).create(
            id=7, worker_id=f"on-{alias}", hostname="h", pid=1, started_at=now,
            last_heartbeat_at=now,
        )  # fmt: skip
    page = reverse("admin:django_dbworker_workerprocess_change", args=[7])
    assert "on-default" in admin_client.get(page).content.decode()
    listed = admin_client.get(f"{page}?_changelist_filters=database%3Dsecond").content.decode()
    assert "on-second" in listed
    assert "on-default" not in listed
    pk = on("second", Pause, name=limited).get().pk
    admin_client.post(
        f"{pauses}?database=second", {"action": "resume_selected", "_selected_action": [pk]}
    )
    assert not Pause.objects.using("second").exists()


def test_the_metrics_read_the_registry_and_schedules_of_every_database():
    from django_dbworker.contrib.prometheus_gauges import live_workers_family, schedule_families

    limited, behavior = h.LimitedHandler().get_name(), h.BehaviorHandler().get_name()
    now = timezone.now()
    for alias, name in (("default", behavior), ("second", limited)):
        WorkerProcess.objects.using(alias).create(
            worker_id="w:1:a", hostname="w", pid=1, handlers=[name], started_at=now,
            last_heartbeat_at=now,
        )  # fmt: skip
    Schedule.objects.using("second").create(name="second-cron", target=limited, skipped_ticks=4)
    [family] = live_workers_family([limited, behavior])
    assert {s.labels["handler"]: s.value for s in family.samples} == {limited: 1, behavior: 1}
    [ticks] = schedule_families()
    assert [(s.labels["schedule"], s.value) for s in ticks.samples] == [("second-cron", 4.0)]
