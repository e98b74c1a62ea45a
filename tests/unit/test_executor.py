"""ThreadExecutor: the calls handed to ``call_soon`` (a deferred ``post_handle`` each)
run once each, in handler threads, and slow ones in parallel."""

import threading
from collections import Counter

import pytest

from django_dbworker.runtime.executor import ThreadExecutor
from tests.conftest import wait_until

TIMEOUT = 10.0


class Item:
    label = "item"


def executor(size: int) -> ThreadExecutor:
    started = ThreadExecutor("test", size, lambda attempt: None)
    started.start()
    return started


@pytest.mark.timeout(30)
def test_calls_that_take_long_run_in_as_many_threads_as_are_free():
    """A call that takes long (a webhook in post_handle) does not hold up the calls
    handed over after it while threads are free: four calls that each wait for the
    other three finish only if four threads run them at once."""
    pool = executor(4)
    barrier = threading.Barrier(4, timeout=TIMEOUT)
    ran: list[int] = []
    try:
        for _ in range(4):
            pool.call_soon(lambda: ran.append(barrier.wait()))
        wait_until(lambda: len(ran) == 4, timeout=TIMEOUT, message="four calls at once")
    finally:
        barrier.abort()
        pool.stop()
        pool.join(TIMEOUT)
    assert sorted(ran) == [0, 1, 2, 3]


@pytest.mark.timeout(30)
def test_every_call_runs_once_in_order_after_one_raised_system_exit():
    pool = executor(1)
    ran: list[int] = []

    def exits() -> None:
        raise SystemExit(3)

    pool.call_soon(exits)
    for i in range(100):
        pool.call_soon(lambda i=i: ran.append(i))
    pool.stop()  # what was handed over before runs first
    pool.join(TIMEOUT)
    assert ran == list(range(100))


@pytest.mark.timeout(60)
def test_calls_handed_over_from_many_threads_among_attempts_each_run_once():
    """Calls are run by threads woken for them and by threads that finish an attempt:
    none is lost or run twice, whoever takes it."""
    pool = executor(8)
    seen: Counter[tuple[int, int]] = Counter()
    lock = threading.Lock()

    def record(key: tuple[int, int]) -> None:
        with lock:
            seen[key] += 1

    def hand_over(k: int) -> None:
        for i in range(2000):
            pool.call_soon(lambda key=(k, i): record(key))
            if i % 3 == 0:
                pool.submit(Item())  # type: ignore[arg-type]

    producers = [threading.Thread(target=hand_over, args=(k,)) for k in range(4)]
    try:
        for producer in producers:
            producer.start()
        for producer in producers:
            producer.join(TIMEOUT)
        wait_until(lambda: sum(seen.values()) >= 8000, timeout=TIMEOUT, message="every call")
    finally:
        pool.stop()
        pool.join(TIMEOUT)
    assert len(seen) == 8000
    assert set(seen.values()) == {1}


@pytest.mark.parametrize("error", [RuntimeError("can't start new thread"), MemoryError()])
def test_a_machine_that_cannot_start_every_thread_is_a_clear_error(monkeypatch, error):
    """The threads that did start stop again, and the error says how many started and
    what to lower (``runworker`` prints it in one line: tests/test_commands.py)."""
    from django_dbworker.exceptions import WorkerStartError

    start = threading.Thread.start
    started: list[threading.Thread] = []

    def start_three(thread: threading.Thread) -> None:
        if len(started) == 3:
            raise error
        started.append(thread)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_three)
    pool = ThreadExecutor("test", 5, lambda attempt: None)
    with pytest.raises(WorkerStartError) as raised:
        pool.start()
    monkeypatch.undo()
    assert str(raised.value) == (
        f"test: could only start 3 of 5 handler threads ({error or 'MemoryError'}); "
        "lower num_handlers (--num-handlers)"
    )
    for thread in started:
        thread.join(TIMEOUT)
        assert not thread.is_alive()
