"""Fleet-wide concurrency and rate limits (issue 13): the claim statement against the
real database, then real workers. The same tests on SQLite, PostgreSQL and MariaDB."""

import threading
import time

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from django_dbworker import RateLimit
from django_dbworker.checks import validate_handler
from django_dbworker.control.limits import limits_usage
from django_dbworker.control.models import RateBucket
from django_dbworker.runtime.lane import Lane, LaneCallbacks
from django_dbworker.sql.connection import Connection
from django_dbworker.sql.limits import LOCK_CLASS
from tests.conftest import wait_until
from tests.testapp import handlers as h
from tests.testapp.models import Event, TenantJob

pytestmark = pytest.mark.django_db(transaction=True)


class Collected:
    """An executor that keeps what the lane hands it (the jobs stay claimed)."""

    def __init__(self, run):
        self.attempts = []

    def start(self):
        pass

    def submit(self, attempt):
        self.attempts.append(attempt)

    def stop(self):
        pass

    def join(self, timeout):
        pass


class Claims:
    """Claims of a handler by one worker id, on a private connection: what a worker's
    dispatcher runs, without running the jobs."""

    def __init__(self, handler, worker="host:1:aaaaaa", holds_reset_job=False):
        callbacks = LaneCallbacks(
            submit=lambda attempt, outcome: None,
            slot_free=lambda lane: None,
            released=lambda lane: None,
            held_ids=lambda model: list(self.lane.held),
            holds_reset_job=lambda: holds_reset_job,
            writing=lambda: True,
        )
        self.lane = Lane(handler, worker, callbacks, executor=Collected)
        self.conn = Connection("default", "test")

    def __call__(self, limit=10):
        self.lane.executor.attempts.clear()
        self.lane.claim(self.conn, limit)
        return [a.job for a in self.lane.executor.attempts]

    @property
    def held_back(self):
        return self.lane.claimer.held_back

    def close(self):
        self.conn.close()


@pytest.fixture
def claims():
    made = []

    def make(handler, **kwargs):
        made.append(Claims(handler, **kwargs))
        return made[-1]

    yield make
    for c in made:
        c.close()


def tenants(jobs):
    return [job.tenant for job in jobs]


def finish(*jobs):
    TenantJob.objects.filter(pk__in=[j.pk for j in jobs]).update(state="completed")


# -- concurrency -------------------------------------------------------------------------


def test_max_concurrency_counts_the_handlers_processing_rows_across_workers(claims):
    TenantJob.objects.bulk_create(TenantJob(tenant=None) for _ in range(10))
    first = claims(h.LimitedHandler(max_concurrency_per_key=None))
    second = claims(h.LimitedHandler(max_concurrency_per_key=None), worker="host:2:bbbbbb")
    assert len(first(2)) == 2
    assert len(second(10)) == 1  # 3 at once, whoever claims them
    assert second.held_back
    assert second(10) == []
    assert second.held_back  # held back, not drained
    finish(*TenantJob.objects.filter(worker_hostname="host:1:aaaaaa"))
    assert len(second(10)) == 2
    assert TenantJob.objects.filter(state="processing").count() == 3


def test_one_job_per_key_in_ordering_and_a_full_key_holds_nobody_back(claims):
    # Tenant 1 has many jobs at the head of the queue: they must not hold back tenant 2.
    TenantJob.objects.bulk_create(TenantJob(tenant=1) for _ in range(100))
    TenantJob.objects.bulk_create([TenantJob(tenant=2), TenantJob(tenant=2)])
    TenantJob.objects.create(tenant=None)
    claim = claims(h.LimitedHandler(max_concurrency=10))
    taken = claim(10)
    # One of tenant 1 (its first), one of tenant 2 (its first), the one without a key.
    assert tenants(taken) == [1, 2, None]
    first_of = {t: TenantJob.objects.filter(tenant=t).order_by("pk").first().pk for t in (1, 2)}
    assert [j.pk for j in taken[:2]] == [first_of[1], first_of[2]]
    assert tenants(claim(10)) == []  # each key is busy; the keyless job is taken
    finish(taken[0])
    assert tenants(claim(10)) == [1]  # tenant 1's next, in order


def test_a_worker_running_a_reset_job_keeps_each_keys_order(claims):
    """Its quarantine (no second reset job at once) must not let a key's next job run
    before the reset one that comes first."""
    first = TenantJob.objects.create(tenant=1, num_resets=1)
    TenantJob.objects.create(tenant=1)
    other = TenantJob.objects.create(tenant=2)
    claim = claims(h.LimitedHandler(), holds_reset_job=True)
    assert [j.pk for j in claim(10)] == [other.pk]
    assert [j.pk for j in claims(h.LimitedHandler(), worker="host:2:b")(10)] == [first.pk]


def test_a_canceled_job_gives_its_key_to_the_next_only_once_its_attempt_ends(claims):
    """Cancel x limits: a queued job canceled is never claimed and holds back nobody of
    its key; a running one asked to stop keeps its key's slot until its attempt ends."""
    running, queued, later = (TenantJob.objects.create(tenant=1) for _ in range(3))
    claim = claims(h.LimitedHandler())
    assert [j.pk for j in claim(10)] == [running.pk]
    assert TenantJob.objects.filter(pk__in=[running.pk, queued.pk]).cancel() == (1, 1)
    assert claim(10) == []  # the running one, flagged, still holds tenant 1
    finish(running)
    assert [j.pk for j in claim(10)] == [later.pk]  # the canceled one is passed over
    assert TenantJob.objects.get(pk=queued.pk).state == "canceled"


def test_bulk_enqueued_jobs_are_claimed_within_the_limits(claims):
    """Bulk enqueue x limits: rows written by ``bulk_enqueue`` (COPY on PostgreSQL)
    are held by the per-key and the handler's limits like any others."""
    jobs = [TenantJob(tenant=t) for t in (1, 1, 1, 2, 2, 3, 4, 5)]
    assert TenantJob.objects.bulk_enqueue(jobs) == 8
    claim = claims(h.LimitedHandler())
    assert sorted(tenants(claim(10))) == [1, 2, 3]  # max_concurrency 3, one per tenant
    assert claim(10) == []
    finish(*TenantJob.objects.filter(state="processing", tenant=1))
    assert tenants(claim(10)) == [1]


def test_a_paused_handler_takes_no_slot_and_no_token_and_resumes_within_its_limits(claims):
    """Pause x limits and rate limits: the claims of a paused handler take nothing,
    spend no token, and once resumed keep the limits as before."""
    from django_dbworker.control.pause import pause, resume

    TenantJob.objects.bulk_create(TenantJob(tenant=t) for t in (1, 1, 2, 3, 4))
    limited = claims(h.LimitedHandler())
    rated = claims(h.RateLimitedHandler(), worker="host:2:bbbbbb")  # 20/s, burst 2
    assert pause(h.LimitedHandler().get_name()) is True
    assert pause(h.RateLimitedHandler().get_name()) is True
    assert (limited(10), rated(10)) == ([], [])
    assert not RateBucket.objects.exists()  # no token spent
    assert resume(h.LimitedHandler().get_name()) is True
    assert sorted(tenants(limited(10))) == [1, 2, 3]  # max_concurrency 3, one per tenant
    assert limited(10) == []
    assert rated(10) == []  # still paused
    assert resume(h.RateLimitedHandler().get_name()) is True
    assert len(rated(10)) == 2  # its whole burst, kept while it was paused


def test_a_job_waiting_for_its_retry_does_not_hold_its_key(claims):
    """Limits x retry (docs/flow-control.md): an errored job waiting for its retry
    holds no slot of its key, so the key's next job runs first; made due again
    (``run_now``), it waits for its key's slot like any other."""
    from datetime import timedelta

    from django.utils import timezone

    first, second = TenantJob.objects.create(tenant=1), TenantJob.objects.create(tenant=1)
    claim = claims(h.LimitedHandler())
    assert [j.pk for j in claim(10)] == [first.pk]
    # What the error outcome writes for a retry due in an hour.
    TenantJob.objects.filter(pk=first.pk).update(
        state="errored", num_failures=1, process_after=timezone.now() + timedelta(hours=1)
    )
    # Another worker's claims (this one's lane still counts the first as its own).
    other = claims(h.LimitedHandler(), worker="host:2:bbbbbb")
    assert [j.pk for j in other(10)] == [second.pk]
    assert TenantJob.objects.filter(pk=first.pk).run_now() == 1
    assert other(10) == []  # tenant 1's slot is the second's
    finish(second)
    assert [j.pk for j in other(10)] == [first.pk]


class PausesElsewhere:
    """Reads the pause table from another database than the job tables' (a read
    replica's router does so for every model)."""

    def db_for_read(self, model, **hints):
        from django_dbworker.control.models import Pause

        return "elsewhere" if model is Pause else None


def test_a_pause_holds_whatever_the_router_says_of_the_pause_table(claims):
    """Pause x multi-database routing (docs/operations.md § Several databases): the pause
    is a condition of the claim statement, written beside the jobs it holds; a router
    that reads the pause table elsewhere (a replica router) changes nothing. Before,
    the claim dropped the condition there, and the paused handler's jobs were taken."""
    from django_dbworker.control.pause import pause

    TenantJob.objects.bulk_create(TenantJob(tenant=t) for t in (1, 2))
    assert pause(h.LimitedHandler().get_name()) is True
    assert claims(h.LimitedHandler())(10) == []
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.PausesElsewhere"]):
        assert claims(h.LimitedHandler(), worker="host:2:b")(10) == []


def test_rows_without_a_key_are_only_held_by_the_handlers_limit(claims):
    TenantJob.objects.bulk_create(TenantJob(tenant=None) for _ in range(5))
    assert tenants(claims(h.LimitedHandler(max_concurrency=4))(10)) == [None] * 4


def test_concurrent_claims_never_exceed_the_limits(claims):
    """Claims racing from several threads (each its own connection and worker id)."""
    TenantJob.objects.bulk_create(TenantJob(tenant=i % 5) for i in range(200))
    workers = [claims(h.LimitedHandler(), worker=f"host:{i}:x") for i in range(6)]
    peak, worst_key, stop = [0], [0], threading.Event()

    def watch():
        try:
            while not stop.is_set():
                running = list(
                    TenantJob.objects.filter(state="processing").values_list("tenant", flat=True)
                )
                peak[0] = max(peak[0], len(running))
                worst_key[0] = max([worst_key[0], *(running.count(t) for t in set(running))])
        finally:
            connection.close()

    def work(c):
        # Until this thread has finished 10 jobs: a fixed number of rounds can all fall
        # while the other threads hold the slots (seen in CI on SQLite on a loaded host:
        # 23 jobs in 180 rounds), which says nothing of the limits.
        done, deadline = 0, time.monotonic() + 30
        try:
            while done < 10 and time.monotonic() < deadline:
                jobs = c(3)
                finish(*jobs)
                done += len(jobs)
        finally:
            connection.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=work, args=(c,)) for c in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    watcher.join(10)
    assert peak[0] <= 3
    assert worst_key[0] <= 1
    assert TenantJob.objects.filter(state="completed").count() >= 60


# -- rate ------------------------------------------------------------------------------


class QuarterSecondHandler(h.RateLimitedHandler):
    """A token every 250 ms: a loaded host's stall between two claims (a limited claim
    is about nine round trips on MariaDB) does not bring one back unseen."""

    rate_limit = RateLimit("4/s", burst=2)


def test_a_rate_limit_takes_its_burst_then_a_token_per_period(claims):
    TenantJob.objects.bulk_create(TenantJob(tenant=None) for _ in range(20))
    claim = claims(QuarterSecondHandler())
    assert len(claim(10)) == 2
    assert claim(10) == []
    assert claim.held_back
    time.sleep(0.6)  # two tokens back
    assert len(claim(10)) == 2
    [bucket] = RateBucket.objects.all()
    assert bucket.name == QuarterSecondHandler().get_name()
    assert bucket.key == ""
    assert 0 <= bucket.tokens < 1


def test_an_empty_bucket_of_one_key_holds_back_no_other(claims):
    TenantJob.objects.bulk_create(TenantJob(tenant=1) for _ in range(10))
    TenantJob.objects.bulk_create(TenantJob(tenant=t) for t in (2, 3))
    claim = claims(h.KeyRateLimitedHandler())  # 5/s per tenant, burst 1
    assert sorted(tenants(claim(10))) == [1, 2, 3]
    assert claim(10) == []
    assert sorted(RateBucket.objects.values_list("key", flat=True)) == ["1", "2", "3"]
    time.sleep(0.25)
    assert tenants(claim(10)) == [1]


def test_a_bucket_full_again_before_its_claim_commits_is_not_written(claims):
    """A rate far from binding refills what a claim spends before the claim ends: no
    bucket row is written (a later claim finds the bucket full either way)."""
    TenantJob.objects.bulk_create(TenantJob(tenant=t % 3) for t in range(12))
    fast = RateLimit("1000000000000/s", burst=100)
    claim = claims(h.RateLimitedHandler(rate_limit=fast, rate_limit_per_key=fast))
    assert len(claim(10)) == 10
    assert not claim.held_back
    assert not RateBucket.objects.exists()


def test_rate_limit_strings_and_their_bursts():
    assert RateLimit("100/m").rate == pytest.approx(100 / 60)
    assert RateLimit("100/m").capacity == 1
    assert RateLimit("1000/s").capacity == 50
    assert RateLimit("20/10s").rate == 2
    assert RateLimit("5/s", burst=3).capacity == 3
    for bad in ("100", "0/s", "5/fortnight", "x/s"):
        with pytest.raises(ValueError, match="rate"):
            RateLimit(bad)


# -- workers, checks, status -------------------------------------------------------------


def test_workers_keep_the_limits_and_drain_the_queue(run_worker):
    TenantJob.objects.bulk_create(
        TenantJob(tenant=i % 4, behavior="sleep", payload={"seconds": 0.05}) for i in range(24)
    )
    workers = [run_worker(h.LimitedHandler()) for _ in range(2)]
    wait_until(
        lambda: TenantJob.objects.filter(state="completed").count() == 24, 30, message="drain"
    )
    for tw in workers:
        assert tw.stop() == 0
    spans = {}
    for job_id, kind, at in Event.objects.values_list("job_id", "kind", "at"):
        spans.setdefault(job_id, {})[kind] = at
    tenant_of = dict(TenantJob.objects.values_list("pk", "tenant"))
    points = sorted(
        (at, 1 if kind == "start" else -1, tenant_of[pk])
        for pk, span in spans.items()
        for kind, at in span.items()
    )
    running, per_key, peak = 0, {}, 0
    for _, step, tenant in points:
        running += step
        per_key[tenant] = per_key.get(tenant, 0) + step
        peak = max(peak, running)
        assert per_key[tenant] <= 1
    assert 1 <= peak <= 3


def test_limit_options_are_checked():
    class Bad(h.LimitedHandler):
        max_concurrency = 0
        concurrency_key = "no_such_field"
        rate_limit = "fast"

    class NoKey(h.LimitedHandler):
        concurrency_key = None
        rate_limit_per_key = "5/s"

    messages = [e.msg for e in validate_handler(Bad) if e.id == "dbworker.E012"]
    assert any("max_concurrency must be" in m for m in messages)
    assert any("concurrency_key 'no_such_field'" in m for m in messages)
    assert any("rate_limit: rate 'fast'" in m for m in messages)
    messages = [e.msg for e in validate_handler(NoKey) if e.id == "dbworker.E012"]
    assert any("max_concurrency_per_key needs concurrency_key" in m for m in messages)
    assert any("rate_limit_per_key needs concurrency_key" in m for m in messages)
    assert [e for e in validate_handler(h.LimitedHandler) if e.id == "dbworker.E012"] == []


def test_a_per_key_rate_limit_refuses_keys_longer_than_a_bucket_holds():
    """Issue 42, item 8: a key of 256 characters failed every claim of the handler on
    PostgreSQL ("value too long for type character varying(255)"), and a bucket key cut
    to fit would join two keys' buckets. A field that may hold such keys is refused."""
    from django_dbworker import Handler
    from tests.testapp.models import TextKeyJob

    class LongKeys(Handler):
        model = TextKeyJob
        concurrency_key = "group"  # a TextField
        rate_limit_per_key = "5/s"

        def handle(self, job):
            return None

    [message] = [e.msg for e in validate_handler(LongKeys) if e.id == "dbworker.E012"]
    assert "concurrency_key 'group' may hold more than 255 characters" in message
    # Only per-key rate limits keep keys in a bucket: a concurrency limit per key counts
    # rows, whatever the key's length.
    LongKeys.rate_limit_per_key, LongKeys.max_concurrency_per_key = None, 1
    assert [e for e in validate_handler(LongKeys) if e.id == "dbworker.E012"] == []


def test_usage_shows_the_busiest_keys(claims, capsys):
    TenantJob.objects.bulk_create(TenantJob(tenant=t) for t in (1, 1, 2, 3))
    claims(h.LimitedHandler(max_concurrency_per_key=2, max_concurrency=10))(10)
    usage = limits_usage(h.LimitedHandler(max_concurrency_per_key=2, max_concurrency=10))
    assert usage.running == 4
    assert usage.busiest[0] == ("1", 2)
    call_command("dbworker_status", "tests.testapp.handlers.LimitedHandler")
    out = capsys.readouterr().out
    assert "limits of tests.testapp.handlers.LimitedHandler:\n  4/3 running\n" in out
    assert "  busiest tenant values (at most 1 each): 1: 2, " in out


class LockHolder:
    """Another session that holds a handler's claim lock: PostgreSQL's advisory lock (in
    an open transaction: through a pooler in transaction mode that pins the server
    connection, which a session lock would not), MariaDB's named lock."""

    def __init__(self, lock):
        from django.db import connections

        self.wrapper = connections.create_connection("default")
        self.lock = lock

    def __enter__(self):
        if connection.vendor == "mysql":
            from django_dbworker.sql.mysql_locks import lock_name

            name = lock_name(connection.settings_dict["NAME"], self.lock)
            with self.wrapper.cursor() as cursor:
                cursor.execute("SELECT GET_LOCK(%s, 0)", [name])
        else:
            self.wrapper.set_autocommit(False)
            with self.wrapper.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", self.lock)
        return self

    def __exit__(self, *exc):
        if connection.vendor == "mysql":
            self.wrapper.close()  # the session's named lock goes with it
        else:
            self.wrapper.rollback()
            self.wrapper.set_autocommit(True)

    def close(self):
        self.wrapper.close()


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite's claims take its write lock")
def test_a_claim_that_cannot_get_the_lock_gives_up_and_the_connection_stays_usable():
    TenantJob.objects.create(tenant=1)
    with override_settings(DBWORKER={"STATEMENT_TIMEOUT": 0.2}):
        claim = Claims(h.LimitedHandler())
    holder = LockHolder((LOCK_CLASS, claim.lane.claimer.limits.lock_id))
    try:
        with override_settings(DBWORKER={"STATEMENT_TIMEOUT": 0.2}):
            with holder, pytest.raises(Exception, match=r"timeout|max_statement_time|giving up"):
                claim(1)
            assert tenants(claim(1)) == [1]  # the same connection, in a clean state
    finally:
        claim.close()
        holder.close()
