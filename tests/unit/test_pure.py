"""Pure helpers: backoff, retry delays, durations, command lines, the log's tail."""

import datetime
import decimal
import json
import uuid
from types import SimpleNamespace

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.test import override_settings

from django_dbworker.exceptions import NonRetryableError
from django_dbworker.runtime.attempt import Attempt, as_command
from django_dbworker.runtime.backoff import Backoff
from django_dbworker.runtime.execution import Execution
from django_dbworker.runtime.outcome import clean_text
from django_dbworker.sql.drivers import numbered
from django_dbworker.text import human_duration
from tests.testapp.handlers import BehaviorHandler


def test_backoff_doubles_to_its_cap_with_jitter_and_starts_over_on_reset():
    backoff = Backoff(base=1.0, cap=4.0)
    delays = [backoff.next() for _ in range(5)]
    for delay, ceiling in zip(delays, [1, 2, 4, 4, 4], strict=True):
        assert ceiling / 2 <= delay <= ceiling
    backoff.reset()
    assert backoff.next() <= 1.0


def test_retry_delay_grows_and_is_capped():
    handler = BehaviorHandler(retry_after=10, retry_backoff=3, retry_max_delay=50)
    assert [handler.retry_delay(n) for n in (1, 2, 3)] == [10, 30, 50]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "–"), (0.0123, "12 ms"), (32.84, "32.8 s"), (300, "5.0 min"), (10800, "3.0 h")],
)
def test_human_duration(seconds, text):
    assert human_duration(seconds) == text


def test_as_command():
    assert as_command("git clone 'a b'") == ["git", "clone", "a b"]
    assert as_command("unbalanced 'quote") == ["unbalanced 'quote"]
    assert as_command([b"ls", "-l"]) == ["ls", "-l"]
    with pytest.raises(TypeError):
        as_command(3)


def test_clean_text_replaces_nul_and_caps():
    assert clean_text("a\x00b", 10) == "a\ufffdb"
    assert clean_text("x" * 12, 10) == "x" * 10 + "\n… [2 more characters cut]"


class Lane(SimpleNamespace):
    """What an attempt asks of its lane (the job's label, the writer's ear)."""

    def __init__(self):
        super().__init__(label="lane", worker_id="w", handler=BehaviorHandler(), changes=[])

    def job_label(self, pk):
        return f"job:{pk}"

    def max_runtime_of(self, job):
        return None

    def logs_changed(self, attempt):
        self.changes.append(attempt.take_logs())


@override_settings(DBWORKER={"MAX_LOG_OUTPUT_LENGTH": 20})
def test_the_log_keeps_the_tail_and_counts_what_it_cut():
    lane = Lane()
    attempt = Attempt(SimpleNamespace(pk=1, execution_logs=[]), lane)
    entry = attempt.log("build", "make all")
    for i in range(10):
        entry.write(f"line {i}\n")  # 7 characters each
    out = attempt.logs[0]["out"]
    written = "".join(f"line {i}\n" for i in range(10))
    assert out == "[… 50 earlier characters cut]\n" + written[-20:]
    assert attempt.logs[0]["command"] == ["make", "all"]
    assert len(lane.changes) == 11  # each change reached the writer's queue


@override_settings(
    DBWORKER={"MAX_LOG_ENTRIES": 3, "MAX_LOG_LENGTH": 900, "MAX_LOG_OUTPUT_LENGTH": 400}
)
def test_the_whole_log_is_bounded_and_says_how_many_entries_it_dropped():
    """Issue 42, item 9: 300 entries of 100 kB made a 30 MB log, written whole at each
    change. The oldest entries go past MAX_LOG_ENTRIES or MAX_LOG_LENGTH."""
    lane = Lane()
    attempt = Attempt(SimpleNamespace(pk=1, execution_logs=[]), lane)
    first = attempt.log("step-0", "true", out="x" * 100)  # 110 characters each
    for i in range(1, 5):
        attempt.log(f"step-{i}", "true", out="x" * 100)
    marker, *kept = attempt.logs
    assert [e["key"] for e in kept] == ["step-2", "step-3", "step-4"]
    assert (marker["key"], marker["dropped"]) == ("(earlier entries dropped)", 2)
    assert marker["out"].startswith("[… 2 earlier entries dropped")
    first.write("more")  # a dropped entry changes, and stays dropped
    assert [e["key"] for e in attempt.logs[1:]] == ["step-2", "step-3", "step-4"]
    # Characters: output growing in the newest entries pushes out older ones.
    step3, step4 = attempt._log._kept[-2:]
    step4.write("y" * 400)  # 441 characters now (its output cut to 400, and a marker)
    step3.write("y" * 400)
    assert attempt.logs[0]["dropped"] == 3
    assert [e["key"] for e in attempt.logs[1:]] == ["step-3", "step-4"]
    assert sum(len(e["key"]) + 4 + len(e["out"]) for e in attempt.logs[1:]) <= 900
    assert len(lane.changes) == 8  # each change reached the writer's queue


@override_settings(DBWORKER={"MAX_LOG_LENGTH": 100, "MAX_LOG_OUTPUT_LENGTH": 400})
def test_the_newest_entry_stays_whatever_its_size():
    lane = Lane()
    attempt = Attempt(SimpleNamespace(pk=1, execution_logs=[]), lane)
    attempt.log("small", out="x")
    attempt.log("huge", out="z" * 5000)  # its output has a bound of its own
    assert [e["key"] for e in attempt.logs] == ["(earlier entries dropped)", "huge"]
    assert len(attempt.logs[1]["out"]) < 450


def test_an_entrys_key_and_command_are_bounded():
    lane = Lane()
    attempt = Attempt(SimpleNamespace(pk=1, execution_logs=[]), lane)
    entry = attempt.log("k" * 1000, ["a" * 3000, "b" * 3000, "c", "d"])
    assert entry.data["key"] == "k" * 199 + "…"
    assert entry.data["command"] == ["a" * 3000, "b" * 999 + "…", "[… 2 more arguments]"]
    assert sum(map(len, as_command(["x" * 100] * 100))) <= 4000 + 30


def test_named_placeholders_become_numbered_once_each():
    sql = "SELECT %(a)s, %(b)s WHERE x = %(a)s AND y LIKE '5%%'"
    assert numbered(sql) == ("SELECT $1, $2 WHERE x = $1 AND y LIKE '5%'", ("a", "b"))
    with pytest.raises(ValueError, match="positional"):
        numbered("SELECT %(a)s, %s")


@pytest.mark.parametrize(
    "value",
    [
        None,
        0,
        "text",
        [1.5, {"a": None, "b": [True]}],
        {"at": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)},
        [decimal.Decimal("1.50"), uuid.UUID(int=7), datetime.timedelta(seconds=90)],
    ],
)
def test_a_stored_result_is_the_text_djangos_encoder_gives(value):
    execution = SimpleNamespace(handler=SimpleNamespace(get_name=lambda: "h", result_field="r"))
    assert Execution._stored(execution, value) == json.dumps(value, cls=DjangoJSONEncoder)


def test_a_result_json_cannot_hold_fails_the_job_saying_why():
    execution = SimpleNamespace(handler=SimpleNamespace(get_name=lambda: "h", result_field="r"))
    circular: list[object] = []
    circular.append(circular)
    for value in ({1, 2}, circular):
        with pytest.raises(NonRetryableError, match="not JSON-serialisable"):
            Execution._stored(execution, value)
