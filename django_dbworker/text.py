"""Text for people: durations as the logs and the admin show them; keys that fit their
column without being cut."""

from __future__ import annotations

import hashlib
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


#: What a key too long for its column holds after its first characters: the SHA-256 of
#: the whole key follows (``fitted_key``).
DIGEST_MARK = "…sha256:"


def fitted_key(key: str, limit: int) -> str:
    """``key`` in at most ``limit`` characters, never cut: a key that fits is kept as it
    is; a longer one (or one that holds ``DIGEST_MARK`` itself) becomes its first
    characters, ``DIGEST_MARK`` and the SHA-256 of the whole key. Two different keys
    never get the same text (short of a SHA-256 collision): a key cut to fit would make
    two keys sharing a long prefix one."""
    if len(key) <= limit and DIGEST_MARK not in key:
        return key
    tail = DIGEST_MARK + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    if limit < len(tail):
        raise ValueError(f"a key column needs at least {len(tail)} characters, not {limit}")
    return key[: limit - len(tail)] + tail
