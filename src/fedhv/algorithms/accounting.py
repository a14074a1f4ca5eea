"""Per-round accounting shared by the :class:`~fedhv.algorithms.base.Federation` back-ends.

The simulator's :class:`~fedhv.sim.federation.SimFederation` and Flower's
:class:`~fedhv.flower.federation.FlowerFederation` keep the same books, so that
:func:`~fedhv.experiment.loop.run_rounds` records a round identically whichever back-end
ran it. In a round, a stage ``s`` that sends ``D_s`` bytes to and receives ``U_s`` bytes
from each client still taking part adds ``bytes_down += D_s``, ``bytes_up += U_s`` and
``stages += 1``, so that ``bytes_down = sum_s D_s`` and ``bytes_up = sum_s U_s``: the
totals are per participating client, summed over the round's stages.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

log = logging.getLogger("fedhv")


class FederationAccounting:
    """Bytes, stages, client time and the clients left out of one round.

    A back-end calls ``super().__init__`` with the round's answering clients, counts what
    its stages send and receive, and records dropped and rejected clients; the
    algorithm-facing part of the :class:`~fedhv.algorithms.base.Federation` protocol
    (``clients``, :meth:`count_uplink`, :meth:`count_downlink`, :meth:`relay`) is here.

    Parameters
    ----------
    clients : ndarray
        The sampled clients that take part from the round's first stage on.
    round_idx : int
        0-based round index (log lines show ``round_idx + 1``).
    dropped : sequence of int, optional
        Sampled clients that do not answer from the first stage on.

    Attributes
    ----------
    bytes_down, bytes_up : int
        Per participating client, summed over the round's stages.
    stages : int
        Synchronization stages run so far.
    client_seconds : float
        Wall-clock time spent in client computation (or, over a network, the stages'
        round trips).
    dropped : list of int
        Clients that did not answer.
    rejected : list of (int, str)
        Clients whose reply was rejected, with the reason.
    diverged : list of (int, str)
        The rejections whose reply had non-finite values that fault injection did not
        put there: the client's own training overflowed (a sign of divergence).
    extras : dict
        Back-end facts merged into the round's record (empty unless the back-end adds some).
    global_buffers : Any
        The engine holding the global model's buffers, when the round loop gives one.
    """

    def __init__(self, clients: np.ndarray, round_idx: int, dropped: Sequence[int] = ()) -> None:
        self.round_idx = round_idx
        self.dropped: list[int] = list(dropped)
        self.rejected: list[tuple[int, str]] = []
        self.diverged: list[tuple[int, str]] = []
        self._clients = np.asarray(clients)
        self.bytes_down = 0
        self.bytes_up = 0
        self.stages = 0
        self.client_seconds = 0.0
        self.extras: dict[str, Any] = {}  # back-end facts for the round's record (none in the simulator)
        self.global_buffers: Any = None  # set by run_rounds when a networked back-end federates buffers

    @property
    def clients(self) -> np.ndarray:
        """The clients still taking part, in the order of the last replies."""
        return self._clients

    def count_uplink(self, nbytes_per_client: int) -> None:
        """Add bytes each client uploads in an algorithm-specific encoding."""
        self.bytes_up += int(nbytes_per_client)

    def count_downlink(self, nbytes_per_client: int) -> None:
        """Add bytes each client downloads in an algorithm-specific encoding."""
        self.bytes_down += int(nbytes_per_client)

    def relay(self, down_bytes: int, up_bytes: int) -> None:
        """Count a synchronization stage whose client computation the algorithm simulates."""
        self.stages += 1
        self.bytes_down += int(down_bytes)
        self.bytes_up += int(up_bytes)

    def _reject(self, client: int, problem: str, own: bool = False) -> None:
        """Record and log a rejected reply (``own``: non-finite values from the client's own training)."""
        self.rejected.append((client, problem))
        if own:
            self.diverged.append((client, problem))
        log.warning("round %d: client %d rejected: %s", self.round_idx + 1, client, problem)
