"""Signal handlers run in a relay thread, so they may take locks the main thread holds."""

import os
import signal
import threading

import pytest

from django_dbworker.runtime.signals import SignalHandlers


@pytest.mark.timeout(20)
def test_a_handler_that_needs_a_lock_the_interrupted_main_thread_holds_does_not_deadlock():
    lock = threading.Lock()  # like the one inside threading.Event, held in Event.wait()
    ran_in = []
    done = threading.Event()

    def handler(signum, frame):
        with lock:
            ran_in.append((signum, threading.current_thread().name))
        done.set()

    handlers = SignalHandlers()
    handlers.install(handler, (signal.SIGUSR1,))
    try:
        with lock:
            os.kill(os.getpid(), signal.SIGUSR1)
            # A handler run here, in the main thread, would wait for ``lock`` forever.
            assert not done.wait(0.3)
        assert done.wait(10)
    finally:
        handlers.restore()
    assert ran_in == [(signal.SIGUSR1, "dbworker-signals")]
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_restore_stops_the_relay_thread():
    handlers = SignalHandlers()
    handlers.install(lambda signum, frame: None, (signal.SIGUSR2,))
    handlers.restore()
    assert not any(t.name == "dbworker-signals" for t in threading.enumerate())
