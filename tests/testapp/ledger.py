"""Transactional handlers (issue 44): each job inserts one ``LedgerEntry`` and adds one
to the ``total`` counter; what commits with the job's completion depends on the mode.

Behaviors (``job.behavior``): ``ok``; ``fail`` raises after its writes; ``sleep``
waits ``payload["seconds"]`` in ``pre_handle``, before any transaction (a test
changes the row meanwhile);
``log`` logs and checks in before its writes.
"""

import random
import time
from datetime import timedelta

from django.db.models import F

from django_dbworker import Handler

from .models import Event, LedgerCounter, LedgerEntry, LedgerJob


def add_entry(job, attempt, phase):
    LedgerEntry.objects.create(job_id=job.pk, worker=attempt.worker_id, phase=phase)


def count_one():
    LedgerCounter.objects.filter(name="total").update(value=F("value") + 1)


class LedgerHandler(Handler):
    """``atomic``: the writes of ``handle`` commit with the completion."""

    model = LedgerJob
    atomic = True
    result_field = "result"
    num_handlers = 4
    interval = 0.05
    heartbeat_interval = 0.2
    stalled_max_age = timedelta(seconds=2)
    max_num_retries = 2
    retry_after = 0
    max_num_resets = 2

    def pre_handle(self, job):
        # Outside any transaction (the prepare phase): a test takes the row meanwhile.
        if job.behavior == "sleep":
            Event.objects.create(job_id=job.pk, kind="ledger:sleeping")
            time.sleep(job.payload.get("seconds", 1.0))

    def handle(self, job):
        attempt = self.attempt
        behavior = job.behavior
        if behavior == "log":
            attempt.log("step", ["true"], out="ok")
            attempt.checkin("half", done=1, total=2)
        self.work(job)
        if job.payload.get("check_cancel"):
            attempt.raise_if_canceled()
        if behavior == "fail":
            raise RuntimeError("boom after the writes")
        return {"job": job.pk, "tenant": attempt.context.get("tenant")}

    def work(self, job):
        add_entry(job, self.attempt, "handle")
        count_one()


class LedgerPlainHandler(LedgerHandler):
    """The same work, not atomic: the control."""

    atomic = False


class LedgerCompleteHandler(LedgerHandler):
    """The work outside any transaction, its writes in ``complete()``."""

    atomic = False

    def work(self, job):
        self.attempt.context["worked"] = True

    def complete(self, job, result):
        assert self.attempt.context["worked"]
        add_entry(job, self.attempt, "complete")
        count_one()
        if job.behavior == "fail_complete":
            raise RuntimeError("complete() broke")


class LedgerCompletingHandler(LedgerHandler):
    """Decides itself when to commit: ``with self.attempt.completing():``."""

    atomic = False

    def work(self, job):
        with self.attempt.completing(result={"via": "completing"}):
            add_entry(job, self.attempt, "completing")
            count_one()


def _pause(job):
    """The chaos handlers' pause between the domain row and the counter: long enough
    that kills and stops land between the two."""
    time.sleep(job.payload.get("seconds", random.uniform(0.02, 0.15)))


class LedgerChaos(LedgerHandler):
    """For the chaos suite: budgets the injected faults cannot spend."""

    num_handlers = 6
    interval = 0.1
    heartbeat_interval = 0.25
    stalled_max_age = timedelta(seconds=3)
    max_num_retries = 1000
    max_num_resets = 1000
    result_field = None

    def handle(self, job):
        add_entry(job, self.attempt, "handle")
        _pause(job)
        count_one()


class LedgerChaosPlain(LedgerChaos):
    atomic = False


class LedgerChaosComplete(LedgerChaos):
    """Long work outside the transaction; the writes commit with the completion."""

    atomic = False

    def handle(self, job):
        _pause(job)
        _pause(job)
        return job.pk

    def complete(self, job, result):
        add_entry(job, self.attempt, "complete")
        _pause(job)
        count_one()
