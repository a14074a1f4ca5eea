"""``flower-supernode`` with a shorter message poll (``python -m fedhv.flower.supernode``).

flwr 1.42's SuperNode asks the SuperLink for a new message, and when there is none
sleeps 3 s before asking again (``flwr.supernode.start_client_internal``); it also
checks for the ClientApp's reply every 0.5 s. On a LAN or loopback that idle wait,
not the computation, dominates a round (measured: ~5 s per round for 3 tiny clients).
This launcher runs Flower's own ``flower-supernode`` entry point unchanged except for
those sleeps:

- the idle wait (no message) **backs off**: ``FEDHV_SUPERNODE_POLL_S`` seconds (default
  0.1) after a message, growing 1.5x per empty pull up to ``FEDHV_SUPERNODE_IDLE_POLL_S``
  (default 0.5), back to the short wait as soon as a message arrives. Within a run the
  stages follow each other closely, so the poll stays short; an idle node asks twice a
  second instead of ten times (measured: an idle 3-node deployment on loopback used 0.39
  CPU-seconds per second with a fixed 0.1 s poll);
- the wait for the ClientApp's reply and the retry backoff when it pulls a message's
  objects (the model) that the server has not finished uploading (Flower: 1 s, doubling
  up to 10 s) last at most ``FEDHV_SUPERNODE_POLL_S``.

Every argument is passed to ``flower-supernode``.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import types
from collections.abc import Callable
from typing import Any

#: Flower's idle wait (no message pulled) in ``start_client_internal``; any shorter sleep there
#: waits for a reply or an object, i.e. for activity already under way.
FLOWER_IDLE_SLEEP_S = 3.0


class BackoffTime(types.ModuleType):
    """The ``time`` module with ``sleep`` replaced for Flower's SuperNode loop.

    ``sleep(s)`` for ``s >= FLOWER_IDLE_SLEEP_S`` (the idle wait) sleeps the current idle
    interval ``w``; within ``hot_s`` seconds of the last :meth:`reset` (a message arrived:
    the run's next stage is near) ``w`` stays ``cap``, after that each idle wait sets
    ``w = min(1.5 w, idle_cap)``. Any other ``sleep(s)`` sleeps ``min(s, cap)``.
    """

    def __init__(self, cap: float, idle_cap: float, hot_s: float = 2.0) -> None:
        super().__init__("time")
        self._cap = cap
        self._idle_cap = max(idle_cap, cap)
        self._hot_s = hot_s
        self._last = -float("inf")
        self.idle_wait = cap

    def reset(self) -> None:
        self.idle_wait = self._cap
        self._last = time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds >= FLOWER_IDLE_SLEEP_S:
            time.sleep(self.idle_wait)
            if time.monotonic() - self._last > self._hot_s:
                self.idle_wait = min(self.idle_wait * 1.5, self._idle_cap)
        else:
            time.sleep(min(seconds, self._cap))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _resetting(pull: Callable[..., Any], clock: BackoffTime) -> Callable[..., Any]:
    """``pull`` (Flower's ``_pull_and_store_message``) that resets ``clock``'s backoff when it
    returns a run id (a message was pulled)."""

    @functools.wraps(pull)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            clock.reset()
        return run_id

    return wrapped


def main() -> None:
    from flwr.supernode import start_client_internal
    from flwr.supernode.cli.flower_supernode import flower_supernode

    cap = float(os.environ.get("FEDHV_SUPERNODE_POLL_S", "0.1"))
    clock = BackoffTime(cap, float(os.environ.get("FEDHV_SUPERNODE_IDLE_POLL_S", "0.5")))
    start_client_internal.time = clock  # type: ignore[attr-defined]
    start_client_internal._pull_and_store_message = _resetting(  # type: ignore[attr-defined]
        start_client_internal._pull_and_store_message, clock)
    start_client_internal.pull_objects = functools.partial(  # type: ignore[attr-defined]
        start_client_internal.pull_objects, initial_backoff=min(0.02, cap), backoff_cap=cap)
    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":
    main()
