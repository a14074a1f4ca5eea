"""The server-client protocol shared by algorithms and execution back-ends.

An algorithm is pure round logic with explicit state. Each round it drives one or
more *synchronization stages* through a :class:`Federation`: every stage broadcasts
the model (and an optional payload) to the sampled clients, which compute what the
:class:`Request` asks for with three primitives:

- ``report``: the ``m`` task losses at the received model (eval mode);
- ``gradients``: for each row ``W_t`` of a ``[T, m]`` weight matrix, the gradient of
  ``sum_i W_ti l_i`` at the received model on a fresh minibatch (train mode);
- ``train``: for each row ``W_t``, ``K`` local SGD steps on ``sum_i W_ti l_i`` from
  the received model, returning ``Delta theta = theta^K - theta``; optionally the first
  step uses a gradient the client already holds (``first_step``), or the client draws the
  weights of every step itself from a named law (``train_draw``, :class:`StepDraw`).

Back-ends (the batched or sequential simulator, Flower) execute requests without
knowing which algorithm sent them, and count bytes and stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from fedhv.rng import numpy_rng


def softmax_normal(rng: np.random.Generator, num_tasks: int, scale: float) -> np.ndarray:
    """``softmax(eps)``, ``eps ~ N(0, scale^2 I_m)`` drawn from ``rng`` (float64 ``[m]``, on the simplex)."""
    eps = scale * rng.standard_normal(num_tasks)
    e = np.exp(eps - eps.max())
    return e / e.sum()


#: The laws a :class:`StepDraw` may name: ``law(generator, m, scale) -> float64 [m]``.
STEP_LAWS = {"softmax-normal": softmax_normal}


@dataclass(frozen=True)
class StepDraw:
    """Task weights a client draws itself at every local step, from the run's keyed streams.

    Local step ``s`` (0-based) of client ``k``'s trajectory in round ``t`` trains on
    ``sum_i w_i l_i`` with ``w = law(g, m, scale)``, ``g`` the generator of the stream
    ``(seed, stream, key, t, k, s)`` (:func:`fedhv.rng.numpy_rng`; ``seed`` and ``stream`` are the
    engine's). The draw depends on nothing but these keys, so the batched and the sequential engine,
    a resumed run and a Flower node draw the same weights.

    Attributes
    ----------
    law : str
        A name in :data:`STEP_LAWS` (``"softmax-normal"``: ``softmax(eps)``, ``eps ~ N(0, scale^2 I)``).
    key : str
        The stream's name (e.g. the method's).
    scale : float
        The law's scale (the logits' standard deviation).
    """

    law: str = "softmax-normal"
    key: str = "step-weights"
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.law not in STEP_LAWS:
            raise ValueError(f"StepDraw.law = {self.law!r}: use one of {sorted(STEP_LAWS)}")

    def rows(self, seed: int, stream: str, round_idx: int, client: int, steps: int,
             num_tasks: int) -> np.ndarray:
        """The weights ``[steps, m]`` (float64) of client ``client``'s local steps in round ``round_idx``."""
        law = STEP_LAWS[self.law]
        out = np.empty((steps, num_tasks))
        for s in range(steps):
            out[s] = law(numpy_rng(seed, stream, self.key, round_idx, client, s), num_tasks, self.scale)
        return out


@dataclass(frozen=True)
class Request:
    """What the sampled clients compute in one synchronization stage.

    Attributes
    ----------
    payload : dict
        Tensors broadcast besides the model (e.g. FedHV's task weights); counted in
        the downlink bytes.
    send_model : bool
        Whether the global model is broadcast in this stage.
    report : int, "all" or None
        Report budget ``B_rep`` (minibatches or the whole local dataset); ``None`` =
        no report.
    gradients : ndarray ``[T, m]`` or None
        Task-weight rows of the gradients to compute at the received model.
    upload_gradients : bool
        Whether the raw gradients are uploaded (counted); ``False`` when the algorithm
        uploads a compressed form and counts it itself.
    train : ndarray ``[T, m]`` or None
        Task-weight rows of the local trajectories.
    first_step : Tensor ``[k, T, d]`` or None
        Client-held gradients used as the first local step (not transmitted).
    train_draw : StepDraw or None
        When set, every client draws the weights of each local step itself (:class:`StepDraw`)
        instead of taking ``train``'s row; ``train`` then has one row (what the server logs, e.g.
        the law's mean) and there is no ``first_step``.
    """

    payload: dict[str, Any] = field(default_factory=dict)
    send_model: bool = True
    report: int | str | None = None
    gradients: np.ndarray | None = None
    upload_gradients: bool = True
    train: np.ndarray | None = None
    first_step: torch.Tensor | None = None
    train_draw: StepDraw | None = None


@dataclass
class Replies:
    """Stacked replies of the ``k`` sampled clients (in ``clients`` order).

    Attributes
    ----------
    reports : Tensor ``[k, m]`` or None
    gradients : Tensor ``[k, T, d]`` or None
    deltas : Tensor ``[k, T, d]`` or None
    """

    clients: np.ndarray
    reports: torch.Tensor | None = None
    gradients: torch.Tensor | None = None
    deltas: torch.Tensor | None = None
    #: Aggregation weights ``[k]`` of the updates (sum 1), set by the federation when updates
    #: are weighted by the clients' sample counts (``train.aggregation = "samples"``); ``None``
    #: is the paper's unweighted mean.
    weights: torch.Tensor | None = None


@runtime_checkable
class Federation(Protocol):
    """One round's connection to the sampled clients.

    An algorithm calls :attr:`clients`, :meth:`exchange`, :meth:`count_uplink`,
    :meth:`count_downlink` and :meth:`relay`. The round loop
    (:func:`fedhv.experiment.loop.run_rounds`) then reads the round's books from the same
    object: the attributes below, kept by
    :class:`~fedhv.algorithms.accounting.FederationAccounting`, which every back-end
    (:class:`~fedhv.sim.federation.SimFederation`,
    :class:`~fedhv.flower.federation.FlowerFederation`) extends.

    Attributes
    ----------
    bytes_down, bytes_up : int
        Bytes per participating client, summed over the round's stages.
    stages : int
        Synchronization stages run so far.
    client_seconds : float
        Wall-clock time spent in client computation (over a network: the stages' round
        trips); the rest of the round is the server's.
    dropped : list of int
        Sampled clients that did not answer.
    rejected : list of (int, str)
        Clients whose reply was rejected, with the reason.
    diverged : list of (int, str)
        The rejections whose non-finite values the client's own training produced.
    extras : dict
        Back-end facts merged into the round's record (e.g. secure aggregation's
        ``secure_clients``, Flower's ``node_seconds``); empty for the simulator.
    global_buffers : Any
        The engine holding the global model's buffers (BatchNorm statistics), which the
        round loop sets when a networked back-end must federate them; ``None`` otherwise.
    """

    bytes_down: int
    bytes_up: int
    stages: int
    client_seconds: float
    dropped: list[int]
    rejected: list[tuple[int, str]]
    diverged: list[tuple[int, str]]
    extras: dict[str, Any]
    global_buffers: Any

    @property
    def clients(self) -> np.ndarray:
        """The sampled client ids."""

    def exchange(self, theta: torch.Tensor, request: Request) -> Replies:
        """Run one synchronization stage."""

    def count_uplink(self, nbytes_per_client: int) -> None:
        """Add bytes each client uploads in an algorithm-specific encoding."""

    def count_downlink(self, nbytes_per_client: int) -> None:
        """Add bytes each client downloads in an algorithm-specific encoding."""

    def relay(self, down_bytes: int, up_bytes: int) -> None:
        """Count a synchronization stage whose client computation the algorithm simulates."""


@dataclass(frozen=True)
class StepResult:
    """Outcome of a round: new model, new state, and per-round log values."""

    theta: torch.Tensor
    state: Any
    log: dict[str, Any]


class Algorithm(Protocol):
    """Round logic of one federated method."""

    @property
    def name(self) -> str:
        """Method name (as in ``method = ...``)."""

    def init_state(self, num_tasks: int) -> Any:
        """State before round 0."""

    def round(self, state: Any, theta: torch.Tensor, federation: Federation) -> StepResult:
        """Run one round: drive the stages, aggregate, return the next model and state."""


def mean_update(deltas: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``(1/|S|) sum_k Delta_k`` over the first dimension, or ``sum_k p_k Delta_k`` with weights ``p``."""
    if weights is None:
        return deltas.mean(0)
    p = weights.to(device=deltas.device, dtype=deltas.dtype)
    return torch.tensordot(p, deltas, dims=1)


def fedavg_step(theta: torch.Tensor, deltas: torch.Tensor, lr_global: float,
                weights: torch.Tensor | None = None) -> torch.Tensor:
    """``theta + eta_g * (1/|S|) sum_k Delta theta_k`` for ``deltas [k, d]`` (or ``sum_k p_k Delta_k``,
    FedAvg's sample-weighted mean ``p_k = n_k / sum_j n_j``, when ``weights`` are given)."""
    return theta + lr_global * mean_update(deltas, weights)


def sample_weights(sizes: list[int] | np.ndarray) -> torch.Tensor:
    """``p_k = n_k / sum_j n_j`` (float64) of the answering clients' sample counts."""
    n = torch.as_tensor(np.asarray(sizes, dtype=np.float64))
    return n / n.sum()


def one_hot_rows(m: int) -> np.ndarray:
    """``[m, m]`` identity: one single-task objective per row."""
    return np.eye(m)
