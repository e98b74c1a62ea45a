"""Who may do what in the operations console (issue 42), through the Django test client:

- no admin page imports a module, or builds a class, that the worker registry names.
"""

import sys

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from django_dbworker.control.models import Pause, Schedule
from django_dbworker.models import WorkerProcess
from tests.factories import JobFactory
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob

pytestmark = pytest.mark.django_db

PAUSES = "/admin/django_dbworker/pause/"
SCHEDULES = "/admin/django_dbworker/schedule/"


def changelist_of(model):
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def change_of(obj):
    opts = obj._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])


def operation(pk, name):
    return reverse("admin:testapp_queuejob_dbworker", args=[pk, name])


def label(job):
    return f"{job._meta.label}:{job.pk}"


def worker_row(**fields):
    now = timezone.now()
    defaults = {"worker_id": "w:1:a", "hostname": "w", "pid": 1, "handlers": []}
    return WorkerProcess.objects.create(
        **{**defaults, **fields}, started_at=now, last_heartbeat_at=now
    )


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
    pages = [
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
