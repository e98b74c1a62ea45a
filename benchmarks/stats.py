"""Summaries of repeated measurements."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median and range of the repetitions (and the values themselves)."""
    values = list(values)
    if not values:
        return {"median": None, "min": None, "max": None, "values": []}
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": values,
    }


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(p / 100 * len(ordered))))
    return ordered[rank - 1]
