"""Operator controls with real workers: pause and resume, unique jobs, periodic
schedules (issue 12). The same tests on SQLite and PostgreSQL."""

import datetime
import itertools
import threading
import time

import django
import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, models, transaction
from django.test import override_settings
from django.utils import timezone

from django_dbworker import Periodic, period_key
from django_dbworker.checks import validate_handler
from django_dbworker.control.models import AuditEntry, Pause, Schedule, ScheduleTick
from django_dbworker.control.pause import pause, paused, resume
from django_dbworker.control.schedules import set_schedule_enabled
from django_dbworker.control.unique import add_missing_unique_indexes
from django_dbworker.maintenance.scheduler import Scheduler
from django_dbworker.operations import retry
from django_dbworker.states import JobState
from tests.conftest import assert_no_claim_began_after, database_now, wait_until
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob, ReportJob

pytestmark = pytest.mark.django_db(transaction=True)

UTC = datetime.UTC
ACTIVE = ["queued", "processing", "errored"]
ACTIVE_ONCE = "testapp_report_active_once"


def states(model=ReportJob, **filters):
    return sorted(model.objects.filter(**filters).values_list("state", flat=True))


# -- pause and resume ----------------------------------------------------------------


def test_a_paused_handler_claims_nothing_and_resume_drains_it(run_worker):
    handler = h.ReportHandler()
    assert pause(handler.get_name(), by="ops", reason="deploy") is True
    assert pause(handler.get_name()) is False  # paused already
    for i in range(6):
        ReportJob.objects.create(tenant=f"t{i}")
    tw = run_worker(handler)
    time.sleep(1.0)  # several claim intervals
    assert states() == ["queued"] * 6
    assert resume(handler.get_name(), by="ops") is True
    wait_until(lambda: states() == ["completed"] * 6, 10, message="the drain after resume")
    assert tw.stop() == 0
    trail = list(AuditEntry.objects.order_by("id").values_list("actor", "action", "target"))
    assert trail == [("ops", "pause", handler.get_name()), ("ops", "resume", handler.get_name())]
    assert resume(handler.get_name()) is False


def test_pausing_one_queue_leaves_the_others_running(run_worker):
    handler = h.ReportHandler()
    pause(f"{handler.get_name()}:slow")
    for i in range(3):
        ReportJob.objects.create(tenant=f"s{i}", queue="slow")
        ReportJob.objects.create(tenant=f"f{i}", queue="fast")
    tw = run_worker(handler)
    wait_until(lambda: states(queue="fast") == ["completed"] * 3, 10, message="the fast queue")
    time.sleep(0.5)
    assert states(queue="slow") == ["queued"] * 3
    resume(f"{handler.get_name()}:slow")
    wait_until(lambda: states(queue="slow") == ["completed"] * 3, 10, message="the slow queue")
    assert tw.stop() == 0


def test_a_pause_lets_running_jobs_finish_and_stops_claims_at_once(run_worker):
    """The pause is part of the claim statement: no claim that starts after the pause
    commits takes a job; jobs already running finish."""
    handler = h.ReportHandler(num_handlers=2, prefetch=2)
    for i in range(200):
        ReportJob.objects.create(tenant=f"t{i}", payload={"seconds": 0.02})
    tw = run_worker(handler)
    wait_until(lambda: ReportJob.objects.filter(state="completed").count() >= 20, 20)
    pause(handler.get_name())
    paused_at = database_now()
    wait_until(lambda: not ReportJob.objects.filter(state="processing").exists(), 10)
    time.sleep(0.5)
    assert_no_claim_began_after(paused_at, ReportJob, in_flight=2 + 2)
    left = ReportJob.objects.filter(state="queued").count()
    assert left > 0
    resume(handler.get_name())
    wait_until(lambda: states() == ["completed"] * 200, 30, message="the rest of the drain")
    assert tw.stop() == 0


def test_the_dbworker_command_pauses_lists_and_resumes(capsys, settings):
    settings.DBWORKER = {"HANDLERS": [REPORTS]}
    call_command("dbworker", "pause", REPORTS, "--reason", "maintenance window")
    call_command("dbworker", "paused")
    out = capsys.readouterr().out
    assert f"{REPORTS}: paused" in out
    assert f"{REPORTS}  since" in out
    assert "(maintenance window)" in out
    assert set(paused()) == {REPORTS}
    call_command("dbworker", "resume", REPORTS)
    assert f"{REPORTS}: resumed" in capsys.readouterr().out
    assert not Pause.objects.exists()
    actions = list(AuditEntry.objects.order_by("id").values_list("action", "detail"))
    assert actions == [("pause", "command: maintenance window"), ("resume", "command")]


REPORTS = "tests.testapp.handlers.ReportHandler"


def test_the_dbworker_command_refuses_to_pause_a_name_nothing_has(capsys, settings):
    """A mistyped name used to print "paused" and pause nothing."""
    settings.DBWORKER = {"HANDLERS": [REPORTS]}
    with pytest.raises(CommandError, match=f"did you mean '{REPORTS}'"):
        call_command("dbworker", "pause", REPORTS.replace("Report", "Reprot"))
    with pytest.raises(CommandError, match="did you mean 'tasks:default:emails'"):
        call_command("dbworker", "pause", "tasks:default:emials")
    assert not Pause.objects.exists()
    # A queue of a handler with a queue_field, a task queue, and (--force) a name no
    # worker has run yet are paused.
    for args in (
        [f"{REPORTS}:reports-eu"],
        ["tasks:default:emails"],
        ["myapp.NotRunYet", "--force"],
    ):
        call_command("dbworker", "pause", *args)
    assert set(paused()) == {f"{REPORTS}:reports-eu", "tasks:default:emails", "myapp.NotRunYet"}
    call_command("dbworker", "resume", "tasks:default:email")
    assert "was not paused (did you mean 'tasks:default:emails'?)" in capsys.readouterr().out


# -- unique jobs ---------------------------------------------------------------------


def test_enqueue_unique_skips_or_replaces_while_a_job_holds_the_key(run_worker):
    first, created = ReportJob.objects.enqueue_unique(tenant="acme", payload={"v": 1})
    assert created
    again, created = ReportJob.objects.enqueue_unique(tenant="acme", payload={"v": 2})
    assert (again.pk, created, again.payload) == (first.pk, False, {"v": 1})
    replaced, created = ReportJob.objects.enqueue_unique(
        tenant="acme", payload={"v": 3}, on_conflict="replace"
    )
    assert (replaced.pk, created, replaced.payload) == (first.pk, False, {"v": 3})
    other, created = ReportJob.objects.enqueue_unique(tenant="acme", kind="weekly")
    assert created  # another key
    assert other.pk != first.pk
    tw = run_worker(h.ReportHandler())
    wait_until(lambda: states() == ["completed"] * 2, 10)
    assert tw.stop() == 0
    later, created = ReportJob.objects.enqueue_unique(tenant="acme")
    assert created  # finished jobs hold no key
    assert later.pk not in (first.pk, other.pk)


def test_replace_leaves_a_running_job_alone(run_worker):
    job, _ = ReportJob.objects.enqueue_unique(tenant="acme", payload={"seconds": 2})
    tw = run_worker(h.ReportHandler())
    wait_until(lambda: states() == ["processing"], 10)
    held, created = ReportJob.objects.enqueue_unique(
        tenant="acme", payload={"seconds": 0}, on_conflict="replace"
    )
    assert (held.pk, created, held.payload) == (job.pk, False, {"seconds": 2})
    assert tw.stop() == 0


def test_enqueue_unique_inside_a_transaction_rolls_back_with_it():
    with transaction.atomic():
        ReportJob.objects.create(tenant="other")
        _, created = ReportJob.objects.enqueue_unique(tenant="acme")
        _, again = ReportJob.objects.enqueue_unique(tenant="acme")
        transaction.set_rollback(True)
    assert (created, again) == (True, False)
    assert not ReportJob.objects.exists()
    _, created = ReportJob.objects.enqueue_unique(tenant="acme")
    assert created


def test_a_period_key_keeps_one_job_per_period_whatever_its_state():
    hour = datetime.timedelta(hours=1)
    at = datetime.datetime(2026, 11, 23, 10, 59, 59, tzinfo=UTC)
    key = period_key(hour, at)
    assert key == "2026-11-23T10:00:00+00:00"
    job, created = ReportJob.objects.enqueue_unique(tenant="acme", kind="a", hour=key)
    ReportJob.objects.filter(pk=job.pk).update(state="completed")
    _, again = ReportJob.objects.enqueue_unique(tenant="acme", kind="b", hour=key)
    next_hour = period_key(hour, at + datetime.timedelta(seconds=1))
    _, later = ReportJob.objects.enqueue_unique(tenant="acme", kind="c", hour=next_hour)
    assert (created, again, later) == (True, False, True)


def test_enqueue_unique_without_a_constraint_says_what_to_add():
    with pytest.raises(ValueError, match="unique_job_constraint"):
        QueueJob.objects.enqueue_unique(behavior="ok")
    with pytest.raises(ValueError, match="on_conflict"):
        ReportJob.objects.enqueue_unique(tenant="x", on_conflict="merge")


def test_two_enqueuers_of_one_key_at_once_make_one_job():
    """The second insert waits for the first's uncommitted row on the unique index over
    active jobs (partial on PostgreSQL and SQLite, generated key columns on MariaDB),
    then gets the first's job: no read-then-write race makes two."""
    inserted, done = threading.Event(), {}

    def enqueue(name, **fields):
        try:
            with transaction.atomic():
                done[name] = ReportJob.objects.enqueue_unique(tenant="acme", **fields)
                inserted.set()
                if name == "first":
                    time.sleep(0.5)  # uncommitted while the second one inserts
                    # Taken before the commit: after it, a loaded host may run the
                    # woken second thread first (seen in CI, 0.2 s).
                    done["first commits"] = time.monotonic()
            done[f"{name} at"] = time.monotonic()
        finally:
            connection.close()

    first = threading.Thread(target=enqueue, args=("first",))
    first.start()
    assert inserted.wait(10)
    inserted.clear()
    second = threading.Thread(target=enqueue, args=("second",), kwargs={"payload": {"v": 2}})
    second.start()
    first.join(20)
    second.join(20)
    (job, created), (again, created_again) = done["first"], done["second"]
    assert (created, created_again, again.pk, again.payload) == (True, False, job.pk, {})
    assert done["second at"] >= done["first commits"]  # it waited for the first to commit
    assert ReportJob.objects.count() == 1


def test_a_finished_job_frees_its_key_and_its_retry_is_refused_while_the_key_is_held():
    failed, _ = ReportJob.objects.enqueue_unique(tenant="acme")
    ReportJob.objects.filter(pk=failed.pk).update(state="failed")
    holder, created = ReportJob.objects.enqueue_unique(tenant="acme")
    assert created
    with pytest.raises(IntegrityError), transaction.atomic():  # a second active one
        ReportJob.objects.create(tenant="acme")
    assert retry(ReportJob.objects.filter(pk=failed.pk)) == ([], {failed.pk: holder.pk})
    ReportJob.objects.filter(pk=holder.pk).update(state="completed")
    assert retry(ReportJob.objects.filter(pk=failed.pk)) == ([failed.pk], {})
    assert states() == ["completed", "queued"]


def test_keys_of_several_fields_collide_only_when_every_field_does():
    for tenant, kind in (
        ("a", "bc"),
        ("ab", "c"),
        ("a", "b"),
        ("b", "a"),
        ("a-b", ""),
        ("A", "bc"),
    ):
        assert ReportJob.objects.enqueue_unique(tenant=tenant, kind=kind)[1]
    assert not ReportJob.objects.enqueue_unique(tenant="a", kind="bc")[1]
    assert ReportJob.objects.count() == 6


def test_a_unique_job_constraint_is_djangos_to_migrations():
    """Migrations written with ``models.UniqueConstraint`` (before it was a class of its
    own) see no change: the constraints are equal."""
    from django_dbworker import unique_job_constraint

    ours = unique_job_constraint("tenant", "kind", name="x")
    assert ours == models.UniqueConstraint(
        fields=["tenant", "kind"], condition=models.Q(state__in=ACTIVE), name="x"
    )
    assert ours.deconstruct()[0] == "django_dbworker.control.unique.UniqueJobConstraint"
    # Made on every database: no "MariaDB does not support unique constraints with
    # conditions" (models.W036) from the checks (Django >= 6.0: 5.2 checks constraints
    # in the model's checks).
    if django.VERSION >= (6, 0):
        assert ours.check(ReportJob, connection) == []


def test_a_unique_index_a_table_lacks_is_added_by_the_upgrade_helper():
    """A table migrated while ``unique_job_constraint`` gave a plain ``UniqueConstraint``
    has no index on MariaDB (Django created nothing): ``add_missing_unique_indexes``
    adds it, and only what is missing."""
    [constraint] = [c for c in ReportJob._meta.constraints if c.name == ACTIVE_ONCE]
    with connection.schema_editor() as editor:
        editor.remove_constraint(ReportJob, constraint)
    try:
        ReportJob.objects.create(tenant="acme")
        ReportJob.objects.create(tenant="globex")
        with connection.schema_editor() as editor:
            assert add_missing_unique_indexes(ReportJob, editor) == [ACTIVE_ONCE]
            assert add_missing_unique_indexes(ReportJob, editor) == []
    finally:
        with connection.cursor() as cursor:
            present = connection.introspection.get_constraints(cursor, ReportJob._meta.db_table)
        if ACTIVE_ONCE not in present:
            with connection.schema_editor() as editor:
                editor.add_constraint(ReportJob, constraint)
    assert not ReportJob.objects.enqueue_unique(tenant="acme")[1]
    # What the index needs is out of sight of SELECT * (MariaDB: invisible columns).
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {ReportJob._meta.db_table}")
        columns = [d[0] for d in cursor.description]
    assert sorted(columns) == sorted(str(f.column) for f in ReportJob._meta.concrete_fields)


def test_a_unique_key_is_held_while_active_or_while_waiting_only():
    """A key is held in every active state, or while the job waits only (queued, maybe
    errored: gocraft's unique jobs, issue 42): a job coming back to waiting while
    another one holds it is then superseded (tests/test_waiting_keys.py). A key held
    while running but not waiting, or while errored but not queued, is refused."""
    from django_dbworker import unique_job_constraint

    for states in (["processing"], ["queued", "processing"], ["errored"], ["completed"]):
        with pytest.raises(ValueError, match="waiting-only"):
            unique_job_constraint("tenant", name="x", states=states)
    for states in (
        None,
        ["queued"],
        ["queued", "errored"],
        ["queued", "processing", "errored"],
        [*JobState.values],
    ):
        assert unique_job_constraint("tenant", name="x", states=states).name == "x"


def test_the_check_warns_when_the_constraint_a_handler_relies_on_is_missing():
    class Unkeyed(h.BehaviorHandler):
        unique_by = ("behavior",)

    messages = [m for m in validate_handler(Unkeyed) if m.id == "dbworker.W004"]
    assert len(messages) == 1
    assert "unique_job_constraint('behavior'" in messages[0].hint
    assert not [m for m in validate_handler(h.ReportHandler) if m.id == "dbworker.W004"]


# -- periodic schedules --------------------------------------------------------------


def at(seconds):
    return datetime.datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC) + datetime.timedelta(
        seconds=seconds
    )


def ticks_enqueued():
    return sorted(ScheduleTick.objects.values_list("tick", flat=True))


def test_two_schedulers_enqueue_each_tick_once():
    one, two = Scheduler([h.ScheduledHandler()]), Scheduler([h.ScheduledHandler()])
    one._pass(at(0.5))  # registers the schedule: its first tick is at(1)
    assert Schedule.objects.get().next_tick == at(1)
    two._pass(at(3.2))
    one._pass(at(3.4))
    one._pass(at(4.1))
    two._pass(at(4.2))
    assert ticks_enqueued() == [at(1), at(2), at(3), at(4)]
    assert QueueJob.objects.filter(behavior="tick").count() == 4
    row = Schedule.objects.get()
    assert (row.last_tick, row.next_tick) == (at(4), at(5))
    last = QueueJob.objects.order_by("-pk").first()
    assert row.last_job == f"testapp.QueueJob:{last.pk}"


@pytest.mark.parametrize(("missed", "expected"), [("run_once", 1), ("skip", 0)])
def test_after_downtime_a_schedule_runs_its_missed_tick_once_or_skips_it(missed, expected):
    class Hourly(h.BehaviorHandler):
        schedules = [Periodic("0 * * * *", fields={"behavior": "tick"}, missed=missed)]

    scheduler = Scheduler([Hourly()])
    scheduler._pass(at(0))
    scheduler._pass(at(5 * 3600 + 120))  # down for five ticks, the last 2 minutes ago
    assert QueueJob.objects.count() == expected
    assert Schedule.objects.get().next_tick == at(6 * 3600)
    scheduler._pass(at(6 * 3600 + 1))  # back in time for the next one
    assert QueueJob.objects.count() == expected + 1


def test_a_disabled_schedule_enqueues_nothing_and_resumes_at_its_next_tick():
    scheduler = Scheduler([h.ScheduledHandler()])
    scheduler._pass(at(0.5))
    assert set_schedule_enabled("every-second", False, by="ops") is True
    scheduler._pass(at(3.5))
    assert QueueJob.objects.count() == 0
    assert set_schedule_enabled("every-second", True, by="ops") is True
    scheduler._pass(at(60.5))  # starts afresh: the first tick after now
    scheduler._pass(at(62.5))
    assert ticks_enqueued() == [at(61), at(62)]
    actions = list(AuditEntry.objects.order_by("id").values_list("action", flat=True))
    assert actions == ["disable schedule", "enable schedule"]


def test_a_rolled_back_enqueue_leaves_the_tick_to_the_next_pass(monkeypatch):
    handler = h.ScheduledHandler()
    scheduler = Scheduler([handler])
    scheduler._pass(at(0.5))

    def broken(periodic):
        raise RuntimeError("the job could not be built")

    monkeypatch.setattr(handler, "enqueue_scheduled", broken)
    scheduler._pass(at(1.5))
    assert (ScheduleTick.objects.count(), QueueJob.objects.count()) == (0, 0)
    monkeypatch.undo()
    scheduler._pass(at(1.6))
    assert ticks_enqueued() == [at(1)]


def test_a_tick_that_falls_due_while_a_pass_runs_is_enqueued_by_the_next_pass_at_once():
    """A pass reads the clock once (``now``); a tick that comes due after that, while
    the pass runs, is left to the next pass, which must then come at once."""
    scheduler = Scheduler([h.ScheduledHandler()])
    now = timezone.now()
    started = now - datetime.timedelta(seconds=1.5)  # a pass that took 1.5 s, say
    # ticks after `started` are due by now
    assert scheduler._pass(started, read_at=time.monotonic() - 1.5) == 0.0
    scheduler._pass(now)
    due = [tick for tick in ticks_enqueued() if tick <= now]
    assert due
    assert due[-1] > started  # the tick that fell due during the first pass


def test_a_worker_enqueues_a_one_second_schedule_on_time(run_worker):
    tw = run_worker(h.ScheduledHandler())
    wait_until(lambda: QueueJob.objects.filter(state="completed").count() >= 3, 10)
    assert tw.stop() == 0
    ticks = ticks_enqueued()
    assert all(b - a == datetime.timedelta(seconds=1) for a, b in itertools.pairwise(ticks))
    enqueued = ScheduleTick.objects.values_list("tick", "enqueued_at")
    assert max((made - tick).total_seconds() for tick, made in enqueued) < 1.0


class Cleanup(h.BehaviorHandler):
    schedules = [Periodic("0 * * * *", name="cleanup")]


class OtherCleanup(h.ReportHandler):
    schedules = [Periodic("30 * * * *", name="cleanup")]


def test_schedule_names_are_the_projects_not_each_handlers(settings):
    """Two handlers with a schedule of one name each set the shared row back to their
    own next tick: neither ever came due. Refused by the check and by runworker."""
    from django.core import checks

    from django_dbworker.management.commands._options import load_handlers

    paths = ["tests.test_controls.Cleanup", "tests.test_controls.OtherCleanup"]
    settings.DBWORKER = {"HANDLERS": paths}
    [message] = checks.run_checks(tags=["dbworker"])
    assert message.id == "dbworker.W003"
    assert f"schedule 'cleanup' is declared by {paths[0]} and {paths[1]}" in message.msg
    with pytest.raises(CommandError, match=r"schedule 'cleanup' is declared by .*dbworker.E009"):
        load_handlers(paths)


def test_a_schedule_changed_during_a_rolling_deploy_keeps_ticking():
    """An old and a new worker declare a schedule differently: each pass of each set the
    row back to its own next tick (the ticks came late or never). The worker process
    that started last wins; the other leaves the schedule alone."""

    class Old(h.BehaviorHandler):
        schedules = [Periodic("* * * * * *", fields={"behavior": "tick"}, name="sync")]

    class New(h.BehaviorHandler):
        schedules = [Periodic("*/2 * * * * *", fields={"behavior": "tick"}, name="sync")]

    old, new = Scheduler([Old()]), Scheduler([New()])
    old._pass(at(0.5))  # the old fleet runs it
    old._pass(at(1.5))
    new._pass(at(1.7))  # a new worker starts: its declaration wins
    for second in range(2, 12):
        old._pass(at(second + 0.1))
        new._pass(at(second + 0.3))
    row = Schedule.objects.get()
    assert row.expression == "*/2 * * * * *"
    assert ticks_enqueued() == [at(1), *(at(t) for t in range(2, 12, 2))]
    # A worker that starts later still with the old declaration (a rollback) wins again.
    again = Scheduler([Old()])
    again._pass(at(12.5))
    new._pass(at(12.6))
    again._pass(at(13.1))
    assert Schedule.objects.get().expression == "* * * * * *"
    assert ticks_enqueued()[-1] == at(13)


def test_due_ticks_follow_the_databases_clock_not_the_workers(monkeypatch):
    """A worker whose clock ran 10 minutes ahead enqueued the ticks of the next 10
    minutes at once (and a behind one moved nothing): passes read the database's clock.
    (SQLite has no clock of its own: its file is on the workers' machine.)"""
    from django.db import connection

    from django_dbworker.maintenance import scheduler as module

    if connection.vendor == "sqlite":
        pytest.skip("SQLite: the database's clock is this machine's")

    class Ahead:
        @staticmethod
        def now():
            return timezone.now() + datetime.timedelta(minutes=10)

    # Whatever the scheduler would read this machine's clock through (nothing, now that
    # the clock is the dialect's: the pass must not move with it).
    monkeypatch.setattr(module, "timezone", Ahead, raising=False)
    ahead = Scheduler([h.ScheduledHandler()])
    # Passes over more than a second: the first one only declares the next tick (three
    # passes of MariaDB's few milliseconds each could all fall before it).
    for _ in range(4):
        ahead.run_once()
        time.sleep(0.4)
    now = database_now()
    assert ticks_enqueued()
    assert max(ticks_enqueued()) <= now
    assert Schedule.objects.get().next_tick <= now + datetime.timedelta(seconds=1)


def test_a_tick_whose_unique_key_is_held_is_skipped_once_and_counted(caplog):
    """A periodic job whose last run still holds its unique key: every pass logged an
    ERROR and the tick was enqueued late (runs back to back)."""

    class Reports(h.ReportHandler):
        schedules = [Periodic("* * * * * *", fields={"tenant": "acme"}, name="reports")]

    scheduler = Scheduler([Reports()])
    scheduler._pass(at(0.5))
    scheduler._pass(at(1.1))  # the first run: holds ("acme", "daily") while it lasts
    [first] = ReportJob.objects.all()
    for moment in (2.1, 2.4, 3.1):
        scheduler._pass(at(moment))
    assert ReportJob.objects.count() == 1
    row = Schedule.objects.get()
    assert (row.skipped_ticks, row.last_skipped_tick, row.next_tick) == (2, at(3), at(4))
    assert ticks_enqueued() == [at(1), at(2), at(3)]  # each tick handled once
    skipped = [r for r in caplog.records if "skipped the tick" in r.getMessage()]
    assert [r.levelname for r in skipped] == ["INFO", "INFO"]
    assert f"held by testapp.ReportJob:{first.pk}" in skipped[0].getMessage()
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    ReportJob.objects.filter(pk=first.pk).update(state="completed")
    scheduler._pass(at(4.1))
    assert ReportJob.objects.count() == 2
    from django_dbworker.contrib.prometheus import schedule_families

    [family] = schedule_families()
    assert [(s.name, s.labels, s.value) for s in family.samples] == [
        ("dbworker_schedule_ticks_skipped_total", {"schedule": "reports"}, 2.0)
    ]


def test_a_tick_whose_unique_key_is_held_can_wait_for_it(caplog):
    class Reports(h.ReportHandler):
        schedules = [
            Periodic("* * * * * *", fields={"tenant": "acme"}, name="reports", if_held="wait")
        ]

    scheduler = Scheduler([Reports()])
    scheduler._pass(at(0.5))
    scheduler._pass(at(1.1))
    [first] = ReportJob.objects.all()
    scheduler._pass(at(2.1))
    scheduler._pass(at(2.6))  # waits: logged once
    assert ReportJob.objects.count() == 1
    assert Schedule.objects.get().next_tick == at(2)
    waiting = [r for r in caplog.records if "waits for" in r.getMessage()]
    assert len(waiting) == 1
    ReportJob.objects.filter(pk=first.pk).update(state="completed")
    scheduler._pass(at(2.9))  # the key is free: the waiting tick is enqueued now
    assert ReportJob.objects.count() == 2
    assert Schedule.objects.get().skipped_ticks == 0
    with pytest.raises(ValueError, match="if_held='later'"):
        Periodic("* * * * *", if_held="later")


def test_the_dbworker_command_lists_and_switches_schedules(capsys):
    Scheduler([h.ScheduledHandler()])._pass(timezone.now())
    call_command("dbworker", "schedules")
    out = capsys.readouterr().out
    assert "every-second  on  '* * * * * *' UTC" in out
    call_command("dbworker", "disable", "every-second")
    assert not Schedule.objects.get().enabled
    call_command("dbworker", "enable", "every-second")
    assert Schedule.objects.get().enabled
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no schedule 'nope'"):
        call_command("dbworker", "enable", "nope")


def test_schedule_checks_refuse_what_cannot_work():
    class Broken(h.BehaviorHandler):
        schedules = [
            Periodic("* * * * *", fields={"colour": "red"}, name="a"),
            Periodic("0 * * * *", name="a"),
        ]

    messages = [m.msg for m in validate_handler(Broken) if m.id == "dbworker.E009"]
    assert any("named 'a'" in m for m in messages)
    assert any("sets colour" in m for m in messages)
    with pytest.raises(ValueError, match="cron expression"):
        Periodic("61 * * * *")
    with pytest.raises(ValueError, match="time zone"):
        Periodic("* * * * *", timezone="Mars/Olympus")


# -- the django.tasks backend --------------------------------------------------------


def test_a_paused_task_queue_waits_while_the_others_run(run_worker):
    from django_dbworker.tasks.handler import task_handlers
    from django_dbworker.tasks.models import TaskJob
    from tests.testapp import tasks as t

    pause("tasks:default:emails", by="ops")
    email, sums = t.send_welcome.enqueue(5), [t.add.enqueue(i, 1) for i in range(3)]
    tw = run_worker(task_handlers())

    def states(*results):
        return {TaskJob.objects.get(result_id=r.id).state for r in results}

    wait_until(lambda: states(*sums) == {"completed"}, 10)
    time.sleep(0.5)
    assert states(email) == {"queued"}
    resume("tasks:default:emails")
    wait_until(lambda: states(email) == {"completed"}, 10)
    assert tw.stop() == 0


def test_a_scheduled_task_is_enqueued_once_per_tick():
    from django_dbworker.tasks.handler import TaskHandler
    from django_dbworker.tasks.models import TaskJob
    from django_dbworker.tasks.options import TaskOptions, problems

    entry = {"task": "tests.testapp.tasks.add", "cron": "*/2 * * * * *", "args": [1, 2]}
    options = TaskOptions.from_settings("default", {"SCHEDULES": {"adder": entry}})
    emails_only = TaskHandler("default", ["emails"], options)
    assert emails_only.periodic_schedules() == []  # add runs in the default queue
    one, two = (Scheduler([TaskHandler("default", ["default"], options)]) for _ in range(2))
    one._pass(at(0.5))
    two._pass(at(4.5))
    one._pass(at(4.6))
    assert ticks_enqueued() == [at(2), at(4)]
    jobs = list(TaskJob.objects.order_by("pk").values_list("task_path", "args"))
    assert jobs == [("tests.testapp.tasks.add", [1, 2])] * 2
    assert Schedule.objects.get().name == "tasks:default:adder"
    bad = {"SCHEDULES": {"x": {"task": "a.b", "cron": "nope"}, "y": {"task": "a.b", "when": 1}}}
    assert problems(bad) == [
        "OPTIONS['SCHEDULES']['x']: cron expression 'nope': Wrong number of fields",
        "OPTIONS['SCHEDULES']['y']: unknown keys when",
    ]


# -- the admin -----------------------------------------------------------------------


def test_the_admin_pauses_and_resumes_with_an_audit_trail(admin_client):
    from django_dbworker.models import WorkerProcess

    WorkerProcess.objects.create(
        worker_id="w1",
        hostname="h",
        pid=1,
        handlers=["tests.testapp.handlers.ReportHandler", "<script>x</script>"],
        started_at=timezone.now(),
        last_heartbeat_at=timezone.now(),
    )
    form = admin_client.get("/admin/django_dbworker/pause/add/").content.decode()
    assert '<option value="tests.testapp.handlers.ReportHandler">' in form
    assert "<script>x</script>" not in form
    response = admin_client.post(
        "/admin/django_dbworker/pause/add/",
        {"name": "tests.testapp.handlers.ReportHandler", "reason": "<b>deploy</b>"},
    )
    assert response.status_code == 302
    listing = admin_client.get("/admin/django_dbworker/pause/").content.decode()
    assert "&lt;b&gt;deploy&lt;/b&gt;" in listing
    assert "<b>deploy</b>" not in listing
    pk = Pause.objects.get().pk
    admin_client.post(
        "/admin/django_dbworker/pause/",
        {"action": "resume_selected", "_selected_action": [pk]},
    )
    assert not Pause.objects.exists()
    trail = list(AuditEntry.objects.order_by("id").values_list("actor", "action", "detail"))
    assert trail == [("admin", "pause", "admin: <b>deploy</b>"), ("admin", "resume", "admin")]
    assert admin_client.get("/admin/django_dbworker/auditentry/").status_code == 200


def test_the_admin_lists_schedules_and_switches_them(admin_client):
    scheduler = Scheduler([h.ScheduledHandler()])
    scheduler._pass(timezone.now() - datetime.timedelta(seconds=3))
    scheduler._pass(timezone.now())
    job = QueueJob.objects.order_by("-pk").first()
    listing = admin_client.get("/admin/django_dbworker/schedule/").content.decode()
    assert "every-second" in listing
    assert "* * * * * *" in listing
    assert f"testapp.QueueJob:{job.pk}" in listing
    assert f"/admin/testapp/queuejob/{job.pk}/change/" in listing
    assert "dbworker-switch-on" in listing
    assert ">queued<" in listing  # the last job's outcome so far
    pk = Schedule.objects.get().pk
    admin_client.post(
        "/admin/django_dbworker/schedule/",
        {"action": "disable_selected", "_selected_action": [pk]},
    )
    assert not Schedule.objects.get().enabled
    assert (
        "dbworker-switch-off"
        in admin_client.get("/admin/django_dbworker/schedule/").content.decode()
    )
    assert list(AuditEntry.objects.values_list("actor", "action")) == [
        ("admin", "disable schedule")
    ]


def test_a_unique_task_returns_the_active_run_instead_of_adding_one():
    from django_dbworker.tasks.models import TaskJob
    from django_dbworker.testing import run_tasks
    from tests.testapp import tasks as t

    first = t.unique_sum.enqueue(1, 2)
    assert t.unique_sum.enqueue(1, 2).id == first.id
    other = t.unique_sum.enqueue(1, 3)
    assert other.id != first.id
    report = t.build_report.enqueue(7, version=1)
    assert t.build_report.enqueue(7, version=2).id == report.id
    assert TaskJob.objects.count() == 3
    run_tasks()
    again = t.unique_sum.enqueue(1, 2)  # the first run finished: its key is free
    assert again.id not in (first.id, other.id)
    with transaction.atomic():
        t.build_report.enqueue(8)
        transaction.set_rollback(True)
    assert not TaskJob.objects.filter(args=[8]).exists()


# -- retention -------------------------------------------------------------------------


@override_settings(DBWORKER={"RETENTION_INTERVAL": 0.2})
def test_a_worker_prunes_old_finished_jobs_in_a_thread_of_its_own(run_worker):
    import threading

    class Pruning(h.ReportHandler):
        retention = {"completed": datetime.timedelta(hours=1)}

    old = timezone.now() - datetime.timedelta(days=2)
    for i in range(250):  # more than one batch
        ReportJob.objects.create(tenant=f"old{i}", state="completed", finished_at=old)
    kept = ReportJob.objects.create(tenant="failed", state="failed", finished_at=old)
    fresh = ReportJob.objects.create(tenant="new")
    tw = run_worker(Pruning())
    wait_until(lambda: not ReportJob.objects.filter(tenant__startswith="old").exists(), 15)
    assert "dbworker-retention" in [t.name for t in threading.enumerate()]
    wait_until(lambda: states(pk=fresh.pk) == ["completed"], 10)
    assert tw.stop() == 0
    assert ReportJob.objects.filter(pk=kept.pk).exists()  # failed jobs have no retention here
    assert ReportJob.objects.filter(pk=fresh.pk).exists()  # finished just now
    assert "dbworker-retention" not in [t.name for t in threading.enumerate()]


def old_reports(count, **fields):
    old = timezone.now() - datetime.timedelta(days=2)
    return [
        ReportJob.objects.create(
            tenant=f"{fields.pop('tenant', 'old')}{i}", state="completed", finished_at=old, **fields
        )
        for i in range(count)
    ]


class PrunedReports(h.ReportHandler):
    retention = {"completed": datetime.timedelta(hours=1)}


@override_settings(DBWORKER={"RETENTION_INTERVAL": 0.3})
def test_retention_holds_no_connection_of_its_own_between_passes(run_worker):
    """A pass a minute kept its connection for good: one more per worker process in a
    pooler's or a server's budget (docs/operations.md § The connection budget)."""

    class Pruning(h.BehaviorHandler):  # a table no other model references: its own DELETE
        retention = {"completed": datetime.timedelta(hours=1)}

    old = timezone.now() - datetime.timedelta(days=2)
    QueueJob.objects.bulk_create(QueueJob(state="completed", finished_at=old) for _ in range(5))
    tw = run_worker(Pruning())
    pruner = tw.worker.maintenance.pruner
    wait_until(lambda: not QueueJob.objects.exists(), 15, message="the pass")
    wait_until(lambda: not list(pruner.retention.conn), 5, message="its connection closed")
    assert tw.stop() == 0


def test_retention_honours_on_delete_and_never_stalls_on_a_row(caplog):
    """Retention deleted with a raw DELETE: one finished job referenced by another
    model's foreign key made every batch fail, and retention stopped for good."""
    from django_dbworker.maintenance.retention import Retention
    from tests.testapp.models import Invoice

    cascaded, nulled, protected, restricted = old_reports(4, tenant="ref")
    plain = old_reports(150)  # more than a batch
    Invoice.objects.create(report=cascaded)
    summary = Invoice.objects.create(summary_of=nulled)
    Invoice.objects.create(protected=protected)
    Invoice.objects.create(restricted=restricted)
    retention = Retention([PrunedReports()])
    assert retention.run_once(budget=30) == {PrunedReports().get_name(): 152}
    left = set(ReportJob.objects.values_list("pk", flat=True))
    assert left == {protected.pk, restricted.pk}
    assert not ReportJob.objects.filter(pk__in=[j.pk for j in plain]).exists()
    assert not Invoice.objects.filter(report=cascaded.pk).exists()  # CASCADE
    assert Invoice.objects.get(pk=summary.pk).summary_of is None  # SET_NULL
    kept = [r.getMessage() for r in caplog.records if "retention keeps" in r.getMessage()]
    assert sorted(kept) == [
        f"testapp.ReportJob: retention keeps finished jobs that testapp.Invoice.protected "
        f"references (on_delete=PROTECT), e.g. job {protected.pk}",
        f"testapp.ReportJob: retention keeps finished jobs that testapp.Invoice.restricted "
        f"references (on_delete=RESTRICT), e.g. job {restricted.pk}",
    ]
    caplog.clear()
    assert retention.run_once(budget=30) == {}  # nothing more, said once
    assert not [r for r in caplog.records if "retention keeps" in r.getMessage()]
    retention.close()


def test_retention_passes_over_a_row_the_database_refuses_to_delete(caplog):
    """A foreign key of a table Django does not know (another program's)."""
    from django.db import connection

    from django_dbworker.maintenance.retention import Retention

    class Pruned(h.BehaviorHandler):
        retention = {"completed": datetime.timedelta(hours=1)}

    old = timezone.now() - datetime.timedelta(days=2)
    jobs = [QueueJob.objects.create(state="completed", finished_at=old) for _ in range(120)]
    table = QueueJob._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE dbw_foreign_ref (job_id bigint REFERENCES {table} (id))")
        cursor.execute("INSERT INTO dbw_foreign_ref VALUES (%s)", [jobs[7].pk])
    try:
        retention = Retention([Pruned()])
        assert retention.run_once(budget=30) == {Pruned().get_name(): 119}
        assert list(QueueJob.objects.values_list("pk", flat=True)) == [jobs[7].pk]
        refused = [r for r in caplog.records if "refuses to delete" in r.getMessage()]
        assert len(refused) == 1
        assert f"passes over job {jobs[7].pk}" in refused[0].getMessage()
        caplog.clear()
        assert retention.run_once(budget=30) == {}
        assert not [r for r in caplog.records if "refuses to delete" in r.getMessage()]
        retention.close()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE dbw_foreign_ref")


def test_task_result_retention_honours_on_delete():
    from django_dbworker.maintenance.retention import Retention
    from django_dbworker.tasks.handler import task_handlers
    from django_dbworker.tasks.models import TaskJob
    from tests.testapp.models import Invoice

    old = timezone.now() - datetime.timedelta(days=30)
    task = TaskJob.objects.create(
        task_path="tests.testapp.tasks.add", state="completed", finished_at=old
    )
    invoice = Invoice.objects.create(task=task)
    retention = Retention(task_handlers())
    retention.run_once(budget=30)
    assert not TaskJob.objects.filter(pk=task.pk).exists()
    assert not Invoice.objects.filter(pk=invoice.pk).exists()
    retention.close()


# -- where two capabilities meet (docs/reliability.md § Where capabilities meet) -----


def test_retention_frees_a_period_key_with_its_job_and_never_an_active_key():
    """Retention x unique: a finished job holds its period's key until retention
    deletes it; retention deletes finished jobs only, so a job holding an active key
    is never deleted, however old its columns say it is."""
    from django_dbworker.maintenance.retention import Retention

    class PruneAll(h.ReportHandler):
        retention = {
            "completed": datetime.timedelta(hours=1),
            "failed": datetime.timedelta(hours=1),
            "canceled": datetime.timedelta(hours=1),
        }

    old = timezone.now() - datetime.timedelta(days=2)
    hour = period_key(datetime.timedelta(hours=1), at(0))
    done, _ = ReportJob.objects.enqueue_unique(tenant="acme", kind="a", hour=hour)
    ReportJob.objects.filter(pk=done.pk).update(state="completed", finished_at=old)
    active = {
        state: ReportJob.objects.create(tenant=f"active-{state}", state=state, finished_at=old)
        for state in ("queued", "errored")
    }
    _, again = ReportJob.objects.enqueue_unique(tenant="acme", kind="b", hour=hour)
    assert again is False  # the finished job holds the period's key
    retention = Retention([PruneAll()])
    try:
        assert retention.run_once(budget=30) == {PruneAll().get_name(): 1}
    finally:
        retention.close()
    assert not ReportJob.objects.filter(pk=done.pk).exists()
    for state, job in active.items():
        held, created = ReportJob.objects.enqueue_unique(tenant=f"active-{state}")
        assert (held.pk, held.state, created) == (job.pk, state, False)
    _, again = ReportJob.objects.enqueue_unique(tenant="acme", kind="b", hour=hour)
    assert again is True  # deleted, the job no longer holds its period's key


def test_a_paused_handlers_ticks_are_enqueued_and_wait_for_the_resume(run_worker):
    """Periodic x pause: the scheduler enqueues the ticks of a paused handler (each
    once); they wait, queued, until it is resumed."""
    handler = h.ScheduledHandler()
    assert pause(handler.get_name()) is True
    scheduler = Scheduler([handler])
    scheduler._pass(at(0.5))
    scheduler._pass(at(2.5))
    assert ticks_enqueued() == [at(1), at(2)]
    # The worker's own scheduler (the real clock) must add no tick of its own.
    assert set_schedule_enabled("every-second", False, by="ops") is True
    tw = run_worker(handler)
    time.sleep(1.0)  # several claim intervals
    assert states(QueueJob) == ["queued"] * 2
    assert resume(handler.get_name()) is True
    wait_until(lambda: states(QueueJob) == ["completed"] * 2, 10, message="the ticks to run")
    assert tw.stop() == 0


def test_retention_prunes_canceled_and_reset_failed_jobs_but_never_a_retried_one():
    """Retention x cancel, reset and retry: a job canceled while queued and one the
    resetter failed are pruned by their final state's retention once old; a failed job
    retried is active again and kept, however old its ``finished_at``."""
    from django_dbworker.maintenance.resetter import Resetter
    from django_dbworker.maintenance.retention import Retention

    class PruneAll(h.BehaviorHandler):
        retention = {
            "completed": datetime.timedelta(hours=1),
            "failed": datetime.timedelta(hours=1),
            "canceled": datetime.timedelta(hours=1),
        }

    old = timezone.now() - datetime.timedelta(days=2)
    canceled = QueueJob.objects.create()
    assert QueueJob.objects.filter(pk=canceled.pk).cancel() == (1, 0)
    stale = timezone.now() - datetime.timedelta(minutes=5)
    dead = QueueJob.objects.create(
        state="processing", worker_hostname="gone:1:aaaaaa", last_heartbeat_at=stale
    )
    QueueJob.objects.filter(pk=dead.pk).update(num_resets=99)  # resets spent
    resetter = Resetter([PruneAll()])
    try:
        resetter.run_once()
    finally:
        resetter.close()
    assert states(QueueJob, pk=dead.pk) == ["failed"]
    retried = QueueJob.objects.create(state="failed", finished_at=old)
    assert QueueJob.objects.filter(pk=retried.pk).retry() == 1
    # The clock moves on: the two finished now are old enough to go.
    QueueJob.objects.filter(pk__in=[canceled.pk, dead.pk]).update(finished_at=old)
    retention = Retention([PruneAll()])
    try:
        assert retention.run_once(budget=30) == {PruneAll().get_name(): 2}
    finally:
        retention.close()
    assert list(QueueJob.objects.values_list("pk", "state")) == [(retried.pk, "queued")]
