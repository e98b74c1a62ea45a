"""Prometheus metrics (issue 14): scraped from real runworker processes (one, and a
supervisor of two) and checked against what the workers did; the Django view."""

import signal
import socket
import urllib.request
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.urls import path
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_dbworker.consumers.models import ConsumerCheckpoint
from django_dbworker.contrib import prometheus
from django_dbworker.contrib.prometheus import metrics_view
from django_dbworker.models import WorkerProcess
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp.models import QueueJob, ReportJob

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

HANDLER = "tests.testapp.handlers.BehaviorHandler"
MODEL = "testapp.QueueJob"
urlpatterns = [path("metrics", metrics_view)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    """{(name, labels as a sorted tuple): value} of every sample served on ``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return samples(reply.read().decode())


def samples(text):
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(figures, name, **labels):
    return figures.get((name, tuple(sorted(labels.items()))))


def serving(port):
    try:
        return scrape(port)
    except OSError:
        return None


def enqueue():
    JobFactory.create_batch(5, behavior="ok")
    JobFactory.create_batch(2, behavior="nonretryable")
    later = timezone.now() + timedelta(hours=1)
    JobFactory.create_batch(3, behavior="ok", process_after=later)


def done():
    return QueueJob.objects.filter(state__in=["completed", "failed"]).count() == 7


@pytest.mark.parametrize("processes", [1, 2])
def test_a_scrape_tells_what_the_workers_did(spawn, processes):
    enqueue()
    port = free_port()
    args = [HANDLER, "--num-handlers", "3", "--metrics-port", str(port), "--no-resetter"]
    if processes > 1:
        args += ["--processes", str(processes)]
    worker = spawn("runworker", *args, "--metrics-address", "127.0.0.1")
    wait_until(done, 30, message="the jobs")
    # A worker writes its figures as it writes outcomes (the last may lag a moment), and
    # the second process may still be starting when the first has done all the jobs.
    figures = wait_until(
        lambda: (
            (f := serving(port))
            and value(f, "dbworker_jobs_finished_total", handler=HANDLER, outcome="failed") == 2
            and value(f, "dbworker_jobs_finished_total", handler=HANDLER, outcome="completed") == 5
            and value(f, "dbworker_handler_threads", handler=HANDLER) == 3 * processes
            and f
        ),
        20,
        message="the scrape",
    )
    assert value(figures, "dbworker_attempt_duration_seconds_count", handler=HANDLER) == 7
    assert value(figures, "dbworker_jobs_claimed_total", handler=HANDLER) == 7
    assert value(figures, "dbworker_claims_total", handler=HANDLER) >= 1
    assert value(figures, "dbworker_claim_duration_seconds_count", handler=HANDLER) >= 1
    assert value(figures, "dbworker_handler_threads", handler=HANDLER) == 3 * processes
    assert value(figures, "dbworker_handler_threads_busy", handler=HANDLER) == 0
    for state, count in (("queued", 0), ("scheduled", 3), ("processing", 0), ("errored", 0)):
        assert value(figures, "dbworker_jobs", model=MODEL, state=state) == count, state
    assert value(figures, "dbworker_oldest_claimable_job_age_seconds", model=MODEL) == 0
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output


@override_settings(ROOT_URLCONF=__name__)
def test_the_django_view_serves_the_table_gauges(admin_client):
    client = admin_client
    enqueue()
    QueueJob.objects.filter(behavior="nonretryable").update(state="processing")
    old = timezone.now() - timedelta(minutes=10)
    first = QueueJob.objects.filter(process_after__isnull=True).order_by("pk").first()
    QueueJob.objects.filter(pk=first.pk).update(queued_at=old)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    figures = samples(response.content.decode())
    assert value(figures, "dbworker_jobs", model=MODEL, state="queued") == 5
    assert value(figures, "dbworker_jobs", model=MODEL, state="scheduled") == 3
    assert value(figures, "dbworker_jobs", model=MODEL, state="processing") == 2
    assert 590 < value(figures, "dbworker_oldest_claimable_job_age_seconds", model=MODEL) < 700


@override_settings(ROOT_URLCONF=__name__)
def test_the_django_view_serves_the_consumer_gauges(admin_client):
    client = admin_client
    behind_since = timezone.now() - timedelta(minutes=3)
    ConsumerCheckpoint.objects.create(name="ok", position=10, head=10)
    ConsumerCheckpoint.objects.create(
        name="stuck", position=10, head=25, caught_up_at=behind_since, failing=True, failures=5
    )
    ConsumerCheckpoint.objects.create(name="held", position=3, head=3, paused=True)
    figures = samples(client.get("/metrics").content.decode())
    lag = {c: value(figures, "dbworker_consumer_lag_rows", consumer=c) for c in ("ok", "stuck")}
    assert lag == {"ok": 0, "stuck": 15}
    assert value(figures, "dbworker_consumer_behind_seconds", consumer="ok") == 0
    assert 170 < value(figures, "dbworker_consumer_behind_seconds", consumer="stuck") < 300
    failing = {c: value(figures, "dbworker_consumer_failing", consumer=c) for c in ("ok", "stuck")}
    assert failing == {"ok": 0, "stuck": 1}
    assert value(figures, "dbworker_consumer_paused", consumer="held") == 1


# -- issue 29: metrics an operator can alert on ----------------------------------------

TOKEN = "s3cret-scrape-token"
REPORTS = "tests.testapp.handlers.ReportHandler"


def test_the_view_serves_staff_or_a_bearer_token_only(client, admin_client, settings):
    """Finding 11: the view protects itself."""
    settings.ROOT_URLCONF = __name__
    assert client.get("/metrics").status_code == 403
    assert admin_client.get("/metrics").status_code == 200
    settings.DBWORKER = {**settings.DBWORKER, "METRICS_TOKEN": TOKEN}
    refused = client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong")
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics").status_code == 401
    served = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert served.status_code == 200
    assert b"dbworker_jobs{" in served.content
    assert admin_client.get("/metrics").status_code == 200


def test_the_view_leaves_the_requests_connections_alone(rf, admin_user, settings):
    """Finding 11: a scrape through the view inside the request's transaction
    (ATOMIC_REQUESTS) neither closes its connection nor breaks the transaction."""
    ReportJob.objects.create(tenant="t")
    request = rf.get("/metrics")
    request.user = admin_user
    with transaction.atomic():
        ReportJob.objects.create(tenant="u")
        assert metrics_view(request).status_code == 200
        assert connection.connection is not None
        assert ReportJob.objects.count() == 2  # the same transaction goes on
    assert ReportJob.objects.count() == 2


def test_a_worker_shows_every_counter_at_zero_from_its_start(spawn):
    """Finding 9: increase()/rate() see the first reset or failure of each handler."""
    port = free_port()
    worker = spawn(
        "runworker", HANDLER, "--metrics-port", str(port), "--metrics-address", "127.0.0.1"
    )
    figures = wait_until(lambda: serving(port), 30, message="the metrics server")
    for outcome in ("completed", "errored", "failed", "canceled", "requeued", "lost"):
        assert value(figures, "dbworker_jobs_finished_total", handler=HANDLER, outcome=outcome) == 0
    assert value(figures, "dbworker_resets_total", model=MODEL) == 0
    assert value(figures, "dbworker_reset_failures_total", model=MODEL) == 0
    for role in ("claim", "heartbeat", "write"):
        assert value(figures, "dbworker_statement_errors_total", role=role) == 0
    assert value(figures, "dbworker_claims_total", handler=HANDLER) == 0
    assert value(figures, "dbworker_queue_wait_seconds_count", handler=HANDLER, queue="") == 0
    # Served before its start is done: a SIGTERM then ended it by the default action.
    wait_until(lambda: " started: " in worker.output, 30, message="the worker's start")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output


def test_queue_wait_per_queue_and_live_workers(spawn):
    """Finding 12: ready → started per handler and queue; the live workers per
    handler, from the registry."""
    now = timezone.now()
    for queue, count in (("a", 3), ("b", 2)):
        for n in range(count):
            ReportJob.objects.create(tenant=f"{queue}{n}", queue=queue)
    ReportJob.objects.filter(tenant="a0").update(queued_at=now - timedelta(seconds=30))
    port = free_port()
    worker = spawn(
        "runworker", REPORTS, "--metrics-port", str(port), "--metrics-address", "127.0.0.1"
    )
    wait_until(lambda: ReportJob.objects.filter(state="completed").count() == 5, 30)
    figures = wait_until(
        lambda: (
            (f := serving(port))
            and value(f, "dbworker_queue_wait_seconds_count", handler=REPORTS, queue="a") == 3
            and f
        ),
        20,
        message="the scrape",
    )
    wait = "dbworker_queue_wait_seconds"
    assert value(figures, f"{wait}_count", handler=REPORTS, queue="b") == 2
    # The job queued 30 s before it ran waited past 10 s; the others did not.
    assert value(figures, f"{wait}_bucket", handler=REPORTS, queue="a", le="10.0") == 2
    assert value(figures, f"{wait}_bucket", handler=REPORTS, queue="a", le="60.0") == 3
    assert value(figures, "dbworker_live_workers", handler=REPORTS) == 1
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output


def test_the_view_counts_what_this_process_enqueued(admin_client, settings):
    """Finding 12: the enqueued counter, per model and queue (the handler's queue_field),
    by every enqueueing path; the queue label holds at most MAX_QUEUE_LABELS values."""
    settings.ROOT_URLCONF = __name__
    settings.DBWORKER = {**settings.DBWORKER, "HANDLERS": [REPORTS]}

    def enqueued(**labels):
        figures = samples(admin_client.get("/metrics").content.decode())
        return value(figures, "dbworker_jobs_enqueued_total", **labels) or 0

    before = enqueued(model="testapp.ReportJob", queue="x")
    ReportJob.objects.create(tenant="1", queue="x")
    ReportJob(tenant="2", queue="x").save()
    ReportJob.objects.bulk_create([ReportJob(tenant="3", queue="x"), ReportJob(tenant="4")])
    ReportJob.objects.bulk_enqueue([ReportJob(tenant="5", queue="x")])
    ReportJob.objects.enqueue_unique(tenant="6", kind="daily", queue="x")
    ReportJob.objects.enqueue_unique(tenant="6", kind="daily", queue="x")  # held: none
    assert enqueued(model="testapp.ReportJob", queue="x") - before == 5
    quiet = enqueued(model=MODEL, queue="")
    JobFactory.create_batch(2, behavior="ok")
    JobFactory(behavior="ok", state="completed")  # not queued: not counted
    assert enqueued(model=MODEL, queue="") - quiet == 2
    ReportJob.objects.bulk_create(
        ReportJob(tenant=f"many{n}", queue=f"q{n}") for n in range(prometheus.MAX_QUEUE_LABELS + 10)
    )
    figures = samples(admin_client.get("/metrics").content.decode())
    queues = {
        dict(labels)["queue"]
        for (name, labels) in figures
        if name == "dbworker_jobs_enqueued_total" and dict(labels)["model"] == "testapp.ReportJob"
    }
    assert len(queues) == prometheus.MAX_QUEUE_LABELS + 1
    assert "other" in queues


def test_the_view_counts_tasks_and_live_workers(admin_client, settings):
    settings.ROOT_URLCONF = __name__
    from tests.testapp.tasks import send_welcome

    settings.DBWORKER = {**settings.DBWORKER, "HANDLERS": [HANDLER]}

    def figures():
        return samples(admin_client.get("/metrics").content.decode())

    tasks_model = "dbworker_tasks.TaskJob"
    before = value(figures(), "dbworker_jobs_enqueued_total", model=tasks_model, queue="emails")
    send_welcome.enqueue(1)
    after = value(figures(), "dbworker_jobs_enqueued_total", model=tasks_model, queue="emails")
    assert after - (before or 0) == 1
    assert value(figures(), "dbworker_live_workers", handler=HANDLER) == 0
    now = timezone.now()
    for n, beat in enumerate((now, now - timedelta(hours=1))):
        WorkerProcess.objects.create(
            worker_id=f"w:{n}", hostname="w", pid=n, handlers=[HANDLER, "consumer:c"],
            started_at=beat, last_heartbeat_at=beat,
        )  # fmt: skip
    assert value(figures(), "dbworker_live_workers", handler=HANDLER) == 1
    assert value(figures(), "dbworker_live_workers", handler="consumer:c") == 1
