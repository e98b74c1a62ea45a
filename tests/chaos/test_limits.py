"""Fleet-wide limits under kill -9 and load (issue 13): never more than the limits at
once, per key in order, nothing lost; a rate limit used to the full and never exceeded.

Full sizes with ``DBWORKER_CHAOS_FULL=1`` (docs/reliability.md, docs/flow-control.md).
"""

import itertools
import signal
import time
from collections import Counter

import pytest

from tests.conftest import test_database_url as database_url
from tests.testapp.models import TenantJob

from .conftest import (
    FULL,
    Fleet,
    audit,
    kill_until_done,
    limit_audit,
    recorded_attempts,
    say,
    scale,
    tenant_jobs,
    unfinished,
    wait_for,
    within,
)

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.django_db(transaction=True),
]

HANDLER = "tests.testapp.handlers.LimitedChaosHandler"  # 5 at once, 1 per tenant
#: The same limits with fair claims across the tenants (issue 43): they stay exact.
FAIR_HANDLER = "tests.testapp.handlers.FairLimitedChaosHandler"
MAX_CONCURRENCY, PER_KEY = 5, 1
KEYS = 50
JOBS = scale(1_000, 20_000)
WORKERS = scale(3, 8)
HANDLERS = scale(8, 16)
KILL_EVERY = scale((1.5, 3.0), (4.0, 8.0))
KILLS = scale(2, 10)  # at least, whatever the pace


@pytest.mark.timeout(scale(300, 3600))
@pytest.mark.parametrize("handler", [HANDLER, FAIR_HANDLER], ids=["ordered", "fair"])
def test_limits_hold_across_the_fleet_under_kill_9(spawn, handler):
    tenant_jobs(JOBS, KEYS)
    started = time.monotonic()
    resetter = spawn("runresetter", handler, "--interval", "0.5")
    # Handler threads close their connection after each job (CONN_MAX_AGE=0): 8 × 16
    # threads keeping one each would pass PostgreSQL's max_connections (100), and only
    # MAX_CONCURRENCY of them run at once.
    fleet = Fleet(
        spawn,
        handler,
        WORKERS,
        "--no-resetter",
        "--num-handlers",
        str(HANDLERS),
        env={"DATABASE_URL": database_url()},
    )
    kill_until_done(
        fleet,
        lambda: unfinished(TenantJob),
        started + within(240, 3300),
        KILL_EVERY,
        spare=MAX_CONCURRENCY,
        model=TenantJob,
        at_least=KILLS,
    )
    duration = time.monotonic() - started
    assert set(fleet.stop()) == {0}, fleet.output()
    resetter.signal(signal.SIGTERM)
    assert resetter.wait(30) == 0, resetter.output

    report = audit(fleet.died_at, resetter.output, model=TenantJob)
    overall, worst_key, out_of_order = limit_audit(fleet.died_at)
    say(
        f"limits under kill -9 ({handler.rsplit('.', 1)[1]}): {WORKERS} workers x "
        f"{HANDLERS} handlers, {fleet.kills} kills, "
        f"{report.summary()}, peak overlap {overall} (limit {MAX_CONCURRENCY}), per key "
        f"{worst_key} (limit {PER_KEY}), out of order {out_of_order}, "
        f"{JOBS / duration:.0f} jobs/s in {duration:.0f}s; {report.problems}"
    )
    assert report.problems == []
    assert report.jobs == JOBS
    assert overall <= MAX_CONCURRENCY
    assert worst_key <= PER_KEY
    assert out_of_order == 0
    assert fleet.kills >= KILLS
    assert overall == MAX_CONCURRENCY  # the limit was used, not only kept


RATE = 50  # RateLimitChaosHandler: 50/s, the default burst
BURST = 3
SECONDS = scale(10, 60)


@pytest.mark.timeout(scale(120, 600))
def test_a_rate_limit_is_kept_and_used_by_several_workers(spawn):
    TenantJob.objects.bulk_create(
        TenantJob(tenant=None, behavior="ok") for _ in range(RATE * (SECONDS + 10))
    )
    handler = "tests.testapp.handlers.RateLimitChaosHandler"
    fleet = Fleet(spawn, handler, scale(2, 4), "--num-handlers", "4")
    wait_for(lambda: TenantJob.objects.filter(state="completed").exists(), 30, "a first job")
    time.sleep(SECONDS + 1)
    assert set(fleet.stop()) == {0}, fleet.output()
    starts = sorted(a.start for a in recorded_attempts() if a.start is not None)
    # Whole seconds after the first start, the last (partial) one left out.
    first = starts[0]
    windows = Counter(int(s - first) for s in starts)
    full = [windows.get(second, 0) for second in range(SECONDS)]
    used = sum(full) / (RATE * SECONDS)
    say(f"rate {RATE}/s burst {BURST}, {len(full)} windows: {full}; {used:.1%} of the limit used")
    # Starts are the handlers' own records, after the claim and a hand-off to a thread:
    # on a loaded host a job claimed late in one second starts early in the next (seen
    # in CI: [..., 46, 54, ...]). The bucket's bound holds over any stretch of claims:
    # whole (no start comes before the first) and over any two seconds, give or take
    # the claims of the hand-off's lag (seen in CI after a stall: [..., 35, 51, 53, ...],
    # 104 in two seconds: 20 ms of claims at 50/s). A limiter that over-issues takes a
    # second worker's share: far more.
    lag = RATE // 20  # 50 ms of claims
    assert sum(full) <= RATE * SECONDS + BURST + lag
    assert max(a + b for a, b in itertools.pairwise(full)) <= 2 * RATE + BURST + lag
    # Used, not only kept: a limiter that under-issues (workers starving each other of
    # tokens) uses half or less. A loaded 2-core host stalls the workers now and then
    # (seen in CI: [..., 49, 46, 41, 35, 50, ...], 94.2 %; on MariaDB [51, 50, 43, 50, 38,
    # 36, 42, 41, 38, 16], 81 %), so not every token is taken.
    assert used >= 0.75
    if FULL:
        assert len(full) >= 60
