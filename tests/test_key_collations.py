"""Keys and names compare byte for byte, whatever the collations (issue 42, item 15b).

On MariaDB a text comparison takes the collation of its operands: the database's
(utf8mb4_general_ci by default, utf8mb4_unicode_ci as Django's docs create it) is
case-insensitive and ignores trailing spaces, and two operands of different
collations (a column and ``CAST(… AS CHAR)`` in the connection's, a column and a
``JSON_TABLE`` column in the database's default) fail the statement with error 1267
("Illegal mix of collations"). With a rate limit per key, every claim failed so on a
database created ``COLLATE utf8mb4_unicode_ci`` with ``OPTIONS["charset"] =
"utf8mb4"`` (the MariaDB suite runs on one: ``.ci/run``). PostgreSQL and SQLite
compare bytes; the same tests run there."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_dbworker.control.models import RateBucket
from django_dbworker.control.pause import pause
from django_dbworker.maintenance.resetter import Resetter
from django_dbworker.sql.dialects import dialect_for
from tests.test_limits import Claims
from tests.testapp import handlers as h
from tests.testapp.models import ReportJob

pytestmark = pytest.mark.django_db(transaction=True)

#: Keys that a case-insensitive, PAD SPACE collation takes for one.
KEYS = ["a", "A", "a ", "b"]


class KeyRate(h.LimitedReportHandler):
    """One claim per tenant (burst 1), then one every 10 s."""

    max_concurrency = None
    max_concurrency_per_key = None
    rate_limit_per_key = "6/m"


class OnePerKey(h.LimitedReportHandler):
    """One job at a time per tenant."""

    max_concurrency = None
    max_concurrency_per_key = 1


@pytest.fixture
def claims():
    made = []

    def make(handler):
        made.append(Claims(handler))
        return made[-1]

    yield make
    for c in made:
        c.close()


def enqueue(keys, per_key=2):
    ReportJob.objects.bulk_create(
        ReportJob(tenant=key, kind=f"k{n}") for key in keys for n in range(per_key)
    )


def test_keys_that_differ_in_case_or_trailing_spaces_have_buckets_of_their_own(claims):
    enqueue(KEYS)
    claim = claims(KeyRate())
    assert sorted(job.tenant for job in claim(10)) == sorted(KEYS)
    assert claim(10) == []  # each key's bucket is spent
    buckets = RateBucket.objects.filter(name=claim.lane.claimer.limits.bucket_name(True))
    assert sorted(buckets.values_list("key", flat=True)) == sorted(KEYS)


def test_keys_that_differ_in_case_or_trailing_spaces_are_held_apart(claims):
    enqueue(KEYS)
    claim = claims(OnePerKey())
    assert sorted(job.tenant for job in claim(10)) == sorted(KEYS)
    assert claim(10) == []  # each key runs one


@pytest.fixture
def other_default_collation():
    """MariaDB: the test database's default collation made unlike its tables' (as when
    a database's default changes after its tables were made): ``JSON_TABLE``'s text
    columns take the default, the tables keep theirs."""
    if connection.vendor != "mysql":
        pytest.skip("MariaDB's collations")
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DEFAULT_CHARACTER_SET_NAME, DEFAULT_COLLATION_NAME "
            "FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s",
            [name],
        )
        charset, collation = cursor.fetchone()
        # Not a _bin collation: a _bin one would win the comparison without an error.
        other = "utf8mb4_unicode_ci" if collation != "utf8mb4_unicode_ci" else "utf8mb4_general_ci"
        cursor.execute(f"ALTER DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE {other}")
    try:
        yield other
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER DATABASE `{name}` CHARACTER SET {charset} COLLATE {collation}")


def test_claims_pauses_and_resets_where_the_default_collation_differs_from_the_tables(
    other_default_collation, claims
):
    enqueue(KEYS, per_key=1)
    ReportJob.objects.filter(tenant="b").update(queue="held")
    handler = KeyRate()  # its claims read the pauses of its queues (queue_field) too
    assert pause(f"{handler.queue_pause_prefix()}held")
    claim = claims(handler)
    claimed = claim(10)
    assert sorted(job.tenant for job in claimed) == ["A", "a", "a "]
    assert claim(10) == []

    # The resetter joins each stalled row's worker to the registry's (JSON_TABLE).
    ReportJob.objects.filter(pk__in=[job.pk for job in claimed]).update(
        last_heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    resetter = Resetter([handler])
    try:
        resetter.run_once()
    finally:
        resetter.close()
    assert set(ReportJob.objects.values_list("state", flat=True)) == {"queued"}


def test_text_primary_keys_are_looked_up_by_their_bytes_whatever_the_collations(
    other_default_collation,
):
    """A job table keyed by text: the worker names its rows by key through
    ``JSON_TABLE`` (``Dialect.in_ids``: heartbeats, outcomes, what a claim skips)."""
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        # A table in another collation than the database's default.
        collation = "utf8mb4_general_ci"
        if other_default_collation == collation:
            collation = "utf8mb4_unicode_ci"
        cursor.execute(
            "CREATE TEMPORARY TABLE dbw_text_keys (id VARCHAR(40) PRIMARY KEY) "
            f"CHARACTER SET utf8mb4 COLLATE {collation}"
        )
        try:
            cursor.execute("INSERT INTO dbw_text_keys VALUES ('a'), ('b'), ('c ')")
            cursor.execute(
                f"SELECT id FROM dbw_text_keys WHERE id {dialect.in_ids('ids', 'varchar(40)')} "
                "ORDER BY id",
                {"ids": dialect.ids(["a", "B", "c "], integers=False)},
            )
            assert [row[0] for row in cursor.fetchall()] == ["a", "c "]
        finally:
            cursor.execute("DROP TEMPORARY TABLE dbw_text_keys")
