"""Job tables keyed by text (issue 42, item 12): a key is looked up by equality, never
spliced into a JSON path. On SQLite and MariaDB the heartbeat's check-ins and a group
commit's results were read with the path ``$."<key>"``: a key holding ``"`` named
another member (``a"."text`` read the ``text`` of job ``a``'s check-in), so a job got
another's check-in or return value. The same tests on SQLite, PostgreSQL, MariaDB."""

import json
import threading
import time

import pytest
from django.db import connection

from django_dbworker import Handler
from django_dbworker.sql.connection import Connection
from django_dbworker.sql.jobs import statements_for
from tests.conftest import wait_until
from tests.testapp.models import TextKeyJob

pytestmark = pytest.mark.django_db(transaction=True)

ME = "host:1:aaaaaa"

#: Pairs of keys that differ by what a JSON path reads as syntax, and the plain key a
#: path built from the other one would name (``$."a"."text"`` is ``a``'s ``text``).
KEYS = [
    "a",
    'a"."text',
    'a"."n',
    "a.b",
    "$",
    "$.a",
    "x\\y",
    'x\\"y',
    "[0]",
    'a"[0]',
    "ü",  # (not beside "u": one key under MariaDB's default collation)
    'ü"."text',
    "雪☃",
    "a b",
]


@pytest.fixture
def db():
    conn = Connection("default", "test")
    yield conn
    conn.close()


def claim_all(db, sql):
    rows = db.execute(
        sql.claim(sql.order_by(("pk",))),
        {"worker": ME, "max_retries": 0, "held": sql.ids_param([]), "limit": 100},
    )
    return sorted(row[sql.rows.pk_index] for row in rows)


def test_check_ins_and_results_of_text_keys_land_on_their_own_rows(db):
    """The statements themselves, every key in one statement (what a heartbeat and a
    group commit send when the jobs are held together)."""
    sql = statements_for(TextKeyJob, connection.vendor, "default")
    TextKeyJob.objects.bulk_create([TextKeyJob(id=key) for key in KEYS])
    assert claim_all(db, sql) == sorted(KEYS)
    checkins = {key: {"text": f"check-in of {key}", "n": KEYS.index(key)} for key in KEYS}
    rows = db.execute(
        sql.heartbeat_with_progress,
        {"ids": sql.ids_param(KEYS), "worker": ME, **sql.progress_params(checkins)},
    )
    assert sorted(sql.keys(rows)) == sorted(KEYS)
    results = [(key, json.dumps({"returned by": key})) for key in KEYS]
    rows = db.execute(
        sql.complete_with_results("result"),
        {"ids": sql.ids_param(KEYS), "worker": ME, **sql.results_params(results)},
    )
    assert sorted(sql.keys(rows)) == sorted(KEYS)
    for job in TextKeyJob.objects.all():
        assert job.progress == checkins[job.pk], job.pk
        assert job.result == {"returned by": job.pk}, job.pk
        assert job.state == "completed"


def test_a_check_in_for_some_keys_leaves_the_others_alone(db):
    """A key given no check-in keeps the one it has, even when a path built from it
    would name a member of another key's."""
    sql = statements_for(TextKeyJob, connection.vendor, "default")
    TextKeyJob.objects.bulk_create([TextKeyJob(id=key) for key in KEYS])
    claim_all(db, sql)
    TextKeyJob.objects.update(progress={"text": "before"})
    db.execute(
        sql.heartbeat_with_progress,
        {"ids": sql.ids_param(KEYS), "worker": ME, **sql.progress_params({"a": {"text": "x"}})},
    )
    progress = dict(TextKeyJob.objects.values_list("pk", "progress"))
    assert progress.pop("a") == {"text": "x"}
    assert set(map(json.dumps, progress.values())) == {json.dumps({"text": "before"})}


class TextKeyHandler(Handler):
    """Checks in its own key, waits until every job has (so the check-ins and the
    completions go out together), and returns its key."""

    model = TextKeyJob
    result_field = "result"
    num_handlers = len(KEYS)
    interval = 0.05
    heartbeat_interval = 0.1
    barrier: threading.Barrier

    def handle(self, job):
        self.barrier.wait(timeout=20)
        for _ in range(5):  # several heartbeats carry every job's check-in at once
            self.attempt.checkin(f"check-in of {job.pk}", done=1, total=2)
            time.sleep(0.1)
        self.barrier.wait(timeout=20)
        return {"returned by": job.pk}


def test_a_worker_gives_each_text_key_its_own_check_in_and_result(run_worker):
    TextKeyJob.objects.bulk_create([TextKeyJob(id=key) for key in KEYS])
    handler = TextKeyHandler()
    handler.barrier = threading.Barrier(len(KEYS))
    tw = run_worker(handler)
    wait_until(
        lambda: TextKeyJob.objects.filter(state="completed").count() == len(KEYS),
        timeout=30,
        message=lambda: list(TextKeyJob.objects.values_list("pk", "state", "failure_message")),
    )
    assert tw.stop() == 0
    for job in TextKeyJob.objects.all():
        assert job.progress["text"] == f"check-in of {job.pk}", job.pk
        assert job.result == {"returned by": job.pk}, job.pk
