"""Every statement against a row in every state: it moves only what ``TRANSITIONS``
allows, from where it allows, to where it allows."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_dbworker import operations
from django_dbworker.control.limits import Limits, RateLimit
from django_dbworker.control.models import RateBucket
from django_dbworker.sql.connection import Connection
from django_dbworker.sql.fair import FairClaims
from django_dbworker.sql.jobs import statements_for
from django_dbworker.sql.limits import LimitedClaims
from django_dbworker.states import TRANSITIONS, JobState
from tests.factories import JobFactory
from tests.testapp.models import PartJob, QueueJob

pytestmark = pytest.mark.django_db(transaction=True)

ME = "host:1:aaaaaa"
LONG_AGO = timedelta(hours=1)


@pytest.fixture
def db():
    conn = Connection("default", "transitions")
    yield conn
    conn.close()


@pytest.fixture(
    params=[
        QueueJob,
        pytest.param(
            PartJob,
            marks=pytest.mark.skipif(
                connection.vendor != "postgresql", reason="partitioned tables: PostgreSQL"
            ),
        ),
    ],
    ids=["plain", "partitioned"],
)
def model(request):
    """The job table: a plain one, and a partitioned one (django_dbworker.partitions),
    whose statements also write finished_on and name the active partition."""
    return request.param


@pytest.fixture
def sql(model):
    return statements_for(model, connection.vendor, "default")


def one_of_each(model=QueueJob):
    """A row in every state, each as favourable to every statement as can be: held by
    ME, its heartbeat long gone, claimable, retries and resets left."""
    old = timezone.now() - LONG_AGO
    make = JobFactory if model is QueueJob else model.objects.create
    return {
        state: make(
            state=state,
            worker_hostname=ME,
            last_heartbeat_at=old,
            started_at=old,
            finished_at=old,
            process_after=timezone.now() + timedelta(hours=1)
            if state in (JobState.QUEUED, JobState.ERRORED)
            else None,
        ).pk
        for state in JobState.values
    }


def states(model=QueueJob):
    return dict(model.objects.values_list("pk", "state"))


def worker_statements(sql, ids):
    keys = sql.ids_param(list(ids.values()))
    pk = ids[JobState.PROCESSING]
    unknown = {**sql.holders_params([]), "age": 1.0, "spare": sql.ids_param([])}
    error = {"non_retryable": False, "max_retries": 5, "message": "x", "delay": 0.0}
    return {
        "claim": (
            sql.claim(sql.order_by(("pk",))),
            {"worker": ME, "max_retries": 5, "held": sql.ids_param([]), "limit": 10},
        ),
        "stage": (sql.stage, {}),
        "heartbeat": (sql.heartbeat, {"ids": keys, "worker": ME}),
        "log_set": (sql.log_set, {"logs": "[]", "pk": pk, "worker": ME}),
        "complete": (sql.complete, {"ids": keys, "worker": ME}),
        "error": (sql.error, {**error, "pk": pk, "worker": ME}),
        "cancel": (sql.cancel, {"message": "x", "ids": keys, "worker": ME}),
        "snooze": (sql.snooze, {"message": "x", "delay": 30.0, "pk": pk, "worker": ME}),
        "requeue": (sql.requeue, {"ids": keys, "worker": ME, "message": "x"}),
        "requeue_unheld": (
            sql.requeue_unheld,
            {"worker": ME, "held": sql.ids_param([]), "message": "x"},
        ),
        "reset_stalled": (sql.reset_stalled, {**unknown, "resets": 5}),
        "fail_stalled": (sql.fail_stalled, {**unknown, "resets": 0, "message": "x"}),
        "reset_one": (sql.reset_one, {**unknown, "resets": 5, "pk": pk}),
        "supersede": (sql.supersede, {"message": "x", "pk": pk, "worker": ME}),
        "supersede_stalled": (
            sql.supersede_stalled,
            {**unknown, "resets": 5, "message": "x", "pk": pk},
        ),
        # Each finished state in turn would do; one is enough to see it touches no other.
        "prune": (sql.prune(), {"state": "completed", "age": 1.0, "batch": 10}),
    }


def test_every_statement_is_in_the_table(sql):
    ids = dict.fromkeys(JobState, 0)
    names = set(worker_statements(sql, ids)) | {
        "operator_cancel",
        "operator_retry",
        "operator_run_now",
        "operator_schedule",
    }
    assert names == set(TRANSITIONS)


@pytest.mark.parametrize(
    "name",
    [
        "claim",
        "stage",
        "heartbeat",
        "log_set",
        "complete",
        "error",
        "cancel",
        "snooze",
        "requeue",
        "requeue_unheld",
        "reset_stalled",
        "fail_stalled",
        "reset_one",
        "supersede",
        "supersede_stalled",
        "prune",
    ],
)
def test_worker_statements_move_rows_only_as_the_table_says(db, model, sql, name):
    ids = one_of_each(model)
    # Due: a claim may take them (no time to wait for), a stage release them (time past).
    model.objects.update(process_after=timezone.now() - LONG_AGO if name == "stage" else None)
    statement, params = worker_statements(sql, ids)[name]
    touched = db.execute(statement, params)
    sources, targets = TRANSITIONS[name]
    after = states(model)
    for state, pk in ids.items():
        if after.get(pk) != state:
            assert state in sources, f"{name} moved a {state} row"
            if pk in after:
                assert after[pk] in targets, f"{name} moved a row to {after[pk]}"
            else:
                assert not targets, f"{name} deleted a row it may only move"
    assert touched, f"{name} touched no row: the test does not exercise it"


@pytest.mark.parametrize(
    ("name", "operation"),
    [
        ("operator_cancel", operations.cancel),
        ("operator_retry", lambda qs: operations.retry(qs).retried),
        ("operator_run_now", operations.run_now),
        (
            "operator_schedule",
            lambda qs: operations.schedule(qs, timezone.now() + timedelta(days=1)),
        ),
    ],
)
def test_operator_operations_move_rows_only_as_the_table_says(model, name, operation):
    ids = one_of_each(model)
    model.objects.filter(state=JobState.PROCESSING).update(cancel=False)
    changed = operation(model.objects.all())
    sources, targets = TRANSITIONS[name]
    after = states(model)
    for state, pk in ids.items():
        if after[pk] != state:
            assert state in sources, f"{name} moved a {state} row"
            assert after[pk] in targets, f"{name} moved a row to {after[pk]}"
    assert changed, f"{name} changed no row: the test does not exercise it"


def test_the_limited_claim_moves_rows_only_as_the_claim_does(db, model, sql):
    """A claim with every limit (sql.limits): the transitions of ``claim``."""
    ids = one_of_each(model)
    model.objects.update(process_after=None, size=1)
    limits = Limits(
        "transitions",
        max_concurrency=100,
        key="size",
        max_per_key=100,
        # Slow refills: a bucket full again before the claim's statement ends is not
        # written (sql.limits), and at 1000/s one token is back within a millisecond.
        rate=RateLimit("1/s", burst=100),
        rate_per_key=RateLimit("1/s", burst=100),
    )
    claims = LimitedClaims(sql, limits, ("pk",), ("", {}), RateBucket, "default")
    claim = claims.claim("", None, 10)
    params = {**claim.params, "worker": ME, "max_retries": 5, "held": sql.ids_param([])}
    params.update(limit=10)

    def spend(rows):
        keys = sql.ids_param(sql.keys([(row[sql.rows.pk_index],) for row in rows]))
        return [(s, {**claim.params, "ids": keys}) for s in claim.spends]

    touched = db.execute_locked(claim.lock, claim.claim_sql, params, spend, claim.pick)
    sources, targets = TRANSITIONS["claim"]
    after = states(model)
    for state, pk in ids.items():
        if after[pk] != state:
            assert state in sources, f"the limited claim moved a {state} row"
            assert after[pk] in targets, f"the limited claim moved a row to {after[pk]}"
    assert touched
    assert RateBucket.objects.filter(name="transitions").count() == 1
    assert RateBucket.objects.filter(name="transitions#key", key="1").count() == 1


@pytest.mark.parametrize("limited", [False, True], ids=["fair", "fair-limited"])
def test_the_fair_claim_moves_rows_only_as_the_claim_does(db, model, sql, limited):
    """A fair claim (sql.fair), weighted, alone and under limits: the transitions of
    ``claim``."""
    ids = one_of_each(model)
    model.objects.update(process_after=None, size=1)
    fair = FairClaims(sql, "size", sql.order_by(("pk",)), ("", {}))
    params = {"worker": ME, "max_retries": 5, "held": sql.ids_param([]), "limit": 10}
    params.update(fair.weights_param({"1": 2}))
    if limited:
        limits = Limits("transitions", max_concurrency=100, key="size", max_per_key=100)
        claims = LimitedClaims(sql, limits, ("pk",), ("", {}), RateBucket, "default", fair)
        claim = claims.claim("", None, 10, weighted=True)
        values = {**claim.params, **params}
        touched = db.execute_locked(
            claim.lock, claim.claim_sql, values, lambda rows: [], claim.pick
        )
    elif sql.dialect.update_returning:
        touched = db.execute(fair.claim("", None, None, 10, 5, True), params)
    else:  # MariaDB: a pick, then the write of its keys
        claim_sql, pick = fair.pick("", None, None, 10, True)
        touched = db.execute_locked((1, 2), claim_sql, params, lambda rows: [], pick)
    sources, targets = TRANSITIONS["claim"]
    after = states(model)
    for state, pk in ids.items():
        if after[pk] != state:
            assert state in sources, f"the fair claim moved a {state} row"
            assert after[pk] in targets, f"the fair claim moved a row to {after[pk]}"
    assert touched
