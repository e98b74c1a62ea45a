"""Fair claims across tenants (issue 43, item 2): the claim statement against the real
database, then real workers. The same tests on SQLite, PostgreSQL and MariaDB."""

from collections import Counter

import pytest
from django.db.models import Q

from django_dbworker.checks import validate_handler
from tests.conftest import wait_until
from tests.testapp import handlers as h
from tests.testapp.models import ScopedJob, TenantJob, UUIDJob

from .test_limits import Claims, finish, tenants

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def claims():
    made = []

    def make(handler, **kwargs):
        made.append(Claims(handler, **kwargs))
        return made[-1]

    yield make
    for c in made:
        c.close()


def backlog(*sizes, tenant0=1):
    """Jobs of tenants 1, 2, … (``sizes`` each), each tenant's after the previous."""
    for i, size in enumerate(sizes):
        TenantJob.objects.bulk_create(TenantJob(tenant=tenant0 + i) for _ in range(size))


def test_a_tenant_behind_a_backlog_gets_its_share_of_the_first_claim(claims):
    backlog(200, 3, 3)
    taken = claims(h.FairHandler())(6)
    assert Counter(tenants(taken)) == {1: 2, 2: 2, 3: 2}


def test_a_claim_is_full_while_jobs_are_left_whatever_the_shares(claims):
    """Three tenants with a job each beside a backlog: their shares of a claim of 16 go
    partly unused, and the backlog's tenant takes the rest (a short claim would tell
    the worker the queue is drained: it would wait for its next poll)."""
    backlog(100, 1, 1, 1)
    taken = claims(h.FairHandler())(16)
    assert Counter(tenants(taken)) == {1: 13, 2: 1, 3: 1, 4: 1}


def test_each_tenants_jobs_come_in_ordering(claims):
    backlog(20, 20)
    claim = claims(h.FairHandler())
    seen = []
    for _ in range(5):
        jobs = claim(4)
        seen += jobs
        finish(*jobs)
    for tenant in (1, 2):
        mine = [j.pk for j in seen if j.tenant == tenant]
        assert mine == sorted(mine)
        assert mine == list(
            TenantJob.objects.filter(tenant=tenant)
            .order_by("pk")
            .values_list("pk", flat=True)[: len(mine)]
        )


def test_a_tenant_that_runs_more_waits_for_the_others(claims):
    """The share is of the running slots: tenant 1 already runs 4 jobs, so the next
    claims go to tenant 2 until it runs as many."""
    backlog(50, 50)
    first = claims(h.FairHandler())
    ahead = list(TenantJob.objects.filter(tenant=1).order_by("pk").values_list("pk", flat=True)[:4])
    TenantJob.objects.filter(pk__in=ahead).update(
        state="processing", worker_hostname="host:9:other"
    )
    assert tenants(first(4)) == [2, 2, 2, 2]
    assert sorted(tenants(first(2))) == [1, 2]


def test_one_slot_at_a_time_goes_to_every_tenant(claims):
    """Claims of one job each (a slot freed at a time) with nothing running: no tenant
    takes them all (ties go either way)."""
    backlog(30, 30, 30)
    claim = claims(h.FairHandler())
    seen = Counter()
    for _ in range(30):
        jobs = claim(1)
        seen.update(tenants(jobs))
        finish(*jobs)
    assert set(seen) == {1, 2, 3}
    assert max(seen.values()) <= 20  # about 10 each; the oldest tenant does not win them all


@pytest.mark.parametrize("handler", [h.WeightedFairHandler, h.CallableWeightsFairHandler])
def test_weights_share_the_slots_in_proportion(claims, handler):
    backlog(100, 100)
    taken = claims(handler())(8)
    assert Counter(tenants(taken)) == {1: 6, 2: 2}


def test_jobs_without_a_key_are_a_tenant_of_their_own(claims):
    backlog(50)
    TenantJob.objects.bulk_create(TenantJob(tenant=None) for _ in range(5))
    backlog(5, tenant0=2)
    taken = claims(h.FairHandler())(6)
    assert Counter(tenants(taken)) == {1: 2, None: 2, 2: 2}


def test_fair_claims_keep_the_limits(claims):
    """Limits (3 at once, 1 per tenant) apply to the fair candidates: tenant 1's backlog
    takes one slot, the others go to tenants 2 and 3."""
    backlog(100, 5, 5)
    claim = claims(h.FairLimitedHandler())
    taken = claim(4)
    assert sorted(tenants(taken)) == [1, 2, 3]
    assert claim(4) == []
    assert claim.held_back
    finish(taken[0])
    assert len(claim(4)) == 1


def test_weights_hold_under_a_handlers_limit(claims):
    """A weighted fair claim chosen under ``max_concurrency`` (the limited claim)."""
    backlog(100, 100)
    claim = claims(h.WeightedFairHandler(max_concurrency=8))
    assert Counter(tenants(claim(20))) == {1: 6, 2: 2}
    assert claim(20) == []
    assert claim.held_back


class UUIDKeyed(h.FairHandler):
    """A job table keyed by UUID, fair by a text field."""

    model = UUIDJob
    fair_by = "behavior"


def test_a_table_keyed_by_uuid(claims):
    UUIDJob.objects.bulk_create(UUIDJob(behavior="ok") for _ in range(30))
    UUIDJob.objects.bulk_create(UUIDJob(behavior="sleep") for _ in range(3))
    taken = claims(UUIDKeyed())(6)
    assert Counter(job.behavior for job in taken) == {"ok": 3, "sleep": 3}


class TextKeys(h.FairHandler):
    """Fair by a text field (ScopedJob.tenant), weighted by its values."""

    model = ScopedJob
    fair_by = "tenant"
    fair_weights = {"Beta": 3}


def test_text_keys_and_their_weights(claims):
    ScopedJob.objects.bulk_create(ScopedJob(tenant="alpha") for _ in range(50))
    ScopedJob.objects.bulk_create(ScopedJob(tenant="Beta") for _ in range(50))
    taken = claims(TextKeys())(8)
    assert Counter(job.tenant for job in taken) == {"alpha": 2, "Beta": 6}


def test_fair_claims_keep_the_dequeue_filter_and_skip_held_jobs(claims):
    backlog(10, 10)
    TenantJob.objects.filter(tenant=2).update(behavior="other")
    claim = claims(h.FairHandler(dequeue_filter=Q(behavior="ok")))
    assert set(tenants(claim(4))) == {1}
    assert TenantJob.objects.filter(state="processing", tenant=2).count() == 0


# -- checks ------------------------------------------------------------------------------


def test_fair_options_are_checked():
    class Bad(h.FairHandler):
        fair_by = "no_such_field"

    class BadWeights(h.FairHandler):
        fair_weights = {1: 0}

    class WeightsAlone(h.FairHandler):
        fair_by = None
        fair_weights = {1: 2}

    class NotAMapping(h.FairHandler):
        fair_weights = [1, 2]

    def errors(handler):
        return [e.msg for e in validate_handler(handler) if e.id == "dbworker.E017"]

    assert any("fair_by 'no_such_field' is not a field of TenantJob" in m for m in errors(Bad))
    assert any("the weight of 1 is 0, not a positive number" in m for m in errors(BadWeights))
    assert any("fair_weights needs fair_by" in m for m in errors(WeightsAlone))
    assert any("must be a dict" in m for m in errors(NotAMapping))
    for good in (h.FairHandler, h.WeightedFairHandler, h.CallableWeightsFairHandler):
        assert [
            e for e in validate_handler(good) if e.id in ("dbworker.E017", "dbworker.E014")
        ] == []


def test_a_fair_handler_without_its_index_is_warned():
    class NoIndex(h.FairHandler):
        model = ScopedJob
        fair_by = "tenant"

    [warning] = [e for e in validate_handler(NoIndex) if e.id == "dbworker.W012"]
    assert "fair_by 'tenant' has no fair index on ScopedJob" in warning.msg
    assert "fair_index('tenant', 'id', name=...)" in warning.hint
    assert [e for e in validate_handler(h.FairHandler) if e.id == "dbworker.W012"] == []


def test_a_failing_weight_weighs_one(claims, caplog):
    class Failing(h.FairHandler):
        def fair_weights(self, tenant):
            raise RuntimeError("no such tenant")

    backlog(50, 50)
    taken = claims(Failing())(4)
    assert Counter(tenants(taken)) == {1: 2, 2: 2}
    assert "fair_weights failed" in caplog.text


# -- a worker ----------------------------------------------------------------------------


@pytest.mark.parametrize("handler", [h.FairHandler, h.AsyncFairHandler], ids=["sync", "async"])
def test_a_worker_runs_a_small_tenant_before_a_large_backlog_drains(run_worker, handler):
    """Tenant 1 enqueues 400 jobs, then tenant 2 eight: tenant 2's run while most of
    tenant 1's still wait (an ordered claim runs them after all 400)."""
    TenantJob.objects.bulk_create(
        TenantJob(tenant=1, behavior="sleep", payload={"seconds": 0.02}) for _ in range(400)
    )
    worker = run_worker(handler())
    wait_until(lambda: TenantJob.objects.filter(state="completed").exists(), 30, message="start")
    TenantJob.objects.bulk_create(
        TenantJob(tenant=2, behavior="sleep", payload={"seconds": 0.02}) for _ in range(8)
    )
    wait_until(
        lambda: TenantJob.objects.filter(tenant=2, state="completed").count() == 8,
        30,
        message="tenant 2's jobs",
    )
    waiting = TenantJob.objects.filter(tenant=1, state="queued").count()
    assert worker.stop() == 0
    assert waiting >= 200
