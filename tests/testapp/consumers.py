"""Consumers of the test suite (tests/test_consumers.py, tests/chaos/test_consumers.py)."""

import os
import socket
import time

from django.db.models import Q

from django_dbworker.consumers import Consumer

from .models import Handled, OrderEvent

#: A file each batch appends "start|end name hostname pid time" lines to (ownership
#: audits).
BATCH_LOG = "DBWORKER_TEST_BATCH_LOG"


def _log(kind: str, name: str) -> None:
    path = os.environ.get(BATCH_LOG)
    if path:
        with open(path, "a") as f:
            f.write(f"{kind} {name} {socket.gethostname()} {os.getpid()} {time.time():.6f}\n")


class Recording(Consumer):
    model = OrderEvent
    batch_size = 50
    poll_interval = 0.2
    gap_threshold = 2.0

    def handle_batch(self, rows):
        _log("start", self.name)
        Handled.objects.bulk_create(
            Handled(consumer=self.name, position=r.id, worker=str(os.getpid()), at=time.time())
            for r in rows
        )
        if os.environ.get("DBWORKER_TEST_BATCH_SLEEP"):
            time.sleep(float(os.environ["DBWORKER_TEST_BATCH_SLEEP"]))
        _log("end", self.name)


class AllEvents(Recording):
    name = "all_events"


class Orders(Recording):
    name = "orders"
    scope = Q(aggregate_type="Order")


class Audit(Recording):
    name = "audit"


class Fails(Recording):
    """Fails every batch that holds an event whose payload says so."""

    name = "fails"
    max_failures = 2

    def handle_batch(self, rows):
        if any(r.payload.get("fail") for r in rows):
            raise RuntimeError("told to fail")
        super().handle_batch(rows)


class Trivial(Consumer):
    """The benchmark's consumer: does nothing."""

    name = "trivial"
    model = OrderEvent
    batch_size = 1000

    def handle_batch(self, rows):
        pass
