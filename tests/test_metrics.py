"""Prometheus metrics (issue 14): scraped from real runworker processes (one, and a
supervisor of two) and checked against what the workers did; the Django view."""

import signal
import socket
import urllib.request
from datetime import timedelta

import pytest
from django.test import override_settings
from django.urls import path
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_dbworker.consumers.models import ConsumerCheckpoint
from django_dbworker.contrib.prometheus import metrics_view
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.testapp.models import QueueJob

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
def test_the_django_view_serves_the_table_gauges(client):
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
def test_the_django_view_serves_the_consumer_gauges(client):
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
