"""The SuperNode's and ClientApp process's polls back off while idle and return to the short
poll when work arrives (``fedhv.flower.supernode``, ``fedhv.flower.executor``). Oracle: the
geometric sequence ``min(cap * 1.5**k, idle_cap)`` written out by hand."""

from __future__ import annotations

import pytest

from fedhv.flower import supernode
from flower_support import needs_flwr


def _recorded(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(supernode.time, "sleep", slept.append)
    return slept


def test_supernode_idle_wait_backs_off_and_resets_on_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    slept = _recorded(monkeypatch)
    clock = supernode.BackoffTime(0.1, 0.5)
    for _ in range(6):
        clock.sleep(3)  # Flower's idle wait
    assert slept == pytest.approx([0.1, 0.15, 0.225, 0.3375, 0.5, 0.5])
    slept.clear()
    clock.sleep(0.5)  # waiting for the ClientApp's reply: capped, no backoff
    clock.sleep(0.05)
    assert slept == [0.1, 0.05]
    pulls = iter([None, None, 7, None])
    pull = supernode._resetting(lambda: next(pulls), clock)
    slept.clear()
    for _ in range(4):
        if pull() is None:
            clock.sleep(3)
    # still backed off after two empty pulls; the message (run id 7) resets to the short wait
    assert slept == pytest.approx([0.5, 0.5, 0.1])
    slept.clear()
    for _ in range(3):
        clock.sleep(3)  # within hot_s (2 s) of the message: the next stage is near, no backoff
    clock._last -= 10  # the message was 10 s ago: back off again
    for _ in range(3):
        clock.sleep(3)
    assert slept == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.15, 0.225])
    supernode.BackoffTime(0.2, 0.1).sleep(3)
    assert slept[-1] == 0.2  # an idle cap below the short poll: the short poll


@needs_flwr
def test_clientapp_process_poll_backs_off_and_resets_after_a_task(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedhv.flower import executor

    replies = iter([False, False, False, True, False, False, "stop"])
    ran: list[str] = []

    class Reply:
        def __init__(self, task: bool) -> None:
            self.token = "t" if task else ""
            self._task = task

        def HasField(self, name: str) -> bool:
            return self._task

    class Client:
        def AcquireTask(self, request: object) -> Reply:
            nxt = next(replies)
            if nxt == "stop":
                raise SystemExit
            return Reply(bool(nxt))

    slept: list[float] = []
    monkeypatch.setattr(executor, "_client", lambda address: Client())
    monkeypatch.setattr(executor, "run_task", lambda address, token: ran.append(token))
    monkeypatch.setattr(executor.time, "sleep", slept.append)
    with pytest.raises(SystemExit):
        executor.serve_forever("127.0.0.1:1", None, poll_s=0.02, idle_poll_s=0.05, hot_s=0.0)
    assert ran == ["t"]
    assert slept == pytest.approx([0.02, 0.03, 0.045, 0.02, 0.03])
    replies = iter([False, False, True, False, False, "stop"])
    slept.clear()
    with pytest.raises(SystemExit):  # a long hot window: no backoff after the task
        executor.serve_forever("127.0.0.1:1", None, poll_s=0.02, idle_poll_s=0.05, hot_s=100.0)
    assert slept == pytest.approx([0.02, 0.03, 0.02, 0.02])
