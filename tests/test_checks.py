"""The system checks that catch what a new user gets wrong in the first hour: a
misspelt handler option, a missing app, an unsupported database, a misspelt setting."""

import pytest
from django.core import checks

from django_dbworker.checks import validate_handler
from django_dbworker.testing import run_jobs
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob

from .projects import project  # noqa: F401 - the fixture

# The checks ask MariaDB for its version (dbworker.E030) on the first connection.
pytestmark = pytest.mark.django_db


class MisspeltOptions(h.BehaviorHandler):
    max_retries = 3  # max_num_retries
    num_handler = 4  # num_handlers


class ValueForAMethod(h.BehaviorHandler):
    retry_delay = 5  # Handler.retry_delay() is a method; the option is retry_after


class MethodForAnOption(h.BehaviorHandler):
    def interval(self):  # type: ignore[override] # an option, not a hook
        return 1


class OwnAttributes(h.BehaviorHandler):
    """Attributes and methods of the user's own, not near any option: fine."""

    api_url = "https://example.com"
    timeout_seconds = 30

    def helper(self):
        return 1


def errors(handler):
    return [(m.id, m.msg, m.hint) for m in validate_handler(handler) if m.is_serious()]


def test_misspelt_options_are_refused_with_a_did_you_mean():
    found = errors(MisspeltOptions)
    assert [i for i, _, _ in found] == ["dbworker.E014", "dbworker.E014"]
    messages = " ".join(msg for _, msg, _ in found)
    assert "max_retries is not an option of Handler: did you mean 'max_num_retries'?" in messages
    assert "num_handler is not an option of Handler: did you mean 'num_handlers'?" in messages


def test_a_value_that_replaces_a_method_is_refused():
    [(error_id, message, hint)] = errors(ValueForAMethod)
    assert error_id == "dbworker.E014"
    assert "retry_delay = 5 replaces the method Handler.retry_delay() with a value" in message
    assert hint == "Did you mean the option 'retry_max_delay' or 'retry_after'?"


def test_a_method_that_replaces_an_option_is_refused():
    found = {error_id: message for error_id, message, _ in errors(MethodForAnOption)}
    assert "interval is an option of Handler, not a method" in found["dbworker.E014"]


def test_attributes_of_the_users_own_are_fine():
    assert errors(OwnAttributes) == []


class BrokenRetryDelay(h.BehaviorHandler):
    max_num_retries = 1

    def retry_delay(self, num_failures, job=None):
        raise TypeError("'int' object is not callable")


@pytest.mark.django_db(transaction=True)
def test_an_exception_while_deciding_the_outcome_fails_the_job_instead_of_losing_it():
    """An override (or a bug of ours) that raises while the outcome is decided used to
    leave the job ``processing`` for the resetter, reported as "lost"."""
    job = QueueJob.objects.create(behavior="fail")
    run_jobs(BrokenRetryDelay())
    job.refresh_from_db()
    assert job.state == "failed"
    assert job.failure_message.startswith(
        "deciding the outcome of this attempt failed: TypeError: 'int' object is not callable"
    )


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("HANDLER", "DBWORKER has an unknown key 'HANDLER': did you mean 'HANDLERS'?"),
        ("RESET_INTERVALS", "did you mean 'RESET_INTERVAL'?"),
        ("COMPLETELY_ELSE", "DBWORKER has an unknown key 'COMPLETELY_ELSE'."),
    ],
)
def test_an_unknown_setting_gets_a_did_you_mean(settings, key, expected):
    settings.DBWORKER = {key: []}
    [message] = checks.run_checks(tags=["dbworker"])
    assert message.id == "dbworker.E001"
    assert expected in message.msg


JOB_MODELS = """
from django.db import models
from django_dbworker.models import WorkerJob


class Job(WorkerJob):
    n = models.IntegerField(default=0)
"""


@pytest.mark.subprocess
def test_tasks_without_the_tasks_app_are_refused_at_check(project):  # noqa: F811
    project.app("jobs", models=JOB_MODELS)
    project.extra_settings = (
        'TASKS = {"default": {"BACKEND": "django_dbworker.tasks.DatabaseBackend"}}'
    )
    project.write_settings()
    done = project.run("check")
    assert done.returncode == 1
    assert "(dbworker.E103) TASKS['default'] uses django_dbworker.tasks.DatabaseBackend" in (
        done.stderr
    )


def _tasks_framework_app():
    """The app that registers the tasks framework's checks: none on Django 6 (importing
    ``django.tasks`` does), the backport's app on Django 5.2."""
    from django_dbworker.tasks import compat

    return [] if compat.tasks.__name__ == "django.tasks" else ["django_tasks"]


@pytest.mark.subprocess
@pytest.mark.parametrize("framework", ["loaded", "not loaded"])
def test_the_missing_tasks_app_is_reported_once_by_check(project, framework):  # noqa: F811
    """E103 comes from the backend's check() when Django's tasks framework runs the
    backends' checks, from django_dbworker's own check when it runs none: once either
    way (Django prints every message it is given, equal ones too)."""
    project.app("jobs", models=JOB_MODELS)
    if framework == "loaded":
        project.core_apps += _tasks_framework_app()
        # On Django 6 a module of the project that imports django.tasks loads it.
        project.app("tasksuser", models="import django_dbworker.tasks.compat\n")
    project.extra_settings = (
        'TASKS = {"default": {"BACKEND": "django_dbworker.tasks.DatabaseBackend"}}'
    )
    project.write_settings()
    done = project.run("check")
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if "dbworker.E103" in line]
    assert lines == [
        "?: (dbworker.E103) TASKS['default'] uses django_dbworker.tasks.DatabaseBackend, but "
        "the app django_dbworker.tasks is not installed: its table does not exist."
    ], done.stderr
    assert "System check identified 1 issue" in done.stderr


@pytest.mark.subprocess
def test_the_backends_check_reports_the_missing_tasks_app(project):  # noqa: F811
    """Django calls each TASKS backend's check() (django-tasks-db's tests expect E103
    from it)."""
    project.app("jobs", models=JOB_MODELS)
    project.core_apps += _tasks_framework_app()
    project.extra_settings = (
        'TASKS = {"default": {"BACKEND": "django_dbworker.tasks.DatabaseBackend"}}'
    )
    project.write_settings()
    done = project.run(
        "shell",
        "-c",
        "from django_dbworker.tasks import compat; "
        "print([m.id for m in compat.tasks.task_backends['default'].check()])",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['dbworker.E103']"


@pytest.mark.subprocess
def test_an_unsupported_database_is_refused_at_check(project):  # noqa: F811
    project.app("jobs", models=JOB_MODELS)
    # Django's placeholder backend (no database configured) stands for one we do not
    # support: the check needs no connection.
    project.extra_settings = "DATABASES = {}"
    project.write_settings()
    done = project.run("check")
    assert done.returncode == 1
    assert "(dbworker.E006) jobs.Job is in a 'unknown' database" in done.stderr


@pytest.mark.subprocess
def test_a_project_without_the_app_is_told_to_add_it(project):  # noqa: F811
    project.app("jobs", models=JOB_MODELS)
    project.core_apps = ["django.contrib.contenttypes", "django.contrib.auth"]
    project.write_settings()
    done = project.run("check")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "django.core.exceptions.ImproperlyConfigured: django_dbworker is not installed: "
        'add "django_dbworker" to INSTALLED_APPS (job models need its tables), then run '
        "migrate"
    )


class Heavy(h.BehaviorHandler):
    weight = 0


def test_a_weight_out_of_range_is_refused(settings):
    [(error_id, message, _)] = errors(Heavy)
    assert error_id == "dbworker.E004"
    assert "weight must be an integer from 1 to 100,000, not 0" in message
    settings.DBWORKER = {"POOL": 0}
    [found] = checks.run_checks(tags=["dbworker"])
    assert (found.id, found.msg) == (
        "dbworker.E001",
        "DBWORKER['POOL'] must be None or an integer >= 1.",
    )


@pytest.mark.parametrize("value", [0, -1, "fast", float("inf")])
def test_a_bad_probe_interval_is_refused(settings, value):
    settings.DBWORKER = {"PROBE_INTERVAL": value}
    [found] = checks.run_checks(tags=["dbworker"])
    assert (found.id, found.msg) == (
        "dbworker.E001",
        "DBWORKER['PROBE_INTERVAL'] must be a positive finite number or None.",
    )
    settings.DBWORKER = {"PROBE_INTERVAL": None}
    assert checks.run_checks(tags=["dbworker"]) == []


@pytest.mark.parametrize("value", [0, 9, 101, 50.0, True, "50"])
def test_a_bad_fillfactor_is_refused(settings, value):
    settings.DBWORKER = {"FILLFACTOR": value}
    [found] = checks.run_checks(tags=["dbworker"])
    assert (found.id, found.msg) == (
        "dbworker.E001",
        "DBWORKER['FILLFACTOR'] must be None or an integer from 10 to 100.",
    )
    for good in (None, 10, 100):
        settings.DBWORKER = {"FILLFACTOR": good}
        assert checks.run_checks(tags=["dbworker"]) == []
