"""The edges of ordered consumers (issue 29), with real ``runworker`` processes: an
at-least-once batch slower than its timeout, a batch that hangs for good, workers that
declare different consumers, a worker stopped by SIGSTOP mid-batch and resumed after
another took its consumer over.

The lease is 3 s and the rebalancing interval 1 s (``tests.settings`` reads them from
the environment), as in the ownership test. PostgreSQL and MariaDB: consumers run in
one process on SQLite (tests/test_consumers.py has the single-process cases).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from django_dbworker.models import ConsumerCheckpoint, WorkerProcess
from tests.chaos.conftest import ROW_LOCKS_ONLY, say, wait_for, worker_env
from tests.testapp.models import Handled, OrderEvent, SinkFence

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.subprocess,
    *ROW_LOCKS_ONLY,
    pytest.mark.django_db(transaction=True, reset_sequences=True),
    pytest.mark.timeout(120),
]

CONSUMERS = "tests.testapp.consumers."
FAST = {"DBWORKER_TEST_CONSUMER_LEASE": "3", "DBWORKER_TEST_CONSUMER_REBALANCE_INTERVAL": "1"}


def env(**extra):
    return {**worker_env(), **FAST, **extra}


def positions(name, **filters):
    rows = Handled.objects.filter(consumer=name, **filters).order_by("id")
    return list(rows.values_list("position", flat=True))


def checkpoint(name):
    return ConsumerCheckpoint.objects.filter(name=name).first()


def worker_of(proc):
    return WorkerProcess.objects.filter(pid=proc.proc.pid).values_list("worker_id", flat=True)


def test_an_at_least_once_batch_past_its_timeout_is_done_once(spawn):
    """Finding 1: 1.3 s batches with a 1 s timeout; each effect happens once and the
    checkpoint reaches the head (it used to redo the first batch for ever)."""
    ids = [e.pk for e in OrderEvent.objects.bulk_create(OrderEvent() for _ in range(8))]
    worker = spawn(
        "runworker", CONSUMERS + "SlowAtLeastOnce", env=env(DBWORKER_TEST_BATCH_SLEEP="1.3")
    )
    wait_for(
        lambda: (row := checkpoint("slow_at_least_once")) and row.position == ids[-1],
        30,
        "the checkpoint at the head",
    )
    time.sleep(1.5)  # nothing more is done
    assert positions("slow_at_least_once") == ids
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output
    assert "counted as failed" in worker.output  # the watchdog saw each batch run late


@pytest.mark.parametrize("name", ["Hangs", "HangsAtLeastOnce"])
def test_a_hung_batch_ends_its_worker_and_another_takes_over(spawn, name):
    """Finding 3: a batch that never returns counts a failure at each batch_timeout; at
    max_failures (2) its process drains and exits 1, and a live worker that declares
    the consumer too runs it from its checkpoint."""
    consumer = "hangs" if name == "Hangs" else "hangs_at_least_once"
    ids = [e.pk for e in OrderEvent.objects.bulk_create(OrderEvent() for _ in range(3))]
    hung = spawn("runworker", CONSUMERS + name, env=env(DBWORKER_TEST_HANG="1"))
    wait_for(lambda: (row := checkpoint(consumer)) and row.running_by, 30, "the first worker")
    hung_id = checkpoint(consumer).running_by
    spare = spawn("runworker", CONSUMERS + name, env=env())
    wait_for(lambda: worker_of(spare).exists(), 30, "the second worker")
    started = time.monotonic()
    failing_seen = 0
    while hung.proc.poll() is None:
        # Handled rows first: seen while the hung worker still runs the consumer, they
        # would have been committed by the spare while it was held. (The hung worker
        # gives the consumer up when it drains, before its process has ended.)
        handled = positions(consumer)
        row = checkpoint(consumer)
        if row.failing:
            failing_seen = max(failing_seen, row.failures)
        assert time.monotonic() - started < 30, "the hung worker did not end"
        if row.running_by == hung_id:
            assert not handled, "the spare ran the consumer while it was held"
        time.sleep(0.05)
    took = time.monotonic() - started
    assert hung.wait(5) == 1, hung.output
    assert "counted as failed (2 in a row, max_failures 2)" in hung.output
    assert "ending this worker process so that another one runs it" in hung.output
    wait_for(lambda: checkpoint(consumer).position == ids[-1], 30, "the spare to run the consumer")
    assert positions(consumer) == ids
    row = checkpoint(consumer)
    assert (row.failing, row.failures) == (False, 0)
    assert row.running_by == worker_of(spare).get()
    say(f"{consumer}: the hung worker was gone {took:.1f}s after the spare joined")
    # "counted as failed (2 in a row" above is the count written to the row (PostgreSQL);
    # the row reads failing only from then until the spare takes over, a window a loaded
    # host's polls can miss (CI did), so it is reported, not asserted.
    say(f"{consumer}: seen failing with {failing_seen} failures")
    spare.signal(signal.SIGTERM)
    assert spare.wait(30) == 0, spare.output


def test_workers_that_declare_different_consumers_share_them(spawn):
    """Finding 4: a worker declaring bal_b and bal_c beside one declaring all four gets
    those two (round-robin gave it one of them, or none)."""
    everything = [CONSUMERS + f"Bal{c}" for c in "ABCD"]
    big = spawn("runworker", *everything, env=env())
    small = spawn("runworker", CONSUMERS + "BalB", CONSUMERS + "BalC", env=env())
    wait_for(lambda: worker_of(big).exists() and worker_of(small).exists(), 30, "both workers")
    ids = {"big": worker_of(big).get(), "small": worker_of(small).get()}
    want = {"bal_a": ids["big"], "bal_b": ids["small"], "bal_c": ids["small"], "bal_d": ids["big"]}

    def settled():
        rows = dict(ConsumerCheckpoint.objects.values_list("name", "running_by"))
        owners = dict(ConsumerCheckpoint.objects.values_list("name", "owner"))
        return rows == want and owners == want

    wait_for(settled, 30, f"the balanced assignment {want}")
    events = [e.pk for e in OrderEvent.objects.bulk_create(OrderEvent() for _ in range(20))]
    for name in want:
        wait_for(lambda n=name: positions(n) == events, 30, f"{name} to run")
    workers = dict(Handled.objects.values_list("consumer", "worker").distinct())
    assert workers == {
        "bal_a": str(big.proc.pid),
        "bal_b": str(small.proc.pid),
        "bal_c": str(small.proc.pid),
        "bal_d": str(big.proc.pid),
    }
    for proc in (big, small):
        proc.signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.output


def test_a_stopped_process_resumed_after_a_takeover_is_fenced(spawn, tmp_path):
    """Finding 6: at least once, a process stopped (SIGSTOP) in the middle of a batch
    and resumed after another took the consumer over still runs the rest of that
    batch: its batches overlap the new owner's. The generation handed to handle_batch
    lets the sink refuse it: every accepted write is in order, exactly once."""
    log = tmp_path / "batches.log"
    log.touch()
    ids = [e.pk for e in OrderEvent.objects.bulk_create(OrderEvent() for _ in range(30))]
    common = {"DBWORKER_TEST_BATCH_LOG": str(log)}
    first = spawn(
        "runworker", CONSUMERS + "FencedSink", env=env(DBWORKER_TEST_BATCH_SLEEP="0.4", **common)
    )
    pid = first.proc.pid

    def inside_a_second_batch():
        lines = [line.split() for line in log.read_text().splitlines()]
        mine = [kind for kind, _, _, p, _ in lines if int(p) == pid]
        return mine.count("end") >= 1 and mine.count("start") == mine.count("end") + 1

    wait_for(inside_a_second_batch, 30, "the first worker inside a batch", interval=0.01)
    first.signal(signal.SIGSTOP)
    stopped_at = checkpoint("fenced_sink").position
    in_flight = [p for p in ids if stopped_at < p <= stopped_at + 5]
    say(f"SIGSTOP {pid} with positions {in_flight[0]}..{in_flight[-1]} in flight")
    second = spawn("runworker", CONSUMERS + "FencedSink", env=env(**common))
    wait_for(lambda: positions("fenced_sink") == ids, 30, "the second worker to take over")
    first.signal(signal.SIGCONT)
    wait_for(
        lambda: positions("fenced_sink:refused") == in_flight, 30, "the late write to be refused"
    )
    for proc in (first, second):
        proc.signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.output

    spans = batch_spans(log)
    late = [s for s in spans if s[0] == pid][-1]
    taken = [s for s in spans if s[0] == second.proc.pid]
    assert taken
    assert late[1] < taken[0][1] < late[2], "the batches did overlap"
    accepted = list(Handled.objects.filter(consumer="fenced_sink").order_by("id"))
    assert [h.position for h in accepted] == ids  # in order, exactly once
    generations = [int(h.worker.split(":")[1]) for h in accepted]
    assert generations == sorted(generations)
    refused = Handled.objects.filter(consumer="fenced_sink:refused").values_list("worker")
    assert {w for (w,) in refused} == {f"{pid}:{generations[0]}"}
    assert SinkFence.objects.get().generation == generations[-1] > generations[0]


def batch_spans(path: Path) -> list[tuple[int, float, float]]:
    """(pid, start, end) of each batch in the log (start|end name host pid time)."""
    spans, open_at = [], {}
    for line in path.read_text().splitlines():
        kind, _, _, pid, at = line.split()
        if kind == "start":
            open_at[int(pid)] = float(at)
        else:
            spans.append((int(pid), open_at.pop(int(pid)), float(at)))
    return spans
