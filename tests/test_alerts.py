"""The alert rules of docs/operations.md against real workers (issue 29): each rule
stays quiet while all is well and gives a sample in the situation it is for: a
consumer whose worker was killed (-9) or stopped (SIGSTOP) with rows waiting, a worker
resetting and failing jobs, a handler with no live worker, jobs that wait.

The rules are read from the documentation's YAML block and evaluated with
``tests.promql`` over the figures scraped from a worker's port and from
``metrics_view``.
"""

import re
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from django_dbworker.models import ConsumerCheckpoint, WorkerProcess
from tests.conftest import wait_until
from tests.factories import JobFactory
from tests.promql import Scrapes, firing
from tests.test_metrics import free_port, samples, scrape
from tests.testapp.models import OrderEvent, QueueJob

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

DOCS = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
HANDLER = "tests.testapp.handlers.BehaviorHandler"
TOKEN = "alerts-token"
FAST = {"DBWORKER_TEST_CONSUMER_LEASE": "3", "DBWORKER_TEST_CONSUMER_REBALANCE_INTERVAL": "1"}


def rules():
    """{name: expression} of the YAML block after "Example alert rules"."""
    text = DOCS.read_text()
    block = text[text.index("Example alert rules") :]
    block = block[block.index("```yaml") + 7 : block.index("```", block.index("```yaml") + 7)]
    found, name, lines = {}, None, []
    for line in block.splitlines():
        if m := re.match(r"\s*- alert: (\w+)", line):
            name = m.group(1)
        elif m := re.match(r"\s*expr: (.*)", line):
            lines = [] if m.group(1).strip() == "|" else [m.group(1)]
            found[name] = lines
        elif line.strip().startswith("for:"):
            continue
        elif name in found and line.startswith("          "):
            found[name].append(line.strip())
    return {n: " ".join(parts) for n, parts in found.items()}


RULES = rules()


def fired(first, last):
    """The rules that give a sample, with the labels of their samples."""
    scrapes = Scrapes(first, last)
    result = {}
    for name, expression in RULES.items():
        got = firing(expression, scrapes)
        if got:
            result[name] = sorted(tuple(sorted(labels)) for labels in got)
    return result


def view(client):
    return (time.time(), samples(client.get("/metrics").content.decode()))


def consumer_rules(scrape):
    """The consumer rules that fire on one scrape; and no other rule but NoLiveWorker
    (a killed worker's registry row counts as live for 10 s, then its consumer label
    has no live worker: either may be seen here)."""
    got = fired(scrape, scrape)
    assert set(got) <= {"ConsumerStuck", "ConsumerNotRunning", "NoLiveWorker"}, got
    return {name: labels for name, labels in got.items() if name.startswith("Consumer")}


def test_the_documented_rules_parse():
    assert set(RULES) >= {"ConsumerStuck", "ConsumerNotRunning", "JobsStalled", "NoLiveWorker"}
    quiet = (0.0, {}), (1.0, {})
    assert fired(*quiet) == {}


def test_consumer_rules_fire_when_no_live_worker_runs_it(spawn, admin_client, settings):
    """Finding 2: kill -9, then SIGSTOP, of the worker that runs a consumer while rows
    wait: the lag grows, the rules fire; a worker that catches up quiets them."""
    settings.ROOT_URLCONF = "tests.test_metrics"
    settings.DBWORKER = {**settings.DBWORKER, "CONSUMER_LEASE": 3.0}  # the workers' too
    OrderEvent.objects.bulk_create(OrderEvent() for _ in range(5))
    head = OrderEvent.objects.order_by("-id").values_list("id", flat=True).first
    consumer = "tests.testapp.consumers.AllEvents"
    first = spawn("runworker", consumer, env=FAST)

    def caught_up():
        row = ConsumerCheckpoint.objects.filter(name="all_events").first()
        return row is not None and row.position == head() and row.running_by

    wait_until(caught_up, 30, message="the consumer at the head")
    quiet = view(admin_client)
    assert fired(quiet, quiet) == {}
    first.kill()
    OrderEvent.objects.bulk_create(OrderEvent() for _ in range(50))
    time.sleep(3.5)  # the lease: until then, as far as anyone can tell, it may run
    label = [(("consumer", "all_events"),)]
    assert consumer_rules(view(admin_client)) == {"ConsumerNotRunning": label}
    # Ten minutes later, as far as the checkpoint row can tell (it was last seen at
    # the head then): behind for that long.
    ConsumerCheckpoint.objects.update(caught_up_at=timezone.now() - timedelta(minutes=11))
    assert consumer_rules(view(admin_client)) == {
        "ConsumerNotRunning": label,
        "ConsumerStuck": label,
    }

    second = spawn("runworker", consumer, env=FAST)
    wait_until(caught_up, 30, message="the second worker at the head")
    wait_until(lambda: consumer_rules(view(admin_client)) == {}, 10, message="quiet")
    second.signal(signal.SIGSTOP)  # a batch that hangs holds the consumer the same way
    OrderEvent.objects.bulk_create(OrderEvent() for _ in range(7))
    time.sleep(3.5)
    assert consumer_rules(view(admin_client)) == {"ConsumerNotRunning": label}
    second.signal(signal.SIGCONT)
    wait_until(caught_up, 30, message="the resumed worker at the head")
    wait_until(lambda: consumer_rules(view(admin_client)) == {}, 10, message="quiet")
    second.signal(signal.SIGTERM)
    assert second.wait(30) == 0, second.output


def test_worker_rules_fire_from_the_first_reset_and_failure(spawn, admin_client, settings):
    """Finding 9 (and 12): the first reset and the first failures of a worker make
    JobsStalled and JobFailureRateHigh fire between two scrapes of its port; jobs that
    waited a minute make QueueWaitHigh fire; the worker gone, NoLiveWorker fires."""
    settings.ROOT_URLCONF = "tests.test_metrics"
    settings.DBWORKER = {**settings.DBWORKER, "HANDLERS": [HANDLER]}
    port = free_port()
    worker = spawn(
        "runworker", HANDLER, "--metrics-port", str(port), "--metrics-address", "127.0.0.1"
    )
    wait_until(lambda: WorkerProcess.objects.exists(), 30, message="the worker")
    start = wait_until(lambda: _served(port), 30, message="the metrics server")
    assert fired(start, start) == {}
    long_ago = timezone.now() - timedelta(hours=1)
    JobFactory(
        state="processing", started_at=long_ago, last_heartbeat_at=long_ago,
        worker_hostname="gone:1:abc", behavior="ok",
    )  # fmt: skip
    JobFactory.create_batch(3, behavior="ok", queued_at=timezone.now() - timedelta(minutes=2))
    JobFactory.create_batch(2, behavior="nonretryable")
    done = {"completed", "failed"}
    wait_until(lambda: QueueJob.objects.filter(state__in=done).count() == 6, 30, message="jobs")
    handler = (("handler", HANDLER),)
    end = wait_until(
        lambda: (f := _served(port)) and "JobsStalled" in fired(start, f) and f,
        20,
        message="the reset in a scrape",
    )
    assert fired(start, end) == {
        "JobsStalled": [(("model", "testapp.QueueJob"),)],
        "JobFailureRateHigh": [handler],
        "QueueWaitHigh": [(*handler, ("queue", ""))],
    }
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output
    gone = view(admin_client)
    assert fired(gone, gone) == {"NoLiveWorker": [handler]}
    JobFactory(behavior="ok", queued_at=timezone.now() - timedelta(minutes=10))
    waiting = view(admin_client)
    assert fired(waiting, waiting) == {
        "NoLiveWorker": [handler],
        "JobsWaitingTooLong": [(("model", "testapp.QueueJob"),)],
    }


def _served(port):
    try:
        return (time.time(), scrape(port))
    except OSError:
        return None
