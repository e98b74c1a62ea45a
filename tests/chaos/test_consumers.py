"""Consumers under concurrent writers with late commits and rollbacks (PostgreSQL and
MariaDB: on SQLite writers serialize and rowids are reused, so there are no gaps to
test).

Every committed event is handled exactly once per consumer, in position order; the
positions passed as gaps are exactly rolled-back ones. Sizes: CI 8 writers x 300
events; full (DBWORKER_CHAOS_FULL=1) 8 x 12,500 = 100,000.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from django_dbworker.models import ConsumerCheckpoint, ConsumerGapSkip
from tests.chaos.conftest import ROW_LOCKS_ONLY, Fleet, say, scale, within, worker_env
from tests.testapp.models import Handled, OrderEvent

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.django_db(transaction=True, reset_sequences=True),
    *ROW_LOCKS_ONLY,
    pytest.mark.timeout(scale(120, 1800)),
]

ROOT = Path(__file__).resolve().parents[2]
CONSUMERS = [
    "tests.testapp.consumers.AllEvents",
    "tests.testapp.consumers.Orders",
    "tests.testapp.consumers.Audit",
]
WRITERS = 8


def test_gaps_under_concurrent_writers(spawn, tmp_path):
    per_writer = scale(300, 12_500)
    env = worker_env()
    started = time.monotonic()
    fleet = Fleet(spawn, CONSUMERS, 3, env=env)
    logs = [open(tmp_path / f"writer{n}.log", "w") for n in range(WRITERS)]  # noqa: SIM115
    writers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.consumer_writer", str(per_writer), str(n), "1.0"],
            cwd=ROOT,
            env={**os.environ, **env, "DJANGO_SETTINGS_MODULE": "tests.settings"},
            stdout=logs[n],
            stdin=subprocess.DEVNULL,  # not a terminal's: no Ctrl-C supervisor
        )
        for n in range(WRITERS)
    ]
    for w in writers:
        assert w.wait(timeout=scale(60, 900)) == 0
    for log in logs:
        log.close()
    committed, rolled_back = set(), set()
    for n in range(WRITERS):
        for line in (tmp_path / f"writer{n}.log").read_text().splitlines():
            kind, pk = line.split()
            (committed if kind == "commit" else rolled_back).add(int(pk))
    say(f"writers done: {len(committed)} committed, {len(rolled_back)} rolled back")
    assert committed == set(OrderEvent.objects.values_list("id", flat=True))
    orders = set(OrderEvent.objects.filter(aggregate_type="Order").values_list("id", flat=True))
    head = max(committed)
    expected = {"all_events": committed, "audit": committed, "orders": orders}
    deadline = time.monotonic() + within(45, 600)
    while True:
        positions = dict(ConsumerCheckpoint.objects.values_list("name", "position"))
        if len(positions) == 3 and all(p >= head for p in positions.values()):
            break
        assert fleet.replace_dead() == 0, fleet.output()
        if time.monotonic() > deadline:
            errors = list(ConsumerCheckpoint.objects.values_list("name", "last_error", "owner"))
            pytest.fail(
                f"consumers did not reach {head}: {positions} {errors}\n{fleet.output()[-3000:]}"
            )
        time.sleep(0.5)
    elapsed = time.monotonic() - started
    say(f"all consumers at the head after {elapsed:.1f}s")
    for name, want in expected.items():
        got = list(
            Handled.objects.filter(consumer=name).order_by("id").values_list("position", flat=True)
        )
        assert len(got) == len(set(got)), f"{name}: handled twice"
        assert got == sorted(got), f"{name}: out of order"
        assert set(got) == want, f"{name}: missing {sorted(want - set(got))[:10]}"
    for name in expected:
        skipped = set()
        for first, last in ConsumerGapSkip.objects.filter(consumer=name).values_list(
            "first_position", "last_position"
        ):
            skipped.update(range(first, last + 1))
        assert skipped <= rolled_back, f"{name} passed committed positions"
        assert skipped == {p for p in rolled_back if p < head}, f"{name}: gaps not audited"
        handled = Handled.objects.filter(consumer=name).count()
        rows = ConsumerGapSkip.objects.filter(consumer=name).count()
        say(
            f"{name}: {handled} handled of {len(expected[name])}, duplicates 0, skipped 0; "
            f"audited {len(skipped)} rolled-back positions in {rows} gap rows"
        )
