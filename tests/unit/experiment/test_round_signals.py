"""Follow-ups found while removing duplicated code (signal deferral in the round bookkeeping)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from fedhv.experiment.runner import signals_deferred


@pytest.fixture
def other_thread() -> Iterator[threading.Thread]:
    """A thread that does not block any signal, like torch's or the grid worker's watch thread."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="unblocked-helper", daemon=True)
    thread.start()
    yield thread
    stop.set()
    thread.join(5)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_taken_by_another_thread_still_waits_for_the_block_end(
        other_thread: threading.Thread, signum: int) -> None:
    """A stop signal sent to the process while a round's bookkeeping runs is handled only after it.

    The kernel delivers a process-directed signal to any thread that does not block it; a
    signal mask set in the main thread alone lets another thread take it, and Python then
    runs the handler in the main thread in the middle of the block (a written line that no
    checkpoint covers, about one ``SIGTERM`` in ten with a real ``fedhv run``).
    """
    got: list[int] = []

    def handler(s: int, frame: object) -> None:
        got.append(s)

    previous = signal.signal(signum, handler)
    try:
        with signals_deferred():
            os.kill(os.getpid(), signum)
            os.kill(os.getpid(), signum)  # a second one is coalesced, as a pending signal is
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline:  # bytecodes run: a handler would run here
                pass
            inside = list(got)
        after = list(got)
        restored = signal.getsignal(signum)
    finally:
        signal.signal(signum, previous)
    assert inside == [], "the handler ran inside the deferred block"
    assert after == [signum], "the deferred signal was lost or delivered twice"
    assert restored is handler

