"""Every job table leaves room on its pages (PostgreSQL, ``DBWORKER["FILLFACTOR"]``,
``sql.tables``): the row versions a claim and an outcome write can stay on the row's
page (what that saves in WAL: docs/benchmarks.md)."""

import pytest
from django.db import connection

from django_dbworker.models import job_models
from django_dbworker.sql.tables import fillfactor_of, storage_table, sync_fillfactor
from tests.conftest import wait_until
from tests.testapp import handlers as h
from tests.testapp.models import QueueJob

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's fillfactor"),
]

TABLE = connection.ops.quote_name(QueueJob._meta.db_table)


def fillfactors():
    with connection.cursor() as cursor:
        return {
            # A partitioned table's: its active partition's (PartJob).
            model._meta.db_table: fillfactor_of(
                cursor, connection.ops.quote_name(storage_table(cursor, model._meta.db_table))
            )
            for model in job_models()
        }


def test_migrate_sets_the_fillfactor_on_every_job_table_and_only_where_it_differs(settings):
    tables = [model._meta.db_table for model in job_models()]
    assert fillfactors() == dict.fromkeys(tables, 50)  # the test database's migrate
    assert sync_fillfactor(job_models()) == []  # nothing to change
    try:
        settings.DBWORKER = {"FILLFACTOR": 80}
        assert sync_fillfactor(job_models()) == tables
        assert fillfactors() == dict.fromkeys(tables, 80)
        settings.DBWORKER = {"FILLFACTOR": None}  # left as it is
        assert sync_fillfactor(job_models()) == []
        assert fillfactors() == dict.fromkeys(tables, 80)
    finally:
        settings.DBWORKER = {}
        sync_fillfactor(job_models())
    assert fillfactors() == dict.fromkeys(tables, 50)


def pages():
    """{pk: the page its newest version is on}."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, (ctid::text::point)[0]::int FROM {TABLE}")
        return dict(cursor.fetchall())


def moved_by_a_claim(run_worker):
    """(the jobs a worker's first claim took, those whose new version is not on the page
    the job was inserted on). The jobs wait in their handlers, so no version dies and
    nothing is pruned: the room each page was left decides alone."""
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE} RESTART IDENTITY CASCADE")
    QueueJob.objects.bulk_enqueue(
        {"behavior": "sleep", "payload": {"seconds": 30}} for _ in range(200)
    )
    before = pages()
    tw = run_worker(h.BehaviorHandler(), burst=True)
    processing = QueueJob.objects.filter(state="processing")
    wait_until(lambda: processing.count() >= 4, 20, message="the first claim")
    after = pages()
    claimed = sorted(processing.values_list("pk", flat=True))
    QueueJob.objects.all().cancel()
    assert tw.join() == 0
    return claimed, [pk for pk in claimed if after[pk] != before[pk]]


def test_a_claim_writes_its_rows_new_versions_on_their_own_pages(run_worker, settings):
    claimed, moved = moved_by_a_claim(run_worker)
    assert len(claimed) >= 4
    assert moved == []
    try:
        settings.DBWORKER = {"FILLFACTOR": 100}
        sync_fillfactor(job_models())
        claimed, moved = moved_by_a_claim(run_worker)
    finally:
        settings.DBWORKER = {}
        sync_fillfactor(job_models())
    assert len(claimed) >= 4
    assert moved == claimed  # full pages: each version went to another
