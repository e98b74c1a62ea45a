"""The safe frontier and the assignment, without a database."""

from django_dbworker.consumers.assignment import assign
from django_dbworker.consumers.frontier import GapWatch


def test_contiguous_prefix_only():
    step = GapWatch(30).step(10, [11, 12, 14, 15], now=0.0)
    assert step.frontier == 12
    assert step.waiting_for == 13
    assert step.skipped == ()


def test_gap_waited_then_passed_without_passing_visible_rows():
    watch = GapWatch(5)
    assert watch.step(0, [1, 4, 5], now=0.0).frontier == 1
    assert watch.step(1, [4, 5], now=4.9).frontier == 1
    step = watch.step(1, [4, 5], now=5.0)
    assert step.frontier == 5
    assert step.skipped == ((2, 3, 5.0),)


def test_late_commit_fills_the_gap():
    watch = GapWatch(5)
    watch.step(0, [2], now=0.0)
    step = watch.step(0, [1, 2], now=1.0)
    assert step.frontier == 2
    assert step.skipped == ()


def test_a_run_is_as_old_as_its_youngest_position():
    watch = GapWatch(5)
    watch.step(0, [2], now=0.0)  # 1 missing since 0
    step = watch.step(0, [4], now=3.0)  # 2 and 3 missing since 3 (2 became invisible? no: new)
    assert step.frontier == 0
    assert watch.step(0, [4], now=6.0).frontier == 0
    assert watch.step(0, [4], now=8.0).frontier == 4


def test_nothing_visible():
    assert GapWatch(1).step(7, [], now=100.0).frontier == 7


def test_assignment_spreads_consumers_evenly():
    capable = {n: ["w2", "w1"] for n in "abc"}
    assert assign("cab", capable) == {"a": "w1", "b": "w2", "c": "w1"}
    assert assign(["a", "z"], {"a": ["w1"]}) == {"a": "w1"}


def test_assignment_balances_workers_that_declare_different_consumers():
    """Issue 29, finding 4: a worker declaring a subset gets its share, whatever the
    order of the worker ids (round-robin gave 3 and 1, or 4 and 0)."""
    for small, big in (("w1", "w2"), ("w2", "w1")):
        capable = {"a": [big], "b": [big, small], "c": [big, small], "d": [big]}
        got = assign("abcd", capable)
        assert sorted(got.values()).count(small) == 2, got
        capable = {"a": [big], "b": [big, small], "c": [big], "d": [big, small]}
        got = assign("abcd", capable)
        assert {got["b"], got["d"]} == {small}, got


def test_assignment_keeps_owners_that_are_balanced():
    capable = {n: ["w1", "w2"] for n in "abcd"}
    current = {"a": "w2", "b": "w2", "c": "w1", "d": "w1"}
    assert assign("abcd", capable, current) == current  # no move, no new generation
    three = {n: ["w1", "w2", "w3"] for n in "abcd"}
    moved = assign("abcd", three, current)
    assert sorted(moved.values()).count("w3") == 1  # a joiner takes one
    assert sum(moved[n] != current[n] for n in "abcd") == 1  # and only one moves


def test_a_gap_deep_in_a_backlog_ages_from_when_the_head_passed_it():
    watch = GapWatch(5)
    watch.step(0, [1, 2], now=0.0, head=1000)  # 500 missing since at least now
    step = watch.step(499, [501], now=6.0)
    assert step.frontier == 501
    assert step.skipped == ((500, 500, 6.0),)
