"""Fleet-wide concurrency and rate limits of a handler, as the claim statement applies them.

A handler declares them as options (``max_concurrency``, ``concurrency_key``,
``max_concurrency_per_key``, ``rate_limit``, ``rate_limit_per_key``); ``Limits.of()``
reads them once per worker. The claim statement enforces them (``sql/limits.py``):

- a job counts against the concurrency limits from its claim until its outcome is
  written (state ``processing``, prefetched jobs included), wherever it runs; the
  resetter's rescue of a dead worker's job frees its slot;
- a rate limit is a token bucket in the database (``RateBucket``): a claim takes one
  token per job; the bucket holds at most ``burst`` tokens and refills at the rate, so
  over any span of ``T`` seconds at most ``burst + rate × T`` jobs of the handler (or of
  one key) are claimed, by all workers together;
- claims of a limited handler are serialised (a PostgreSQL advisory lock held for the
  claim's transaction; SQLite's write lock), so no race lets the fleet exceed a limit.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
import zlib
from typing import Any

#: Seconds per unit of a rate: ``"100/m"``, ``"5/s"``, ``"1000/h"``, ``"20/10s"``.
UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*([a-z]+)\s*$")
#: A default bucket holds this many seconds' worth of the rate (and at least 1 token).
DEFAULT_BURST_SECONDS = 0.05


@dataclasses.dataclass(frozen=True)
class RateLimit:
    """``count`` claims per ``per`` seconds, with a bucket of ``burst`` tokens.

    ``RateLimit("100/m")``, ``RateLimit("50/s", burst=10)``. A string option of a
    handler (``rate_limit = "100/m"``) is the same with the default burst:
    ``DEFAULT_BURST_SECONDS`` worth of the rate, at least one token.
    """

    text: str
    burst: int | None = None
    count: int = dataclasses.field(init=False)
    per: float = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        match = _RATE.match(self.text.lower()) if isinstance(self.text, str) else None
        unit = UNITS.get(match.group(3)) if match else None
        if match is None or unit is None:
            raise ValueError(f"rate {self.text!r} is not like '100/m', '5/s', '1000/h' or '20/10s'")
        count, multiple = int(match.group(1)), float(match.group(2) or 1)
        if count < 1 or multiple <= 0:
            raise ValueError(f"rate {self.text!r} must allow at least one job per period")
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "per", multiple * unit)
        if self.burst is not None and (
            isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1
        ):
            raise ValueError(f"burst must be an integer >= 1, not {self.burst!r}")

    @property
    def rate(self) -> float:
        """Tokens per second."""
        return self.count / self.per

    @property
    def capacity(self) -> int:
        """Most tokens the bucket holds: ``burst``, or the default."""
        if self.burst is not None:
            return self.burst
        return max(1, math.ceil(self.rate * DEFAULT_BURST_SECONDS))

    def __str__(self) -> str:
        return f"{self.text} (burst {self.capacity})"


def as_rate(value: Any) -> RateLimit | None:
    """A handler's rate option as a ``RateLimit`` (``ValueError`` if it is not one)."""
    if value is None or isinstance(value, RateLimit):
        return value
    if isinstance(value, str):
        return RateLimit(value)
    raise ValueError(f"a rate limit is a string like '100/m' or a RateLimit, not {value!r}")


@dataclasses.dataclass(frozen=True)
class Limits:
    """The limits of one handler, named for its buckets and lock by ``name``."""

    name: str
    max_concurrency: int | None = None
    key: str | None = None
    max_per_key: int | None = None
    rate: RateLimit | None = None
    rate_per_key: RateLimit | None = None

    @classmethod
    def of(cls, handler: Any) -> Limits | None:
        """The limits ``handler`` declares; None when it declares none."""
        limits = cls(
            name=handler.get_name(),
            max_concurrency=handler.max_concurrency,
            key=handler.concurrency_key,
            max_per_key=handler.max_concurrency_per_key,
            rate=as_rate(handler.rate_limit),
            rate_per_key=as_rate(handler.rate_limit_per_key),
        )
        return limits if limits.any else None

    @property
    def any(self) -> bool:
        return any(
            v is not None
            for v in (self.max_concurrency, self.max_per_key, self.rate, self.rate_per_key)
        )

    @property
    def per_key(self) -> bool:
        return self.key is not None and (
            self.max_per_key is not None or self.rate_per_key is not None
        )

    @property
    def lock_id(self) -> int:
        """The second number of the advisory lock (a signed 32-bit hash of the name)."""
        value = zlib.crc32(self.name.encode())
        return value - (1 << 32) if value >= 1 << 31 else value

    def bucket_name(self, per_key: bool) -> str:
        """The ``RateBucket.name`` of the handler's bucket, or of its per-key buckets."""
        return f"{self.name}{'#key' if per_key else ''}"

    def poll_after(self) -> float | None:
        """When a claim came back short while a rate limit may have held it: seconds until
        a bucket of the fastest rate gets its next token (None: no rate limit)."""
        rates = [r.rate for r in (self.rate, self.rate_per_key) if r is not None]
        return 1.0 / max(rates) if rates else None


#: How many of the busiest keys ``limits_usage`` lists.
BUSIEST = 10


@dataclasses.dataclass
class Usage:
    """What a limited handler uses now (``limits_usage``)."""

    limits: Limits
    #: Its jobs in ``processing`` (every worker's, prefetched ones included).
    running: int
    #: (key as text, jobs in processing) of the busiest keys, busiest first.
    busiest: list[tuple[str, int]]
    #: Tokens its rate bucket holds now (None: no rate limit).
    tokens: float | None
    #: Keys whose own bucket is not full (None: no per-key rate limit).
    keys_limited: int | None
    #: Of a subset of the jobs (``limits_usage(rows=…)``): ``running`` and ``busiest``
    #: count those only; the buckets (every job's) are not read.
    subset: bool = False

    def lines(self) -> list[str]:
        """The usage in words, a line per limit (``dbworker_status``, the admin)."""
        limits = self.limits
        if self.subset:
            return self._subset_lines()
        cap = f"/{limits.max_concurrency}" if limits.max_concurrency is not None else ""
        lines = [f"{self.running}{cap} running"]
        if limits.key is not None and self.busiest:
            per = f" (at most {limits.max_per_key} each)" if limits.max_per_key else ""
            keys = ", ".join(f"{key}: {n}" for key, n in self.busiest)
            lines.append(f"busiest {limits.key} values{per}: {keys}")
        if limits.rate is not None and self.tokens is not None:
            lines.append(f"rate {limits.rate}: {self.tokens:.1f} tokens left")
        if limits.rate_per_key is not None:
            lines.append(
                f"rate per {limits.key} {limits.rate_per_key}: "
                f"{self.keys_limited or 0} keys below a full bucket"
            )
        return lines

    def _subset_lines(self) -> list[str]:
        """The limits, and what the jobs of the subset use of them: nothing of the
        other jobs (their count, their keys, the buckets they drain)."""
        limits = self.limits
        cap = (
            f" (the limit, {limits.max_concurrency}, counts every job)"
            if limits.max_concurrency is not None
            else ""
        )
        lines = [f"{self.running} of the jobs you can see running{cap}"]
        if limits.key is not None and self.busiest:
            per = f" (at most {limits.max_per_key} each)" if limits.max_per_key else ""
            keys = ", ".join(f"{key}: {n}" for key, n in self.busiest)
            lines.append(f"busiest {limits.key} values of the jobs you can see{per}: {keys}")
        if limits.rate is not None:
            lines.append(f"rate {limits.rate}, shared by every job")
        if limits.rate_per_key is not None:
            lines.append(f"rate per {limits.key} {limits.rate_per_key}")
        return lines


def limits_usage(handler: Any, rows: Any = None) -> Usage | None:
    """The current usage of the limits of ``handler`` (None if it has none), from the
    database its jobs are in. ``rows``: a queryset of the jobs to count (a subset the
    reader may see, e.g. a tenant's): the running jobs and busiest keys are of those
    only, and the rate buckets (which every job drains) are not read."""
    from django.db import router
    from django.db.models import Count

    from ..states import JobState
    from .models import RateBucket

    limits = Limits.of(handler)
    if limits is None:
        return None
    model = handler.model
    alias = router.db_for_read(model)
    source = model._base_manager.using(alias) if rows is None else rows
    running = source.filter(state=JobState.PROCESSING)
    if handler.dequeue_filter is not None:
        running = running.filter(handler.dequeue_filter)
    busiest: list[tuple[str, int]] = []
    if limits.key is not None:
        field = model._meta.get_field(limits.key).name
        keyed = running.exclude(**{f"{field}__isnull": True}).values_list(field)
        counted = keyed.annotate(n=Count("pk")).order_by("-n")[:BUSIEST]
        busiest = [(str(key), n) for key, n in counted]
    if rows is not None:
        return Usage(limits, running.count(), busiest, None, None, subset=True)
    buckets = RateBucket.objects.using(alias)
    now = time.time()
    tokens = None
    if limits.rate is not None:
        bucket = buckets.filter(name=limits.bucket_name(False), key="").first()
        capacity = float(limits.rate.capacity)
        tokens = capacity if bucket is None else refilled(bucket, limits.rate, now)
    keys_limited = None
    if limits.rate_per_key is not None:
        keys_limited = buckets.filter(name=limits.bucket_name(True), full_at__gt=now).count()
    return Usage(limits, running.count(), busiest, tokens, keys_limited)


def refilled(bucket: Any, rate: RateLimit, now: float) -> float:
    """The tokens ``bucket`` (a ``RateBucket``) holds at ``now``."""
    return float(min(rate.capacity, bucket.tokens + (now - bucket.at) * rate.rate))


def limited_handlers(paths: Any = ()) -> list[Any]:
    """Handlers with limits among ``paths`` (dotted paths) and ``DBWORKER["HANDLERS"]``
    (``known_handlers``: never a name read from the worker registry)."""
    from ..handler import known_handlers

    return [h for h in known_handlers(paths) if Limits.of(h) is not None and h.model is not None]
