"""An admin scoped to tenants (issue 42, item 2): a job admin whose ``get_queryset``
limits a user to their tenant's jobs shows that user nothing of the other tenants'
jobs: no count, no concurrency key, no queue name, no text, no statistic of theirs,
on the list, the dashboard, the job page and its live panel."""

import json
from datetime import UTC, timedelta

import pytest
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.db.models import Count
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_dbworker import Handler, figures
from django_dbworker.control.pause import pause
from django_dbworker.models import JobStats, WorkerProcess
from tests.testapp.models import ManagedJob, QueueJob, ScopedJob

pytestmark = pytest.mark.django_db

#: Every text of the other tenant's jobs has it: none may reach an acme user's page.
OTHER = "globex"
LIMITED = "tests.test_admin_tenants.ScopedHandler"
FREE = "tests.test_admin_tenants.FreeHandler"
WORKER = "w-1:10:abc"
CHANGELIST = "admin:testapp_scopedjob_changelist"
DASHBOARD = "admin:testapp_scopedjob_dashboard"


class ScopedHandler(Handler):
    """At most 3 jobs at once, one per account; a queue per tenant."""

    model = ScopedJob
    queue_field = "queue"
    max_concurrency = 3
    concurrency_key = "account"
    max_concurrency_per_key = 1
    rate_limit = "100/m"

    def handle(self, job):
        pass


class FreeHandler(Handler):
    model = ScopedJob
    queue_field = "queue"

    def handle(self, job):
        pass


def jobs(count, **fields):
    return [ScopedJob.objects.create(**fields) for _ in range(count)]


@pytest.fixture
def tenants(settings):
    """Two tenants' jobs, a live worker running both tenants' jobs, statistics of the
    model, and a paused queue of each tenant."""
    settings.DBWORKER = {**settings.DBWORKER, "HANDLERS": [LIMITED]}
    now = timezone.now()
    other = {"tenant": OTHER, "account": f"{OTHER}-secret-account", "queue": f"{OTHER}-queue"}
    mine = {"tenant": "acme", "account": "acme-main", "queue": "acme-queue"}
    found = {
        "other_queued": jobs(5, **other),
        "other_running": jobs(3, **other, state="processing", worker_hostname=WORKER)
        + jobs(1, **{**other, "account": f"{OTHER}-second"}, state="processing"),
        "other_done": jobs(4, **other, state="completed", finished_at=now),
        "other_failed": jobs(2, **other, state="failed", failure_message=f"{OTHER} broke"),
        "mine_queued": jobs(2, **mine),
        "mine_running": jobs(1, **mine, state="processing", worker_hostname=WORKER),
        "mine_failed": jobs(1, **mine, state="failed", failure_message="acme broke"),
    }
    ScopedJob.objects.filter(state="processing").update(started_at=now, last_heartbeat_at=now)
    held = [*found["other_running"][:3], *found["mine_running"]]
    WorkerProcess.objects.create(
        worker_id=WORKER,
        hostname="w-1",
        pid=10,
        handlers=[LIMITED],
        num_handlers=4,
        jobs=[f"testapp.ScopedJob:{job.pk}" for job in held],
        num_jobs=len(held),
        pool={
            "size": 4,
            "busy": 4,
            "handlers": {LIMITED: {"weight": 1, "ceiling": 4, "busy": 4, "share": 1.0}},
        },
        started_at=now,
        last_heartbeat_at=now,
    )
    histogram = [0] * 19
    histogram[6] = 40
    JobStats.objects.create(
        minute=now.astimezone(UTC).replace(second=0, microsecond=0) - timedelta(minutes=1),
        handler=LIMITED,
        model="testapp.ScopedJob",
        worker=WORKER,
        completed=37,
        failed=3,
        durations=histogram,
    )
    pause(f"{LIMITED}:{OTHER}-queue", by="ops", reason=f"{OTHER} asked")
    pause(f"{LIMITED}:acme-queue", by="ops", reason="acme asked")
    return found


@pytest.fixture
def acme(django_user_model):
    """A staff user of tenant acme, who may view and change its jobs."""
    user = django_user_model.objects.create_user("ann", password="pw", is_staff=True)
    user.groups.add(Group.objects.create(name="tenant:acme"))
    for codename in ("view_scopedjob", "change_scopedjob"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def page(client, name, *args, **params):
    response = client.get(reverse(name, args=args), params)
    assert response.status_code == 200
    return response


def state_counts(response):
    return {c["state"]: c["count"] for c in response.context["dbworker_counts"]}


def mine_only(html):
    assert OTHER not in html
    # Nor a figure that counts the other tenant's jobs: 5 running of the 3 allowed.
    assert "5 of 3" not in html
    assert "5/3" not in html


# -- the list --------------------------------------------------------------------------


def test_the_counts_per_state_are_the_tenants(acme, admin_client, tenants):
    response = page(acme, CHANGELIST)
    assert state_counts(response) == {
        "queued": 2,
        "processing": 1,
        "completed": 0,
        "errored": 0,
        "failed": 1,
        "canceled": 0,
    }
    assert response.context["dbworker_total"] == 4
    assert response.context["cl"].result_count == 4
    mine_only(response.content.decode())
    # A superuser's admin is the whole table.
    everything = page(admin_client, CHANGELIST)
    assert state_counts(everything)["queued"] == 7
    assert everything.context["dbworker_total"] == 19


def test_the_limits_panel_names_no_other_tenants_keys(acme, admin_client, tenants):
    html = page(acme, CHANGELIST).content.decode()
    mine_only(html)
    assert f"limits of <code>{LIMITED}</code>" in html
    assert "<dd>1 of the jobs you can see running (the limit, 3, counts every job)</dd>" in html
    assert "acme-main: 1" in html
    assert "tokens left" not in html  # the bucket every tenant drains
    whole = page(admin_client, CHANGELIST).content.decode()
    assert "<dd>5/3 running</dd>" in whole
    assert f"{OTHER}-secret-account: 3" in whole


def test_counts_of_a_large_table_are_never_estimates_for_a_tenant(
    acme, admin_client, tenants, monkeypatch
):
    """The planner's estimates come from the whole table's statistics: a tenant's
    counts are exact, counted up to EXACT_BELOW (said "≥" past it), and so is the
    paginator's."""
    jobs(6, tenant="acme", state="completed")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {ScopedJob._meta.db_table}")
    monkeypatch.setattr(figures, "EXACT_BELOW", 3)
    response = page(acme, CHANGELIST)
    found = {c["state"]: c for c in response.context["dbworker_counts"]}
    assert not any(c["estimated"] for c in found.values())
    assert (found["completed"]["count"], found["completed"]["at_least"]) == (3, True)
    assert (found["queued"]["count"], found["failed"]["count"]) == (2, 1)
    paginator = response.context["cl"].paginator
    assert not paginator.estimated
    assert paginator.at_least
    assert response.context["cl"].result_count == 3
    html = response.content.decode()
    assert "≥&#8239;3" in html
    assert "More than 3 jobs match" in html
    mine_only(html)
    if connection.vendor == "postgresql":  # the whole table's user gets estimates
        everything = page(admin_client, CHANGELIST)
        assert {c["state"] for c in everything.context["dbworker_counts"] if c["estimated"]}


# -- the dashboard ---------------------------------------------------------------------


def test_the_dashboard_shows_the_tenants_figures_only(acme, admin_client, tenants):
    response = page(acme, DASHBOARD)
    board = response.context["board"]
    [row] = board.rows
    assert (row.queued, row.processing, row.errored) == (2, 1, 0)
    assert (row.live_workers, row.busy, row.threads) == (1, 1, 4)
    assert row.paused == [f"{LIMITED}:acme-queue"]
    assert (row.p50, row.p95, row.attempts_last_hour) == (None, None, 0)
    assert not board.statistics
    assert board.minutes_total.completed == 0
    assert row.pool == ["weight 1 in a pool of 4"]
    html = response.content.decode()
    mine_only(html)
    assert '<svg class="dbworker-chart"' not in html
    assert "you can see some of them only" in html
    # The whole table's user: every figure.
    board = page(admin_client, DASHBOARD).context["board"]
    [row] = board.rows
    assert (row.queued, row.processing, row.busy) == (7, 5, 4)
    assert sorted(row.paused) == [f"{LIMITED}:acme-queue", f"{LIMITED}:{OTHER}-queue"]
    assert board.statistics
    assert board.minutes_total.completed == 37
    assert row.p50 is not None
    assert row.pool == ["weight 1, 100% of a pool of 4 (4 busy)"]


# -- the job page ----------------------------------------------------------------------


def test_the_job_page_tells_of_limits_held_with_the_tenants_jobs_only(acme, admin_client, tenants):
    job = tenants["mine_queued"][0]
    ScopedJob.objects.filter(queue="acme-queue").update(queue="default")
    html = page(acme, "admin:testapp_scopedjob_change", job.pk).content.decode()
    mine_only(html)
    assert (
        f"The concurrency limit of {LIMITED} is held: its 3 slot(s) are taken, 1 of them by "
        "jobs you can see." in html
    )
    assert f"The concurrency limit per account of {LIMITED} is held for acme-main: its 1 " in html
    whole = page(admin_client, "admin:testapp_scopedjob_change", job.pk).content.decode()
    assert f"The concurrency limit of {LIMITED} is held: 5 of 3 running." in whole
    live = page(acme, "admin:testapp_scopedjob_dbworker", job.pk, "live")
    mine_only(json.dumps(live.json()))


def test_the_jobs_ahead_are_the_tenants(acme, admin_client, tenants, settings):
    settings.DBWORKER = {**settings.DBWORKER, "HANDLERS": [FREE]}
    WorkerProcess.objects.update(handlers=[FREE], pool=None)
    ScopedJob.objects.update(queue="default")
    job = tenants["mine_queued"][1]  # one of acme's and five of globex's come first
    html = page(acme, "admin:testapp_scopedjob_change", job.pk).content.decode()
    mine_only(html)
    assert "(1 claimable job(s) you can see with lower ids come first" in html
    assert "jobs you cannot see may too" in html
    whole = page(admin_client, "admin:testapp_scopedjob_change", job.pk).content.decode()
    assert "(6 claimable job(s) with lower ids come first in the default order)" in whole


def test_a_retry_held_by_another_tenants_job_does_not_name_it(acme, admin_client, tenants):
    """A unique key shared across tenants: the retry refused for it named the job that
    holds the key, another tenant's."""
    [holder] = jobs(1, tenant=OTHER, key="invoice-7")
    [mine] = jobs(1, tenant="acme", key="invoice-7", state="failed")
    data = {"action": "retry_jobs", "_selected_action": [mine.pk], "index": 0}
    response = acme.post(reverse(CHANGELIST), data, follow=True)
    said = " ".join(str(m) for m in response.context["messages"])
    assert f"job {mine.pk} (its unique key is held by a job you cannot see)" in said
    assert f"job {holder.pk}" not in said
    mine_only(response.content.decode())
    response = admin_client.post(reverse(CHANGELIST), data, follow=True)
    said = " ".join(str(m) for m in response.context["messages"])
    assert f"job {mine.pk} (its unique key is held by job {holder.pk})" in said


def test_another_tenants_job_page_is_not_found(acme, tenants):
    job = tenants["other_failed"][0]
    response = acme.get(reverse("admin:testapp_scopedjob_change", args=[job.pk]))
    assert response.status_code == 302  # Django's answer to a missing object: the index
    assert OTHER not in acme.get(response.url, follow=True).content.decode()


# -- which rows are the whole table ----------------------------------------------------


def test_whole_table_is_a_queryset_without_a_condition():
    from django_dbworker.admin.scope import Visible, whole_table

    assert whole_table(QueueJob.objects.all())
    assert whole_table(QueueJob.objects.select_related("repository").order_by("-id"))
    assert not whole_table(QueueJob.objects.filter(behavior="x"))
    assert not whole_table(QueueJob.objects.exclude(behavior="x"))
    assert not whole_table(QueueJob.objects.none())
    assert not whole_table(QueueJob.objects.all()[:10])
    assert not whole_table(QueueJob.objects.extra(where=["1 = 1"]))
    assert not whole_table(QueueJob.objects.filter(pk__in=[1]).union(QueueJob.objects.all()))
    assert not whole_table(QueueJob.objects.using("other"))
    # A default manager that hides rows: its admin shows a subset (and counts it).
    assert not whole_table(ManagedJob.objects.all())
    assert Visible.of(ManagedJob._base_manager.all()).whole
    # The whole table is counted plainly, without an admin's annotations.
    annotated = Visible.of(QueueJob.objects.annotate(n=Count("repository")))
    assert annotated.whole
    assert not annotated.rows.query.annotations
