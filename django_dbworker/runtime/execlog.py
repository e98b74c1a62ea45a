"""An attempt's execution log: its entries, bounded one by one and as a whole.

An entry keeps the last ``MAX_LOG_OUTPUT_LENGTH`` characters of its output, a key of
at most ``MAX_KEY_LENGTH`` characters and a command of at most
``MAX_COMMAND_LENGTH``. The whole log keeps at most ``MAX_LOG_ENTRIES`` entries and
``MAX_LOG_LENGTH`` characters (keys, commands and outputs): past either, its oldest
entries are dropped, and a first entry (``"dropped": n``) says how many. The
writer writes the whole log at each change, so these bounds are what one write
costs at most, and what the admin's job page reads.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from .. import conf

#: Characters of an entry's ``key`` kept (the rest is cut, ending in "…").
MAX_KEY_LENGTH = 200
#: Characters of an entry's ``command`` kept, its arguments together; the arguments
#: past it are left out, and a last one says how many.
MAX_COMMAND_LENGTH = 4000
#: The ``key`` of the entry that says how many entries were dropped.
DROPPED_KEY = "(earlier entries dropped)"


def as_text(value: str | bytes) -> str:
    """Output as text; bytes that are not UTF-8 are replaced, never refused."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def as_command(command: str | bytes | Iterable[str | bytes]) -> list[str]:
    """A command as a list of strings: a string is a command line (split like a shell
    would, so the admin shows it as written), an iterable its arguments; at most
    ``MAX_COMMAND_LENGTH`` characters of them."""
    if isinstance(command, str | bytes):
        line = as_text(command)
        try:
            arguments = shlex.split(line)
        except ValueError:  # unbalanced quotes: keep it whole
            arguments = [line]
    elif isinstance(command, Iterable):
        arguments = [as_text(part) for part in command]
    else:
        raise TypeError(
            f"command must be a string or a list of strings, not {type(command).__name__}"
        )
    return _bounded_command(arguments)


def _bounded_command(arguments: list[str]) -> list[str]:
    kept: list[str] = []
    room = MAX_COMMAND_LENGTH
    for i, argument in enumerate(arguments):
        if len(argument) > room:
            if room > 0:
                kept.append(_cut(argument, room))
            left = len(arguments) - i - (1 if room > 0 else 0)
            if left:
                kept.append(f"[… {left} more argument{'s' if left != 1 else ''}]")
            break
        kept.append(argument)
        room -= len(argument)
    return kept


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def _text_size(key: str, command: Sequence[str]) -> int:
    return len(key) + sum(map(len, command))


class LogEntry:
    """An execution-log entry. Every change reaches the job row at once (written by the
    worker's writer thread, so logging never blocks the handler on the database)."""

    def __init__(
        self, log: ExecutionLog, key: str, command: Sequence[str], out: str | bytes
    ) -> None:
        self._log = log
        self._started = time.monotonic()
        self._tail = ""
        self._cut = 0
        key = _cut(str(key), MAX_KEY_LENGTH)
        #: Characters counted against ``MAX_LOG_LENGTH``: key, command and output.
        self.size = _text_size(key, command)
        #: Dropped from the log (older entries past its bounds): changes are kept here
        #: only.
        self.dropped = False
        self.data: dict[str, Any] = {
            "key": key,
            "command": list(command),
            "start_time": datetime.now(UTC).isoformat(),
            "exit_code": None,
            "out": "",
            "duration_ms": None,
        }
        self._set_out(as_text(out), append=False)

    def _set_out(self, text: str, *, append: bool) -> None:
        """Keep the tail of the output (the last lines are where the error is) within
        ``MAX_LOG_OUTPUT_LENGTH``, with a marker saying how much was cut before it."""
        limit = conf.get("MAX_LOG_OUTPUT_LENGTH")
        text = text.replace("\x00", "\ufffd")
        if append:
            text = self._tail + text
        else:
            self._cut = 0
        if len(text) > limit:
            self._cut += len(text) - limit
            text = text[-limit:]
        self._tail = text
        marker = f"[… {self._cut} earlier characters cut]\n" if self._cut else ""
        before = len(self.data["out"])
        self.data["out"] = marker + text
        self.size += len(self.data["out"]) - before

    def update(
        self,
        *,
        out: str | bytes | None = None,
        exit_code: int | None = None,
        duration_ms: int | None = None,
    ) -> None:
        """Replace the output and/or set exit code and duration."""
        with self._log.lock:
            if out is not None:
                self._log.resize(self, lambda: self._set_out(as_text(out), append=False))
            if exit_code is not None:
                self.data["exit_code"] = int(exit_code)
            if duration_ms is not None:
                self.data["duration_ms"] = int(duration_ms)
        self._log.changed()

    def write(self, text: str | bytes) -> None:
        """Append to the output."""
        with self._log.lock:
            self._log.resize(self, lambda: self._set_out(as_text(text), append=True))
        self._log.changed()

    def finish(self, exit_code: int = 0, out: str | bytes | None = None) -> None:
        """Set the exit code and the duration measured since the entry began."""
        self.update(
            out=out,
            exit_code=exit_code,
            duration_ms=round((time.monotonic() - self._started) * 1000),
        )

    def __enter__(self) -> LogEntry:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.data["duration_ms"] is None:
            self.finish(exit_code=self.data["exit_code"] or (1 if exc_type else 0))


class ExecutionLog:
    """The entries of one attempt, in ``entries`` (the job's own list: the row's JSON),
    bounded as a whole. ``lock`` guards them; ``changed`` tells the attempt (outside
    the lock) that the writer has something to write."""

    def __init__(
        self, entries: list[dict[str, Any]], lock: threading.Lock, changed: Callable[[], None]
    ) -> None:
        self.entries = entries
        self.lock = lock
        self.changed = changed
        #: The entries kept, oldest first (``entries`` without the dropped-entries one).
        self._kept: list[LogEntry] = []
        self._size = 0
        self._dropped = 0

    def add(self, key: str, command: Sequence[str], out: str | bytes) -> LogEntry:
        """A new entry at the end (the caller holds ``lock``)."""
        entry = LogEntry(self, key, command, out)
        self._kept.append(entry)
        self.entries.append(entry.data)
        self._size += entry.size
        self._bound()
        return entry

    def resize(self, entry: LogEntry, change: Callable[[], None]) -> None:
        """Apply ``change`` to ``entry`` and count its new size (the caller holds
        ``lock``)."""
        before = entry.size
        change()
        if not entry.dropped:
            self._size += entry.size - before
            self._bound()

    def _bound(self) -> None:
        """Drop the oldest entries past ``MAX_LOG_ENTRIES`` or ``MAX_LOG_LENGTH``; the
        newest is always kept (its output is bounded on its own)."""
        most_entries = conf.get("MAX_LOG_ENTRIES")
        most_chars = conf.get("MAX_LOG_LENGTH")
        dropped = 0
        while len(self._kept) > 1 and (len(self._kept) > most_entries or self._size > most_chars):
            oldest = self._kept.pop(0)
            oldest.dropped = True
            self._size -= oldest.size
            del self.entries[1 if self._dropped or dropped else 0]
            dropped += 1
            if not self._dropped and dropped == 1:
                self.entries.insert(0, self._marker(oldest.data["start_time"]))
        if dropped:
            self._dropped += dropped
            marker = self.entries[0]
            marker["dropped"] = self._dropped
            marker["out"] = (
                f"[… {self._dropped} earlier entr{'y' if self._dropped == 1 else 'ies'} "
                f"dropped: a log keeps its last {most_entries} entries and "
                f"{most_chars} characters (DBWORKER['MAX_LOG_ENTRIES'], "
                "DBWORKER['MAX_LOG_LENGTH'])]"
            )

    @staticmethod
    def _marker(start_time: str) -> dict[str, Any]:
        return {
            "key": DROPPED_KEY,
            "command": [],
            "start_time": start_time,
            "exit_code": None,
            "out": "",
            "duration_ms": None,
            "dropped": 0,
        }
