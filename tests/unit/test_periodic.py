"""``Periodic``: ticks, daylight saving time, missed ticks (pure logic, no database)."""

import datetime

import pytest

from django_dbworker import Periodic

UTC = datetime.UTC


def utc(*args):
    return datetime.datetime(*args, tzinfo=UTC)


def test_a_time_the_clock_skips_runs_once_after_the_gap():
    # Europe/Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
    nightly = Periodic("30 2 * * *", timezone="Europe/Berlin")
    first = nightly.next_after(utc(2026, 3, 28, 12))
    assert first == utc(2026, 3, 29, 1, 0)  # 03:00 CEST, once
    assert nightly.next_after(first) == utc(2026, 3, 30, 0, 30)  # 02:30 CEST


def test_a_time_the_clock_repeats_runs_once_at_its_first_occurrence():
    # Europe/Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
    nightly = Periodic("30 2 * * *", timezone="Europe/Berlin")
    first = nightly.next_after(utc(2026, 10, 24, 12))
    assert first == utc(2026, 10, 25, 0, 30)  # 02:30 CEST
    assert nightly.next_after(first) == utc(2026, 10, 26, 1, 30)  # not 02:30 CET too


def test_six_fields_have_seconds_first():
    every_ten = Periodic("*/10 * * * * *")
    assert every_ten.next_after(utc(2026, 1, 1, 0, 0, 3)) == utc(2026, 1, 1, 0, 0, 10)
    assert every_ten.latest_at_or_before(utc(2026, 1, 1, 0, 0, 20)) == utc(2026, 1, 1, 0, 0, 20)


def test_late_ticks_are_all_due_and_missed_ones_fold_into_one_or_none():
    now = utc(2026, 1, 1, 10, 0, 5, 500000)
    every_second = Periodic("* * * * * *", missed_after=60)
    assert every_second.due(utc(2026, 1, 1, 10, 0, 3), now) == [
        utc(2026, 1, 1, 10, 0, 3),
        utc(2026, 1, 1, 10, 0, 4),
        utc(2026, 1, 1, 10, 0, 5),
    ]
    day_before = utc(2025, 12, 31, 10)
    due = every_second.due(day_before, now)
    assert due[0] == utc(2026, 1, 1, 9, 59, 5)  # the latest missed tick, once
    assert len(due) == 61  # then each of the last minute
    skipping = Periodic("* * * * * *", missed="skip", missed_after=60)
    assert skipping.due(day_before, now)[0] == utc(2026, 1, 1, 9, 59, 6)
    assert every_second.due(utc(2026, 1, 1, 10, 0, 6), now) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "cron expression '61 \\* \\* \\* \\*'"),
        ({"cron": "* * *"}, "cron expression"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"cron": "* * * * *", "missed": "sometimes"}, "missed='sometimes'"),
    ],
)
def test_bad_declarations_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Periodic(**kwargs)
