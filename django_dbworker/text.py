"""Text for people: durations as the logs and the admin show them; keys that fit their
column without being cut; text from the database or from jobs made safe to print on a
terminal."""

from __future__ import annotations

import hashlib
import logging
from datetime import timedelta
from typing import Any

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


def sentence(text: str) -> str:
    """``text`` ending as a sentence: with a period, unless it ends with one already (or
    with ``?``, ``!``), so a message built around a sentence does not read ``?.``."""
    text = text.rstrip()
    return text if text.endswith((".", "?", "!")) else f"{text}."


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


#: Characters a terminal acts on instead of showing, besides the C0 and C1 controls:
#: the bidirectional overrides, embeddings and isolates (U+202A–U+202E, U+2066–U+2069),
#: the direction marks, and the line and paragraph separators.
_INVISIBLE = frozenset(
    "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _is_control(char: str) -> bool:
    code = ord(char)
    return code < 0x20 or 0x7F <= code < 0xA0 or char in _INVISIBLE


def _escape(char: str) -> str:
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, multiline: bool = False) -> str:
    """``text`` as it may reach an operator's terminal: each control character (ESC and
    the sequences it starts, BEL, backspace, carriage return, the C1 controls such as
    the one-byte CSI U+009B, the bidirectional overrides) shown as its escape
    (``\\x1b``, ``\\r``, ``\\u202e``) instead of acting. A newline is escaped too
    unless ``multiline`` (a traceback), where a tab is kept as well. For what comes from
    the database or from jobs: check-in texts, pause reasons, failure messages, keys."""
    text = str(text)
    if text.isprintable() or not any(map(_is_control, text)):
        return text
    keep = "\n\t" if multiline else ""
    return "".join(_escape(c) if _is_control(c) and c not in keep else c for c in text)


class PrintableFormatter(logging.Formatter):
    """A log formatter that prints a record's message on one line and its traceback
    without control characters (``printable()``): a failure message or an exception
    text of a job cannot move the cursor, recolour, retitle or write the clipboard of
    the terminal that shows the log. ``runworker`` and ``runresetter`` log through it
    unless the project configured logging; a project's ``LOGGING`` can name it
    (``"()": "django_dbworker.text.PrintableFormatter"``)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return printable(super().formatException(ei), multiline=True)

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info), multiline=True)
