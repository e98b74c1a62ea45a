"""Consumers of the test suite (tests/test_consumers.py, tests/chaos/test_consumers.py)."""

import os
import socket
import threading
import time

from django.db import transaction
from django.db.models import Q

from django_dbworker.consumers import Consumer

from .models import Handled, OrderEvent, SinkFence

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


class SlowAtLeastOnce(Recording):
    """At least once, each batch slower than its timeout (issue 29, finding 1): the
    effects are written outside any transaction, as a sink's would be."""

    name = "slow_at_least_once"
    transactional = False
    batch_size = 4
    batch_timeout = 1.0
    max_failures = 100

    def handle_batch(self, rows):
        Handled.objects.bulk_create(
            Handled(consumer=self.name, position=r.id, worker=str(os.getpid()), at=time.time())
            for r in rows
        )
        time.sleep(float(os.environ.get("DBWORKER_TEST_BATCH_SLEEP", "1.3")))


class Hangs(Recording):
    """A batch that never returns in a process started with DBWORKER_TEST_HANG set
    (finding 3); elsewhere it records its rows."""

    name = "hangs"
    batch_timeout = 1.0
    max_failures = 2

    def handle_batch(self, rows):
        if os.environ.get("DBWORKER_TEST_HANG"):
            _log("start", self.name)
            threading.Event().wait()  # Python never returns
        super().handle_batch(rows)


class HangsAtLeastOnce(Hangs):
    name = "hangs_at_least_once"
    transactional = False


class FencedSink(Consumer):
    """At least once into a "sink" that fences by generation (finding 6): the sink keeps
    the highest generation it accepted (``SinkFence``) and refuses a write of a lower
    one in the same transaction as the write. Sends are ``Handled`` rows (worker
    "pid:generation"); refused ones are recorded as consumer "fenced_sink:refused"."""

    name = "fenced_sink"
    model = OrderEvent
    transactional = False
    batch_size = 5
    poll_interval = 0.1
    max_poll_interval = 0.2
    batch_timeout = 60.0
    gap_threshold = 2.0

    def handle_batch(self, rows):
        batch = self.batch
        _log("start", self.name)
        # The sleep is where a process stopped mid-batch sits: after its own checks.
        time.sleep(float(os.environ.get("DBWORKER_TEST_BATCH_SLEEP", "0")))
        worker = f"{os.getpid()}:{batch.generation}"
        with transaction.atomic():
            fence, _ = SinkFence.objects.select_for_update().get_or_create(consumer=self.name)
            if batch.generation < fence.generation:
                Handled.objects.bulk_create(
                    Handled(consumer=f"{self.name}:refused", position=r.id, worker=worker)
                    for r in rows
                )
            else:
                SinkFence.objects.filter(pk=fence.pk).update(generation=batch.generation)
                Handled.objects.bulk_create(
                    Handled(consumer=self.name, position=r.id, worker=worker, at=time.time())
                    for r in rows
                )
        _log("end", self.name)


class Paced(Recording):
    """Idle back-off and the pause between catch-up batches (finding 8)."""

    name = "paced"
    batch_size = 5
    poll_interval = 0.05
    max_poll_interval = 0.4
    batch_pause = 0.25


class BalA(Recording):
    """The consumers of the balance test (finding 4)."""

    name = "bal_a"


class BalB(Recording):
    name = "bal_b"


class BalC(Recording):
    name = "bal_c"


class BalD(Recording):
    name = "bal_d"
