"""A reference model of the job lifecycle, written from docs/reliability.md and
docs/reference.md (not from the statements): what each public operation and each
engine step must do to the jobs of one handler.

Pure Python, no Django: ``tests/test_properties.py`` drives the real engine and this
model side by side and compares them after every step. Time is a number of seconds
the test moves forward (``advance``); a job's ``wait`` is how long until it is due
(``process_after``), its ``silent`` how long since its worker last heartbeated.

A job that waits for a time (``timed``: enqueued for later, or errored with a retry
delay) is not claimable, even once due, until a worker stages it (``stage``: what a
worker's stager does when the time comes); claims never look at the time.

Two unique keys (docs/scheduling.md, "Unique jobs"): ``key`` is held while the job is
active (queued, processing, errored); ``wkey`` while it waits only (queued or errored:
``unique_job_constraint(states=["queued", "errored"])``, gocraft's unique jobs), so a
claim lets go of it and another job may take it while the first one runs. The rule
when a job comes back to waiting (``_back``) while another job waits with its
``wkey``: **the waiting job keeps the key**. A worker's move (the resetter's reset, a
requeue at shutdown or of a lost claim reply, a retry after an error) *supersedes*
the returning job: it ends canceled, its counters as they were. The operator's retry
leaves it as it is and reports the holder. Moves of several jobs at once go in key
(``ref``) order: of two jobs of one ``wkey`` coming back together, the first keeps it.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable

#: What the model saw happen, over every run in this process (the test prints it, so a
#: run shows that the interesting paths were taken: resets, fenced writes, held keys).
EVENTS: collections.Counter[str] = collections.Counter()

QUEUED, PROCESSING, COMPLETED = "queued", "processing", "completed"
ERRORED, FAILED, CANCELED = "errored", "failed", "canceled"
#: The states a claim takes jobs from, and those in which a job holds its unique key.
WAITING = (QUEUED, ERRORED)
ACTIVE = (QUEUED, PROCESSING, ERRORED)
#: The states in which a job holds its waiting-only key (``wkey``).
WAITING_KEY = (QUEUED, ERRORED)
RETRYABLE = (FAILED, ERRORED, CANCELED)


@dataclasses.dataclass
class Job:
    ref: int  # the model's own name for the job (the test maps it to a primary key)
    key: str | None
    priority: int
    queue: str
    wkey: str | None = None
    state: str = QUEUED
    num_failures: int = 0
    num_resets: int = 0
    num_snoozes: int = 0
    cancel: bool = False
    wait: int = 0
    #: It waits for a time (``process_after`` set): only ``stage`` makes it claimable.
    timed: bool = False
    silent: int = 0
    worker: str | None = None


@dataclasses.dataclass(frozen=True)
class Config:
    max_retries: int  # Handler.max_num_retries
    max_resets: int  # Handler.max_num_resets
    stalled_age: int  # Handler.stalled_max_age, seconds


class Lifecycle:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.jobs: dict[int, Job] = {}
        #: The attempts each worker holds (job refs), current or stale.
        self.held: dict[str, set[int]] = {}
        self.paused: set[str] = set()  # queues
        self._next = 0

    # -- queries ---------------------------------------------------------------------

    def holder(self, key: str | None, besides: int | None = None) -> Job | None:
        """The active job holding ``key`` (NULL keys never conflict)."""
        if key is None:
            return None
        for job in self.jobs.values():
            if job.key == key and job.state in ACTIVE and job.ref != besides:
                return job
        return None

    def wholder(self, wkey: str | None, besides: int | None = None) -> Job | None:
        """The waiting job holding waiting-only key ``wkey``."""
        if wkey is None:
            return None
        for job in self.jobs.values():
            if job.wkey == wkey and job.state in WAITING_KEY and job.ref != besides:
                return job
        return None

    def _back(self, job: Job, state: str) -> bool:
        """A worker moves ``job`` back to waiting (``state``): False, and the job
        superseded (canceled), when another job waits with its ``wkey``."""
        if state in WAITING_KEY and self.wholder(job.wkey, besides=job.ref) is not None:
            job.state = CANCELED
            EVENTS[f"superseded ({state})"] += 1
            return False
        job.state = state
        return True

    def claimable(self, worker: str) -> list[Job]:
        """In claim order: priority first, then the oldest."""
        held = self.held.get(worker, set())
        found = [
            j
            for j in self.jobs.values()
            if j.state in WAITING
            and (j.state == QUEUED or j.num_failures <= self.config.max_retries)
            and not j.timed
            and j.queue not in self.paused
            and j.ref not in held
        ]
        return sorted(found, key=lambda j: (-j.priority, j.ref))

    def owns(self, worker: str, ref: int) -> bool:
        """Fencing: a write of ``worker`` for ``ref`` lands only if the row is still its
        attempt."""
        job = self.jobs.get(ref)
        return job is not None and job.state == PROCESSING and job.worker == worker

    # -- enqueueing ------------------------------------------------------------------

    def _new(
        self, key: str | None, priority: int, queue: str, wait: int, wkey: str | None = None
    ) -> Job:
        self._next += 1
        job = Job(self._next, key, priority, queue, wkey=wkey, wait=wait, timed=wait > 0)
        self.jobs[job.ref] = job
        return job

    def enqueue(
        self, key: str | None, priority: int, queue: str, wait: int, wkey: str | None = None
    ) -> Job | None:
        """A plain insert: refused (None) while another job holds either key."""
        if self.holder(key) is not None or self.wholder(wkey) is not None:
            EVENTS["enqueue refused: key held"] += 1
            return None
        if wkey is not None and any(
            j.wkey == wkey and j.state == PROCESSING for j in self.jobs.values()
        ):
            EVENTS["enqueued while its wkey's job runs"] += 1
        return self._new(key, priority, queue, wait, wkey)

    def enqueue_unique(
        self, key: str | None, priority: int, queue: str, replace: bool, by_wkey: bool = False
    ) -> tuple[Job, bool]:
        """By ``key`` (active), or by ``wkey`` (waiting-only: ``key`` is then the
        ``wkey`` given, and the new job has no ``key``). Replace writes the priority
        and queue to the holder while it waits."""
        holder = self.wholder(key) if by_wkey else self.holder(key)
        if holder is None:
            if by_wkey:
                return self._new(None, priority, queue, 0, wkey=key), True
            return self._new(key, priority, queue, 0), True
        EVENTS[f"enqueue_unique: {'wkey' if by_wkey else 'key'} held"] += 1
        if replace and holder.state in WAITING:
            holder.priority, holder.queue = priority, queue
        return holder, False

    def bulk_enqueue(self, specs: Iterable[tuple[str | None, int, str]]) -> list[Job] | None:
        """All or nothing: refused (None) if a key is held, or given twice."""
        specs = list(specs)
        keys = [k for k, _, _ in specs if k is not None]
        if len(set(keys)) != len(keys) or any(self.holder(k) for k in keys):
            EVENTS["bulk_enqueue refused"] += 1
            return None
        return [self._new(k, p, q, 0) for k, p, q in specs]

    # -- the worker's steps ----------------------------------------------------------

    def claim(self, worker: str, limit: int, remember: bool = True) -> list[Job]:
        """``remember=False``: the claim committed but its reply was lost."""
        taken = self.claimable(worker)[:limit]
        EVENTS["claimed"] += len(taken)
        EVENTS["claimed after an error"] += sum(j.state == ERRORED for j in taken)
        for job in taken:
            job.state, job.worker, job.silent = PROCESSING, worker, 0
            if remember:
                self.held.setdefault(worker, set()).add(job.ref)
        return taken

    def requeue_unheld(self, worker: str) -> dict[int, str]:
        """A claim's reply that never came back: its rows go back unrun (or are
        superseded); the state each took."""
        held = self.held.get(worker, set())
        back = {}
        for job in sorted(self.jobs.values(), key=lambda j: j.ref):
            if job.state == PROCESSING and job.worker == worker and job.ref not in held:
                self._back(job, QUEUED)
                back[job.ref] = job.state
        return back

    def heartbeat(self, worker: str) -> dict[int, bool]:
        """Refreshes its own rows; tells which of them are to be canceled."""
        seen = {}
        for ref in self.held.get(worker, set()):
            if self.owns(worker, ref):
                job = self.jobs[ref]
                job.silent = 0
                seen[ref] = job.cancel
        return seen

    def _end(self, worker: str, ref: int) -> Job | None:
        self.held.get(worker, set()).discard(ref)
        if not self.owns(worker, ref):
            EVENTS["stale write refused (fencing)"] += 1
            return None
        return self.jobs[ref]

    def complete(self, worker: str, ref: int) -> bool:
        job = self._end(worker, ref)
        if job is not None:
            job.state = COMPLETED
        return job is not None

    def error(self, worker: str, ref: int, delay: int, non_retryable: bool) -> str | None:
        """An exception: canceled if a cancel was asked (nothing counted), failed once
        the retry budget is spent or the error is not retryable, else errored (retried
        after ``delay``)."""
        job = self._end(worker, ref)
        if job is None:
            return None
        if job.cancel:
            job.state = CANCELED
        else:
            spent = non_retryable or job.num_failures >= self.config.max_retries
            if self._back(job, FAILED if spent else ERRORED):
                job.num_failures += 1  # superseded: nothing counted, as a cancel
        EVENTS[f"error -> {job.state}"] += 1
        job.wait, job.timed = delay, delay > 0
        return job.state

    def snooze(self, worker: str, ref: int, delay: int) -> str | None:
        """``raise Snooze(delay)``: back to the queue, due after ``delay``, one more
        snooze and nothing else counted (the retry budget untouched); canceled if a
        cancel was asked."""
        job = self._end(worker, ref)
        if job is None:
            return None
        if job.cancel:
            job.state = CANCELED
            job.wait, job.timed = 0, False
        else:
            job.state = QUEUED
            job.num_snoozes += 1
            job.wait, job.timed = delay, delay > 0
        EVENTS[f"snooze -> {job.state}"] += 1
        return job.state

    def cancel_outcome(self, worker: str, ref: int) -> bool:
        job = self._end(worker, ref)
        if job is not None:
            job.state = CANCELED
        return job is not None

    def requeue(self, worker: str, ref: int) -> str | None:
        """At shutdown: back to the queue unrun (or superseded), nothing counted; the
        state written."""
        job = self._end(worker, ref)
        if job is None:
            return None
        self._back(job, QUEUED)
        return job.state

    def restart(self, worker: str) -> None:
        """The process dies: its attempts are abandoned (the resetter's business)."""
        self.held.pop(worker, None)

    # -- time and the resetter -------------------------------------------------------

    def advance(self, seconds: int) -> None:
        for job in self.jobs.values():
            job.wait -= seconds
            if job.state == PROCESSING:
                job.silent += seconds

    def stage(self) -> list[int]:
        """The jobs that waited for a time and are due become claimable."""
        staged = []
        for job in self.jobs.values():
            if job.state in WAITING and job.timed and job.wait <= 0:
                job.timed = False
                staged.append(job.ref)
        EVENTS["staged"] += len(staged)
        return staged

    def reset_pass(self) -> tuple[list[int], list[int], list[int]]:
        """Stalled jobs (no heartbeat for over ``stalled_age``) back to the queue (or
        superseded), or failed once ``max_resets`` resets are spent."""
        reset, failed, superseded = [], [], []
        for job in sorted(self.jobs.values(), key=lambda j: j.ref):
            if job.state != PROCESSING or job.silent <= self.config.stalled_age:
                continue
            if job.num_resets < self.config.max_resets:
                if self._back(job, QUEUED):
                    job.num_resets += 1
                    reset.append(job.ref)
                else:
                    superseded.append(job.ref)
            else:
                job.state = FAILED
                failed.append(job.ref)
        EVENTS["reset"] += len(reset)
        EVENTS["failed by the resetter"] += len(failed)
        return reset, failed, superseded

    # -- the operator ----------------------------------------------------------------

    def operator_cancel(self, refs: Iterable[int]) -> None:
        for ref in refs:
            job = self.jobs[ref]
            if job.state in WAITING:
                job.state, job.cancel = CANCELED, True
            elif job.state == PROCESSING:
                job.cancel = True

    def operator_retry(self, refs: Iterable[int], reset_counters: bool) -> dict[int, int]:
        """Failed, errored and canceled jobs queued again, due now; those whose key
        another active job holds stay (returned, by their holder)."""
        held = {}
        for ref in sorted(refs):
            job = self.jobs[ref]
            if job.state not in RETRYABLE:
                continue
            # The active key first, then the waiting-only one (the model's order).
            holder = self.holder(job.key, besides=ref) or self.wholder(job.wkey, besides=ref)
            if holder is not None:
                EVENTS["retry: key held"] += 1
                held[ref] = holder.ref
                continue
            EVENTS["retried"] += 1
            job.state, job.cancel, job.wait, job.timed = QUEUED, False, 0, False
            if reset_counters:
                job.num_failures = job.num_resets = job.num_snoozes = 0
        return held

    def run_now(self, refs: Iterable[int]) -> None:
        for ref in refs:
            job = self.jobs[ref]
            if job.state in WAITING and job.wait > 0:
                job.wait, job.timed = 0, False

    def pause(self, queue: str) -> None:
        self.paused.add(queue)

    def resume(self, queue: str) -> None:
        self.paused.discard(queue)
