"""What the workers finished, per minute: the data behind the admin's dashboard.

Each worker process counts the outcomes it writes per handler, with a histogram of
attempt durations, and writes its own row per (minute, handler) every few seconds
(``runtime.stats``). The dashboard sums the rows of all workers. The rows are small
and few (one per worker, handler and minute), so charts over the last hour or day
cost the same whatever the size of the job tables; old rows are deleted after
``DBWORKER["STATS_RETENTION"]``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from django.db import models

#: Upper bounds (seconds) of the duration histogram's buckets; a last one takes the rest.
DURATION_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
#: The outcomes counted (the state each outcome wrote; ``lost``: nothing was written).
OUTCOMES = ("completed", "errored", "failed", "canceled", "requeued", "lost")


def bucket_of(seconds: float) -> int:
    """The index of the histogram bucket ``seconds`` falls in."""
    return bisect.bisect_left(DURATION_BUCKETS, seconds)


def percentile(histogram: Sequence[int], fraction: float) -> float | None:
    """The duration below which ``fraction`` of the counted attempts fall, from a
    histogram over ``DURATION_BUCKETS`` (interpolated within its bucket; None if empty).
    The last bucket has no upper bound: its lower bound is returned."""
    total = sum(histogram)
    if total == 0:
        return None
    rank = fraction * total
    seen = 0
    for index, count in enumerate(histogram):
        if count and seen + count >= rank:
            low = DURATION_BUCKETS[index - 1] if index > 0 else 0.0
            if index >= len(DURATION_BUCKETS):
                return low
            high = DURATION_BUCKETS[index]
            return low + (high - low) * (rank - seen) / count
        seen += count
    return DURATION_BUCKETS[-1]


def merged(histograms: Iterable[Sequence[int]]) -> list[int]:
    """The sum of several histograms (rows of several workers or minutes)."""
    total = [0] * (len(DURATION_BUCKETS) + 1)
    for histogram in histograms:
        for index, count in enumerate(histogram[: len(total)]):
            total[index] += int(count)
    return total


class JobStats(models.Model):
    """What one worker process finished of one handler in one minute."""

    minute = models.DateTimeField(help_text="The start of the minute (UTC).")
    handler = models.CharField(max_length=255)
    model = models.CharField(max_length=255, help_text="The job model, app_label.Model.")
    worker = models.CharField(max_length=255)
    completed = models.PositiveIntegerField(default=0)
    errored = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    canceled = models.PositiveIntegerField(default=0)
    requeued = models.PositiveIntegerField(default=0)
    lost = models.PositiveIntegerField(default=0)
    duration_sum = models.FloatField(default=0.0, help_text="Seconds, all attempts counted.")
    durations = models.JSONField(
        default=list, help_text="Attempts per duration bucket (stats.DURATION_BUCKETS)."
    )

    class Meta:
        verbose_name = "job statistics"
        verbose_name_plural = "job statistics"
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "handler", "worker"], name="dbworker_stats_once"
            )
        ]
        indexes = [models.Index(fields=["model", "minute"], name="dbworker_stats_model")]

    def __str__(self) -> str:
        return f"{self.handler} @ {self.minute:%Y-%m-%d %H:%M} ({self.worker})"
