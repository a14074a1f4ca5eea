"""``flower-supernode`` with a shorter message poll (``python -m fedhv.flower.supernode``).

flwr 1.42's SuperNode asks the SuperLink for a new message, and when there is none
sleeps 3 s before asking again (``flwr.supernode.start_client_internal``); it also
checks for the ClientApp's reply every 0.5 s. On a LAN or loopback that idle wait,
not the computation, dominates a round (measured: ~5 s per round for 3 tiny clients).
This launcher runs Flower's own ``flower-supernode`` entry point unchanged except that
those two sleeps last at most ``FEDHV_SUPERNODE_POLL_S`` seconds (default 0.1), and
so does the retry backoff when it pulls a message's objects (the model) that the
server has not finished uploading (Flower: 1 s, doubling up to 10 s). The SuperNode
then polls the SuperLink 10 times a second while idle, a few hundred bytes per
request. Every argument is passed to ``flower-supernode``.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import types
from typing import Any


class _CappedTime(types.ModuleType):
    """The ``time`` module with ``sleep(s)`` shortened to ``min(s, cap)``."""

    def __init__(self, cap: float) -> None:
        super().__init__("time")
        self._cap = cap

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self._cap))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def main() -> None:
    from flwr.supernode import start_client_internal
    from flwr.supernode.cli.flower_supernode import flower_supernode

    cap = float(os.environ.get("FEDHV_SUPERNODE_POLL_S", "0.1"))
    start_client_internal.time = _CappedTime(cap)  # type: ignore[attr-defined]
    start_client_internal.pull_objects = functools.partial(  # type: ignore[attr-defined]
        start_client_internal.pull_objects, initial_backoff=min(0.02, cap), backoff_cap=cap)
    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":
    main()
