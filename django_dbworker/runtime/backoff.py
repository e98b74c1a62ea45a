"""Capped exponential backoff with jitter, for retrying after database errors."""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, base: float = 0.5, cap: float = 30.0) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0

    def next(self) -> float:
        """The delay before the next try; grows with each consecutive failure."""
        delay = min(self.cap, self.base * 2**self.failures)
        self.failures += 1
        return float(delay * random.uniform(0.5, 1.0))

    def reset(self) -> None:
        self.failures = 0
