"""Text for people: durations as the logs and the admin show them."""

from __future__ import annotations

from datetime import timedelta

#: What an unknown or empty value reads as, everywhere (``WorkerJobAdmin``'s
#: ``empty_value_display``, the job page, logs).
EMPTY = "–"


def human_duration(delta: timedelta | float | None, empty: str = EMPTY) -> str:
    """``850 ms``, ``32.8 s``, ``4.2 min``, ``3.0 h``: one style for logs and the admin."""
    if delta is None:
        return empty
    seconds = delta.total_seconds() if isinstance(delta, timedelta) else float(delta)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def plain_number(value: float) -> str:
    """``1000000`` for a whole number (not ``1e+06``), else up to 6 significant digits."""
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"
