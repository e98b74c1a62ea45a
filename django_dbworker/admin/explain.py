""" "Why is this job not running?": the reasons that apply to one job now.

Checked against the row itself (state, ``process_after``, counters, cancel flag), the
handlers that serve its model (their ``dequeue_filter``, retry and reset budgets,
limits), the worker registry (a live worker that runs such a handler) and the pauses.
A handful of queries, each on the job's primary key, the small registry and control
tables, or the active rows (``state`` index): none grows with the finished rows.

What it tells of other jobs is of the jobs the reader may see (``scope.Visible``): to a
user who sees a subset of the table (a tenant's jobs), a limit held says so with its
size and that user's jobs only, and the jobs ahead are that user's.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import router
from django.utils import timezone

from ..control.limits import Limits, limits_usage, refilled
from ..control.models import RateBucket
from ..handler import Handler, seconds
from ..states import DEQUEUEABLE_STATES, JobState
from ..text import human_duration
from .scope import Visible
from .serving import Serving

#: How many claimable jobs ahead of this one are counted at most.
AHEAD_LIMIT = 10_000


@dataclass(frozen=True)
class Reason:
    """One reason: ``code`` (stable, for tests and styling), ``text`` (for people) and
    whether it keeps the job from running (``blocking``) or just describes it."""

    code: str
    text: str
    blocking: bool = True


def _when(value: datetime, now: datetime) -> str:
    local = timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")
    delta = (value - now).total_seconds()
    return f"{local} (in {human_duration(delta)})" if delta > 0 else local


def _first_line(text: str | None) -> str:
    line = (text or "").strip().split("\n", 1)[0]
    return line[:200]


def explain(
    job: Any, serving: Serving, now: datetime | None = None, visible: Visible | None = None
) -> list[Reason]:
    """The reasons ``job`` is not running now (or what it is doing, if it runs), told
    with the jobs of ``visible`` (default: every job)."""
    now = now or timezone.now()
    if visible is None:
        model = type(job)
        visible = Visible.of(model._base_manager.using(router.db_for_read(model)))
    model = type(job)
    state = job.state
    handlers = serving.handlers
    if state == JobState.PROCESSING:
        return _processing(job, handlers, now)
    if state == JobState.COMPLETED:
        when = _when(job.finished_at, now) if job.finished_at else "?"
        return [Reason("completed", f"It has run: completed at {when}.", blocking=False)]
    if state == JobState.CANCELED:
        why = _first_line(job.failure_message)
        return [Reason("canceled", f"It was canceled{': ' + why if why else ''}.")]
    if state == JobState.FAILED:
        return [_failed(job, handlers)]
    reasons: list[Reason] = []
    if job.process_after and job.process_after > now:
        when = _when(job.process_after, now)
        if state == JobState.ERRORED:
            budget = _budget(job, handlers)
            reasons.append(
                Reason(
                    "retry_wait",
                    f"It is waiting for its retry: not claimed before {when}"
                    f"; it failed {job.num_failures} time(s){budget}.",
                )
            )
        elif _snoozed(job):
            reasons.append(
                Reason(
                    "snoozed",
                    f"It snoozed (its handler raised Snooze): not claimed before {when}; "
                    f"it snoozed {job.num_snoozes} time(s).",
                )
            )
        else:
            reasons.append(
                Reason(
                    "scheduled",
                    f"It is scheduled: not claimed before {when}.",
                )
            )
    if not handlers:
        reasons.append(
            Reason(
                "no_handler",
                f"No handler serves {model._meta.label}: none in DBWORKER['HANDLERS'] (the "
                "admin knows the handlers the settings name, not those a worker was given "
                "on its command line).",
            )
        )
        return reasons
    takers = [h for h in handlers if _takes(h, job)]
    if not takers:
        names = ", ".join(h.get_name() for h in handlers)
        reasons.append(
            Reason(
                "no_matching_handler",
                f"None of the handlers of this model takes it "
                f"(its fields match no dequeue_filter of: {names}).",
            )
        )
        return reasons
    # The job waits only while every handler that takes it is held: what holds one
    # of them while another is free is told, not blocking.
    held_by = [_holds(handler, job, serving, now, visible) for handler in takers]
    free = any(not holds for holds in held_by)
    for holds in held_by:
        for reason in holds:
            if free:
                reason = dataclasses.replace(
                    reason,
                    text=f"{reason.text} Another handler that takes it is free.",
                    blocking=False,
                )
            reasons.append(reason)
    due = not (job.process_after and job.process_after > now)
    if due and free:
        reasons.append(_ahead(job, visible))
    return reasons


def _holds(
    handler: Handler, job: Any, serving: Serving, now: datetime, visible: Visible
) -> list[Reason]:
    """What keeps ``handler`` from claiming ``job`` now: no live worker, a pause, a
    limit held."""
    name = handler.get_name()
    reasons = []
    if not serving.live_workers(handler):
        silent = len(serving.silent_workers(handler))
        more = f" ({silent} silent worker(s) ran it: dead?)" if silent else ""
        reasons.append(Reason("no_live_worker", f"No live worker runs handler {name}{more}."))
    pause = serving.pause_of(handler, job)
    if pause is not None:
        by = f" by {pause.paused_by}" if pause.paused_by else ""
        why = f": {pause.reason}" if pause.reason else ""
        reasons.append(
            Reason(
                "paused", f"{pause.name} is paused{by} since {_when(pause.paused_at, now)}{why}."
            )
        )
    return reasons + _limits(handler, job, visible)


def _processing(job: Any, handlers: list[Handler], now: datetime) -> list[Reason]:
    worker = job.worker_hostname or "(unknown)"
    since = f" since {_when(job.started_at, now)}" if job.started_at else ""
    reasons = [Reason("running", f"It is running on worker {worker}{since}.", blocking=False)]
    if job.cancel:
        reasons.append(
            Reason(
                "cancel_requested",
                "Its cancellation is requested: the worker stops it at its next heartbeat.",
                blocking=False,
            )
        )
    ages = [seconds(h.stalled_max_age) or 0.0 for h in handlers] or [30.0]
    if job.last_heartbeat_at is not None:
        age = (now - job.last_heartbeat_at).total_seconds()
        if age > min(ages):
            reasons.append(
                Reason(
                    "stalled",
                    f"Its last heartbeat is {human_duration(age)} old: its worker "
                    "may be gone; the resetter queues it again (or fails it when its resets "
                    "are spent).",
                )
            )
    return reasons


def _budget(job: Any, handlers: list[Handler]) -> str:
    if not handlers:
        return ""
    retries = max(h.shown_retry_budget(job) for h in handlers)
    return f" of {retries + 1} attempt(s) its handler allows"


def _failed(job: Any, handlers: list[Handler]) -> Reason:
    why = _first_line(job.failure_message)
    tail = f" Last failure: {why}" if why else ""
    if handlers:
        resets = max(h.max_num_resets for h in handlers)
        retries = max(h.shown_retry_budget(job) for h in handlers)
        # The resetter fails a stalled job whose num_resets reached max_num_resets,
        # with the handler's reset_failure_message.
        by_resetter = {_first_line(h.reset_failure_message) for h in handlers}
        if why in by_resetter or (not why and resets and job.num_resets >= resets):
            return Reason(
                "resets_spent",
                f"It failed: its resets are spent (reset {job.num_resets} time(s), "
                f"max_num_resets {resets}).{tail}",
            )
        if job.num_failures > retries:
            return Reason(
                "retries_spent",
                f"It failed: its retries are spent (failed {job.num_failures} time(s), "
                f"max_num_retries {retries}).{tail}",
            )
    return Reason(
        "failed", f"It failed without a retry left or allowed (a non-retryable error).{tail}"
    )


def _takes(handler: Handler, job: Any) -> bool:
    if handler.dequeue_filter is None:
        return True
    rows = type(job)._base_manager.using(router.db_for_read(type(job)))
    return bool(rows.filter(handler.dequeue_filter).filter(pk=job.pk).exists())


def _limits(handler: Handler, job: Any, visible: Visible) -> list[Reason]:
    """The limits of ``handler`` held now. Whether one is held is judged on every job;
    a reader who sees a subset is told the limit's size and their own jobs only."""
    limits = Limits.of(handler)
    if limits is None:
        return []
    usage = limits_usage(handler)
    if usage is None:
        return []
    name = handler.get_name()
    reasons = []
    if limits.max_concurrency is not None and usage.running >= limits.max_concurrency:
        if visible.whole:
            figures = f"{usage.running} of {limits.max_concurrency} running"
        else:
            mine = limits_usage(handler, visible.rows)
            figures = (
                f"its {limits.max_concurrency} slot(s) are taken, "
                f"{mine.running if mine else 0} of them by jobs you can see"
            )
        reasons.append(
            Reason("concurrency_limit", f"The concurrency limit of {name} is held: {figures}.")
        )
    if limits.key is not None and limits.max_per_key is not None:
        key = getattr(job, limits.key, None)
        running = dict(usage.busiest).get(str(key))
        if running is None:
            model = type(job)
            running = (
                model._base_manager.using(router.db_for_read(model))
                .filter(state=JobState.PROCESSING, **{limits.key: key})
                .count()
            )
        if running >= limits.max_per_key:
            figures = (
                f"{running} of {limits.max_per_key} running"
                if visible.whole
                else f"its {limits.max_per_key} slot(s) are taken"
            )
            reasons.append(
                Reason(
                    "key_concurrency_limit",
                    f"The concurrency limit per {limits.key} of {name} is held for "
                    f"{key}: {figures}.",
                )
            )
    if limits.rate is not None and usage.tokens is not None and usage.tokens < 1:
        wait = (1 - usage.tokens) / limits.rate.rate
        reasons.append(
            Reason(
                "rate_limit",
                f"The rate limit of {name} ({limits.rate}) is held: the next claim in "
                f"{human_duration(wait)}.",
            )
        )
    reasons += _key_rate(handler, limits, job)
    return reasons


def _key_rate(handler: Handler, limits: Limits, job: Any) -> list[Reason]:
    """The per-key rate limit, if the bucket of the job's key is out of tokens."""
    if limits.rate_per_key is None or limits.key is None:
        return []
    model = type(job)
    key = getattr(job, model._meta.get_field(limits.key).attname, None)
    if key is None:
        return []  # NULL keys share no bucket: not limited per key
    bucket = (
        RateBucket.objects.using(router.db_for_read(model))
        .filter(name=limits.bucket_name(True), key=str(key))
        .first()
    )
    if bucket is None:
        return []  # full
    tokens = refilled(bucket, limits.rate_per_key, time.time())
    if tokens >= 1:
        return []
    wait = (1 - tokens) / limits.rate_per_key.rate
    return [
        Reason(
            "key_rate_limit",
            f"The rate limit per {limits.key} of {handler.get_name()} "
            f"({limits.rate_per_key}) is held for {key}: its next claim in "
            f"{human_duration(wait)}.",
        )
    ]


def _ahead(job: Any, visible: Visible) -> Reason:
    rows = visible.rows
    due = rows.filter(state__in=DEQUEUEABLE_STATES, pk__lt=job.pk).exclude(
        process_after__gt=timezone.now()
    )
    count = due.order_by().values("pk")[: AHEAD_LIMIT + 1].count()
    many = f"more than {AHEAD_LIMIT:,}" if count > AHEAD_LIMIT else f"{count:,}"
    jobs = "claimable job(s)" if visible.whole else "claimable job(s) you can see"
    more = "" if visible.whole else ", and jobs you cannot see may too"
    return Reason(
        "claimable",
        f"Nothing holds it: a worker claims it when it gets there ({many} {jobs} "
        f"with lower ids come first in the default order{more}).",
        blocking=False,
    )


def _snoozed(job: Any) -> bool:
    """Whether the job's last attempt ended in a snooze (it waits for that)."""
    history = getattr(job, "history", None) or []
    last = history[-1] if history else None
    return isinstance(last, dict) and last.get("outcome") == "snoozed"
