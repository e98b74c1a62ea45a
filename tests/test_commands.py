"""runworker / runresetter input handling and the system checks."""

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.models import Q

from django_dbworker.checks import validate_handler
from tests.factories import JobFactory
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob

H = "tests.testapp.handlers"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no.such.Module"], "cannot import handler 'no.such.Module'"),
        ([f"{H}.NoSuchHandler"], "cannot import handler"),
        ([f"{H}.record"], "is not a Handler subclass"),
        ([f"{H}.NoModelHandler"], "has no model. (dbworker.E003)"),
        ([f"{H}.NotAJobModelHandler"], "is not a subclass of django_dbworker.models.WorkerJob"),
        ([f"{H}.BadOptionsHandler"], "num_handlers must be an integer >= 1, not 0"),
        ([f"{H}.BadOrderingHandler"], "ordering item 'no_such_field' is not a concrete field"),
        ([f"{H}.BadStaticFilterHandler"], "dequeue_filter cannot be used: FieldError"),
        ([f"{H}.BehaviorHandler", "--num-handlers", "0"], "--num-handlers must be > 0"),
        ([f"{H}.BehaviorHandler", "--num-handlers", "many"], "--num-handlers must be a number"),
        ([f"{H}.BehaviorHandler", "--interval", "-1"], "--interval must be > 0"),
        ([f"{H}.BehaviorHandler", "--max-jobs", "x"], "--max-jobs must be a number"),
        ([f"{H}.BehaviorHandler", "--shutdown-timeout", "-2"], "--shutdown-timeout must be >= 0"),
        ([], "no handlers: name them"),
    ],
)
def test_runworker_rejects_bad_input_in_one_line(args, message):
    with pytest.raises(CommandError) as info:
        call_command("runworker", *args)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no.such.Handler"], "cannot import handler"),
        ([f"{H}.NoModelHandler"], "has no model"),
        ([f"{H}.BehaviorHandler", "--interval", "0"], "--interval must be > 0"),
        ([], "no handlers"),
    ],
)
def test_runresetter_rejects_bad_input_in_one_line(args, message):
    with pytest.raises(CommandError) as info:
        call_command("runresetter", *args)
    assert message in str(info.value)


@pytest.mark.django_db(transaction=True)
def test_missing_table_tells_the_user_to_migrate(settings):
    from django.db import connection

    with connection.schema_editor() as editor:
        editor.delete_model(QueueJob)
    try:
        with pytest.raises(CommandError, match=r"does not exist .*run `python manage.py migrate`"):
            call_command("runworker", f"{H}.BehaviorHandler", "--burst")
    finally:
        with connection.schema_editor() as editor:
            editor.create_model(QueueJob)


@pytest.mark.django_db(transaction=True)
def test_runworker_burst_and_handlers_from_settings(settings):
    settings.DBWORKER = {"HANDLERS": [f"{H}.BehaviorHandler"]}
    JobFactory.create_batch(3)
    call_command("runworker", "--burst", "--num-handlers", "2", verbosity=0)
    assert set(QueueJob.objects.values_list("state", flat=True)) == {"completed"}


@pytest.mark.django_db(transaction=True)
def test_runresetter_once():
    from datetime import timedelta

    from django.utils import timezone

    job = JobFactory(state="processing", last_heartbeat_at=timezone.now() - timedelta(minutes=1))
    call_command("runresetter", f"{H}.BehaviorHandler", "--once", verbosity=0)
    job.refresh_from_db()
    assert (job.state, job.num_resets) == ("queued", 1)


def ids(messages):
    return sorted({m.id for m in messages})


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (h.BehaviorHandler, []),
        (h.NoModelHandler, ["dbworker.E003"]),
        (h.NotAJobModelHandler, ["dbworker.E003"]),
        (h.BadOptionsHandler, ["dbworker.E004"]),
        (h.BadOrderingHandler, ["dbworker.E005"]),
        (h.BehaviorHandler(retry_backoff=0.5), ["dbworker.E004"]),
        (h.BehaviorHandler(interval="soon"), ["dbworker.E004"]),
        (h.BehaviorHandler(dequeue_filter="state='x'"), ["dbworker.E004"]),
        (h.BehaviorHandler(dequeue_filter=Q(no_such_field=1)), ["dbworker.E004"]),
        (h.BehaviorHandler(dequeue_filter=Q(repository__name__startswith="a")), []),
        (h.BehaviorHandler(stalled_max_age=0.5, heartbeat_interval=1), ["dbworker.W001"]),
        (h.BehaviorHandler(ordering="id"), ["dbworker.E005"]),
    ],
)
def test_validate_handler(handler, expected):
    assert ids(validate_handler(handler)) == expected


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ({"HANDLERS": [f"{H}.BehaviorHandler"]}, []),
        ({"HANDLERS": ["nope.Handler"]}, ["dbworker.E002"]),
        ({"HANDLERS": [f"{H}.BadOptionsHandler"]}, ["dbworker.E004"]),
        ({"HANDLERS": "tests.Handler"}, ["dbworker.E001"]),
        ({"NO_SUCH_KEY": 1}, ["dbworker.E001"]),
        ({"RESET_INTERVAL": 0}, ["dbworker.E001"]),
        ({"STATEMENT_TIMEOUT": "10s"}, ["dbworker.E001"]),
        ({"NOTIFY": "yes"}, ["dbworker.E001"]),
        ([], ["dbworker.E001"]),
    ],
)
def test_settings_checks(settings, setting, expected):
    settings.DBWORKER = setting
    messages = checks.run_checks(tags=["dbworker"])
    assert ids(messages) == expected


def test_model_without_dequeue_index_is_flagged():
    from django.apps import apps
    from django.db import models

    from django_dbworker.checks import check_job_models
    from django_dbworker.models import WorkerJob

    class NoIndexJob(WorkerJob):
        class Meta:
            app_label = "testapp"

    try:
        messages = [m for m in check_job_models() if m.obj is NoIndexJob]
        assert ids(messages) == ["dbworker.W002"]
    finally:
        del apps.all_models["testapp"]["noindexjob"]
        apps.clear_cache()
    assert models  # keep import used


@pytest.mark.skipif(connection.vendor != "sqlite", reason="PostgreSQL has this lookup")
def test_a_lookup_the_database_lacks_is_refused_at_start():
    """It used to be reported as a database error at every claim, with backoff, forever."""
    messages = validate_handler(h.BehaviorHandler(dequeue_filter=Q(payload__contains={"k": 1})))
    assert ids(messages) == ["dbworker.E004"]
    assert "NotSupportedError" in messages[0].msg
