"""The simulator's :class:`~fedhv.algorithms.base.Federation`: runs stages on an engine
and accounts bytes, stages and client time."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from fedhv.algorithms.base import Replies, Request
from fedhv.sim.engine import Engine


def nbytes(value: Any) -> int:
    """Bytes of a tensor or array as sent on the wire (its own dtype)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return int(np.asarray(value).nbytes)


class SimFederation:
    """One round's sampled clients, served by an engine.

    Attributes
    ----------
    bytes_down, bytes_up : int
        Per participating client, summed over the round's stages.
    stages : int
        Synchronization stages run so far.
    client_seconds : float
        Wall-clock time spent in client computation.
    """

    def __init__(self, engine: Engine, clients: np.ndarray, round_idx: int) -> None:
        self.engine = engine
        self._clients = np.asarray(clients)
        self.round_idx = round_idx
        self.bytes_down = 0
        self.bytes_up = 0
        self.stages = 0
        self.client_seconds = 0.0

    @property
    def clients(self) -> np.ndarray:
        return self._clients

    def count_uplink(self, nbytes_per_client: int) -> None:
        self.bytes_up += int(nbytes_per_client)

    def count_downlink(self, nbytes_per_client: int) -> None:
        self.bytes_down += int(nbytes_per_client)

    def relay(self, down_bytes: int, up_bytes: int) -> None:
        self.stages += 1
        self.bytes_down += int(down_bytes)
        self.bytes_up += int(up_bytes)

    def exchange(self, theta: torch.Tensor, request: Request) -> Replies:
        """Run one stage for all sampled clients and count what crosses the network."""
        start = time.perf_counter()
        e, clients, t = self.engine, self._clients, self.round_idx
        replies = Replies(clients=clients)
        if request.report is not None:
            replies.reports = e.reports(theta, clients, t, request.report)
        if request.gradients is not None:
            replies.gradients = e.gradients(theta, clients, request.gradients, t)
        if request.train is not None:
            replies.deltas = e.train(theta, clients, request.train, t, request.first_step)
        self.client_seconds += time.perf_counter() - start
        self.stages += 1
        self.bytes_down += (nbytes(theta) if request.send_model else 0) + sum(
            nbytes(v) for v in request.payload.values()
        )
        for name in ("reports", "deltas") + (("gradients",) if request.upload_gradients else ()):
            value = getattr(replies, name)
            if value is not None:
                self.bytes_up += nbytes(value[0])
        return replies
