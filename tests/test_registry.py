"""The worker registry's own statements (the rest is tested through workers)."""

import pytest

from django_dbworker.models import WorkerProcess
from django_dbworker.runtime.registry import Registry, registry_alias
from django_dbworker.sql.connection import Connection

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_registration_whose_reply_was_lost_is_not_refused_when_tried_again():
    """The insert committed but the connection went before its reply: the heartbeat
    thread registers again at its next beat. That insert failed on the worker id (the
    row is its own), and so did every later one: the row was never refreshed, and the
    resetter pruned it after WORKER_RETENTION while the worker ran on."""
    conn = Connection(registry_alias(), "registry-test")
    try:
        registry = Registry("host:1:abcdef", lanes=[])
        registry.register(conn)
        registry.register(conn)  # the same insert, tried again after the lost reply
        registry.beat(conn)
    finally:
        conn.close()
    assert list(WorkerProcess.objects.values_list("worker_id", flat=True)) == ["host:1:abcdef"]
