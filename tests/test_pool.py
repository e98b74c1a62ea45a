"""A shared pool (``runworker --pool N``): every handler of a worker on one set of slots,
handed out by weight (gocraft's queue priorities). The same tests on SQLite and
PostgreSQL; the handlers share one table, as users' handlers often do."""

import collections
import time

import pytest
from django.db.models import Count, Q

from django_dbworker import Handler
from django_dbworker.control.pause import pause, resume
from tests.conftest import wait_until
from tests.testapp.models import QueueJob

pytestmark = pytest.mark.django_db(transaction=True)


class Weighted(Handler):
    model = QueueJob
    interval = 0.05
    heartbeat_interval = 0.5
    stalled_max_age = 20

    def handle(self, job):
        seconds = job.payload.get("seconds")
        if seconds:
            time.sleep(seconds)


def weighted(label, weight, **options):
    """A handler of the jobs whose ``behavior`` is ``label``."""
    attrs = {"weight": weight, "dequeue_filter": Q(behavior=label), "name": f"pool:{label}"}
    return type(f"Weighted_{label}", (Weighted,), {**attrs, **options})()


def enqueue(label, count, **payload):
    QueueJob.objects.bulk_create(QueueJob(behavior=label, payload=payload) for _ in range(count))


def completed():
    rows = QueueJob.objects.filter(state="completed").values_list("behavior").annotate(Count("id"))
    return collections.Counter(dict(rows))


def running(label):
    return QueueJob.objects.filter(behavior=label, state="processing").count()


def test_slots_go_by_weight(run_worker):
    """Weights 1, 10 and 100 on a pool of 8, every handler with a deep backlog of short
    jobs: their shares of several thousand jobs are 1:10:100."""
    backlogs = {"a": 1000, "b": 2000, "c": 8000}  # each far beyond its share of 3,000
    for label, count in backlogs.items():
        enqueue(label, count)
    handlers = [weighted("a", 1), weighted("b", 10), weighted("c", 100)]
    tw = run_worker(handlers, pool=8)
    wait_until(lambda: sum(completed().values()) >= 3000, 120, 0.2, "3,000 jobs")
    assert tw.stop() == 0
    done = completed()
    total = sum(done.values())
    shares = {label: done[label] / total for label in ("a", "b", "c")}
    assert shares["a"] == pytest.approx(1 / 111, abs=0.01), done
    assert shares["b"] == pytest.approx(10 / 111, abs=0.03), done
    assert shares["c"] == pytest.approx(100 / 111, abs=0.03), done
    assert all(done[label] < count for label, count in backlogs.items()), done  # all deep


def test_a_light_handler_is_never_starved(run_worker):
    enqueue("heavy", 4000)
    enqueue("light", 20)
    tw = run_worker([weighted("heavy", 1000), weighted("light", 1)], pool=4)
    wait_until(lambda: completed()["light"] >= 2, 120, 0.2, "the light handler's jobs")
    assert tw.stop() == 0
    done = completed()
    assert done["heavy"] < 4000  # it ran while the heavy one still had work
    assert done["light"] / (done["light"] + done["heavy"]) == pytest.approx(1 / 1001, abs=0.002)


def test_after_a_heavy_handler_runs_out_the_others_share_by_weight_at_once(run_worker):
    """Issue 42 item 15 (a): on a pool of one slot (one draw per job), a handler of weight
    100 runs out of jobs; from then on the two of weight 1 alternate. The draw used to
    keep each handler's weight of the draws with the heavy one, and one of them took
    the next 40-odd slots."""
    enqueue("heavy", 50)
    enqueue("b", 40)
    enqueue("c", 40)
    handlers = [weighted("heavy", 100), weighted("b", 1), weighted("c", 1)]
    tw = run_worker(handlers, pool=1)
    wait_until(lambda: sum(completed().values()) == 130, 120, 0.2, "every job")
    assert tw.stop() == 0
    order = list(QueueJob.objects.order_by("started_at", "id").values_list("behavior", flat=True))
    last_heavy = max(i for i, label in enumerate(order) if label == "heavy")
    after = "".join(order[last_heavy + 1 :][:30])
    assert len(after) == 30, order
    assert set(after) == {"b", "c"}, order
    for k in range(1, 31):  # every stretch from there: within one slot of half each
        assert abs(after[:k].count("b") - k / 2) <= 1, after


def test_a_paused_or_limited_handlers_share_goes_to_the_others_at_once(run_worker):
    """Long jobs fill a pool of 4. A heavy handler takes (almost) all of it; paused, it
    gives the slots up as its jobs end and the light one takes them; held at a fleet-wide
    max_concurrency of 1, it keeps one and the light one gets the other three."""
    enqueue("heavy", 200, seconds=0.3)
    enqueue("light", 200, seconds=0.3)
    heavy = weighted("heavy", 1000)
    tw = run_worker([heavy, weighted("light", 1)], pool=4)
    wait_until(lambda: running("heavy") == 4, 20, message="the heavy handler to fill the pool")
    assert pause(heavy.get_name())
    # The rows say "processing" until the writer has written the outcomes (batched).
    wait_until(
        lambda: running("light") == 4 and running("heavy") == 0,
        20,
        message="the light one to take every slot",
    )
    assert resume(heavy.get_name())
    wait_until(lambda: running("heavy") == 4, 20, message="the heavy one to take them back")
    assert tw.stop() == 0
    QueueJob.objects.filter(state="processing").update(state="queued")
    limited = weighted("heavy", 1000, max_concurrency=1)
    tw = run_worker([limited, weighted("light", 1)], pool=4)
    wait_until(
        lambda: running("heavy") == 1 and running("light") == 3,
        20,
        message="the limited handler to keep one slot and the light one to get three",
    )
    assert tw.stop() == 0


def test_a_handlers_ceiling_holds_in_the_pool(run_worker):
    enqueue("capped", 100, seconds=0.3)
    enqueue("other", 100, seconds=0.3)
    tw = run_worker([weighted("capped", 1000, num_handlers=2), weighted("other", 1)], pool=6)
    wait_until(
        lambda: running("capped") == 2 and running("other") == 4,
        20,
        message="the capped handler at its ceiling and the rest to the other",
    )
    assert tw.stop() == 0


class PoolLight(Weighted):
    weight = 1
    dequeue_filter = Q(behavior="light")


class PoolHeavy(Weighted):
    weight = 100
    num_handlers = 3
    dequeue_filter = Q(behavior="heavy")


LIGHT, HEAVY = "tests.test_pool.PoolLight", "tests.test_pool.PoolHeavy"


@pytest.mark.subprocess
def test_the_pool_is_shown_in_the_registry_status_admin_and_metrics(spawn, admin_client, settings):
    """``runworker --pool``: each handler's weight, its share of the last minutes and the
    pool's busy slots, wherever an operator looks (the dashboard: of the handlers the
    settings name; the registry's names are labels only)."""
    import signal
    from io import StringIO

    settings.DBWORKER = {**settings.DBWORKER, "HANDLERS": [LIGHT, HEAVY]}

    from django.core.management import call_command

    from django_dbworker.models import WorkerProcess
    from tests.test_metrics import free_port, serving, value

    enqueue("light", 40, seconds=0.2)
    enqueue("heavy", 40, seconds=0.2)
    port = free_port()
    worker = spawn("runworker", LIGHT, HEAVY, "--pool", "4", "--metrics-port", str(port))

    def reported():
        if worker.proc.poll() is not None:
            pytest.fail(f"the worker exited:\n{worker.output}")
        return WorkerProcess.objects.filter(pool__isnull=False).first()

    row = wait_until(
        lambda: (
            (w := reported())
            and w.pool["busy"] == 4
            and w.pool["handlers"][PoolHeavy().get_name()]["share"] > 0
            and w
        ),
        30,
        0.1,
        "the pool in the registry",
    )
    heavy = row.pool["handlers"][PoolHeavy().get_name()]
    assert (row.pool["size"], heavy["weight"], heavy["ceiling"]) == (4, 100, 3)
    assert row.pool["handlers"][PoolLight().get_name()]["ceiling"] == 4
    out = StringIO()
    call_command("dbworker_status", stdout=out)
    assert "    pool of 4 slots, " in out.getvalue()
    assert f"    {PoolHeavy().get_name()}: weight 100, " in out.getvalue()
    page = admin_client.get(f"/admin/django_dbworker/workerprocess/{row.pk}/change/")
    assert f"{PoolLight().get_name()}: weight 1, " in page.content.decode()
    board = admin_client.get("/admin/testapp/queuejob/dashboard/").content.decode()
    assert "of a pool of 4" in board
    figures = wait_until(lambda: serving(port), 30, message="the metrics")
    assert value(figures, "dbworker_pool_slots") == 4
    assert value(figures, "dbworker_handler_weight", handler=PoolHeavy().get_name()) == 100
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output


class PoolSlow(Weighted):
    weight = 1000
    dequeue_filter = Q(behavior="slow")


class PoolAhead(Weighted):
    weight = 1
    prefetch = 2
    dequeue_filter = Q(behavior="ahead")


@pytest.mark.subprocess
def test_sigterm_requeues_jobs_claimed_ahead_behind_another_handlers_running_jobs(spawn):
    """Issue 42 item 15 (b): on a pool of 2, two slow jobs of one handler take both
    threads and another handler claims 2 jobs ahead (its ``prefetch``), which wait
    behind them. At SIGTERM those 2 go back to the queue unrun, as they do without a
    pool; the slow ones finish. They used to be counted as waiting for their own
    handler's idle threads (a pool handler's ceiling is the pool's size), and ran."""
    import signal

    enqueue("slow", 2, seconds=3)
    enqueue("ahead", 2)
    worker = spawn(
        "runworker", "tests.test_pool.PoolSlow", "tests.test_pool.PoolAhead", "--pool", "2"
    )

    def claimed():
        if worker.proc.poll() is not None:
            pytest.fail(f"the worker exited:\n{worker.output}")
        return running("slow") == 2 and running("ahead") == 2

    wait_until(claimed, 30, 0.05, "2 slow jobs running and 2 claimed ahead")
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output
    rows = collections.Counter(QueueJob.objects.values_list("behavior", "state"))
    assert rows == {("slow", "completed"): 2, ("ahead", "queued"): 2}, worker.output
    assert worker.output.count("requeued unrun: the worker stopped") == 2, worker.output
