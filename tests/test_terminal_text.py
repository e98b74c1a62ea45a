"""What the commands print from the database or from jobs reaches the operator's
terminal printed, not acted on: check-in texts, pause reasons, schedule and worker
names, failure messages and tracebacks in the worker's log (issue 42, item 6)."""

import io
import logging
import re
import sys

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_dbworker.control.models import Pause, Schedule
from django_dbworker.models import WorkerProcess
from django_dbworker.text import PrintableFormatter, printable
from tests.factories import JobFactory
from tests.testapp.models import QueueJob

#: What a job or a row can carry to a terminal: a colour (CSI), an OSC 52 clipboard
#: write ended by BEL, a window title (OSC 0 ended by ST), backspaces and a carriage
#: return that overwrite what was printed, a single-byte CSI (C1), a bidi override.
HOSTILE = (
    "\x1b[31mred\x1b[0m \x1b]52;c;cm0gLXJmIH4=\x07 \x1b]0;owned\x1b\\ abc\x08\x08\x08"
    "\rfake line\n2026-01-01 INFO forged \x9b2J \u202eevil\u202c \x7f\u2028"
)

#: Control characters a terminal acts on (C0 but newline, DEL, C1), and the bidi
#: and line-separator characters that reorder or split what it shows.
ACTING = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def test_printable_escapes_every_control_and_keeps_the_text():
    shown = printable(HOSTILE + "\x00")  # (NUL: PostgreSQL's text cannot hold one)
    assert not ACTING.search(shown)
    assert "\n" not in shown
    for escaped in ("\\x1b[31mred", "\\x07", "\\x08", "\\rfake line\\n2026", "\\x9b2J"):
        assert escaped in shown
    assert "\\u202eevil" in shown
    assert printable("plain text, ünïcode, emoji 👍, tabs\tin a traceback", multiline=True) == (
        "plain text, ünïcode, emoji 👍, tabs\tin a traceback"
    )
    assert printable("line 1\nline 2\x1b[2J", multiline=True) == "line 1\nline 2\\x1b[2J"


def test_the_formatter_keeps_a_record_on_one_line_and_a_traceback_inert():
    try:
        raise RuntimeError(HOSTILE)
    except RuntimeError:
        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "django_dbworker.writer", logging.ERROR, __file__, 1, "job 1: %s", (HOSTILE,), exc_info
    )
    text = PrintableFormatter("%(levelname)s %(message)s").format(record)
    first, *rest = text.split("\n")
    assert first.startswith("ERROR job 1: \\x1b[31mred")
    assert "forged" in first
    assert rest[0] == "Traceback (most recent call last):"
    assert not ACTING.search(text)


def acting(text):
    return ACTING.findall(text)


@pytest.mark.django_db
def test_dbworker_status_prints_check_ins_names_and_workers_inert():
    job = JobFactory(state="processing", started_at=timezone.now())
    QueueJob.objects.filter(pk=job.pk).update(progress={"text": HOSTILE, "done": 1, "total": 2})
    Pause.objects.create(name=f"x{HOSTILE}", reason=HOSTILE, paused_by=HOSTILE)
    Schedule.objects.create(name=f"s{HOSTILE}", expression="* * * * *", target="t", enabled=False)
    now = timezone.now()
    WorkerProcess.objects.create(
        worker_id=f"w{HOSTILE}"[:255],
        hostname="h",
        pid=1,
        started_at=now,
        last_heartbeat_at=now,
        pool={"size": 2, "busy": 1, "handlers": {HOSTILE: {"weight": 1, "busy": 1}}},
    )
    out = io.StringIO()
    call_command("dbworker_status", stdout=out)
    shown = out.getvalue()
    assert acting(shown) == []
    assert f"testapp.QueueJob:{job.pk}  \\x1b[31mred" in shown
    assert "(50%)" in shown  # the check-in stays one line, its figures after it
    assert "paused: x\\x1b[31mred" in shown
    assert "schedule switched off: s\\x1b[31mred" in shown
    assert "  w\\x1b[31mred" in shown


@pytest.mark.django_db
def test_dbworker_paused_and_schedules_print_reasons_and_names_inert():
    Pause.objects.create(name=f"x{HOSTILE}", reason=HOSTILE, paused_by=HOSTILE)
    Schedule.objects.create(
        name=f"s{HOSTILE}",
        expression="* * * * *",
        target="t",
        timezone=HOSTILE[:64],
        last_job=HOSTILE,
    )
    for action in ("paused", "schedules"):
        out = io.StringIO()
        call_command("dbworker", action, stdout=out)
        lines = out.getvalue().splitlines()
        assert len(lines) == 1, lines  # one row, one line: no forged line
        assert acting(lines[0]) == []
        assert "\\x1b]52;c;cm0gLXJmIH4=\\x07" in lines[0]


@pytest.mark.django_db
def test_dbworker_consumers_prints_owners_and_runners_inert():
    from django_dbworker.consumers.models import ConsumerCheckpoint

    ConsumerCheckpoint.objects.create(name="events", owner=HOSTILE, running_by=HOSTILE)
    out = io.StringIO()
    call_command("dbworker_consumers", stdout=out)
    [line] = out.getvalue().splitlines()
    assert acting(line) == []
    assert "owner \\x1b[31mred" in line


def run_command(*args):
    """``python -m django <args>`` with the test settings and database (stderr: the log)."""
    from tests.test_commands import manage

    return manage(*args, database_url=_database_url(), timeout=120)


def _database_url():
    from tests.conftest import test_database_url as url

    return url()


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_runworker_logs_a_jobs_failure_message_inert():
    """The worker's own log (on stderr unless the project configured logging) prints a
    failure message and the traceback of a job's exception without acting on them."""
    job = JobFactory(behavior="raise", payload={"message": HOSTILE})
    done = run_command("runworker", "tests.testapp.handlers.BehaviorHandler", "--burst", "-v", "2")
    assert done.returncode == 0, done.stderr
    assert QueueJob.objects.get(pk=job.pk).state == "failed"
    assert f"job testapp.QueueJob:{job.pk}: failed after" in done.stderr
    assert ": RuntimeError: \\x1b[31mred" in done.stderr  # the message, on its line
    assert acting(done.stderr) == [], done.stderr


@pytest.mark.subprocess
@pytest.mark.django_db(transaction=True)
def test_runresetter_logs_a_rows_worker_name_inert():
    from datetime import timedelta

    JobFactory(
        state="processing",
        worker_hostname=HOSTILE[:255],
        last_heartbeat_at=timezone.now() - timedelta(minutes=5),
    )
    done = run_command("runresetter", "tests.testapp.handlers.BehaviorHandler", "--once", "-v", "2")
    assert done.returncode == 0, done.stderr
    assert "from worker \\x1b[31mred" in done.stderr
    assert acting(done.stderr) == [], done.stderr
