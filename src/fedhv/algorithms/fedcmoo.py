"""FedCMOO: communication-efficient federated multi-objective optimization.

Askin et al., AISTATS 2025, as implemented in the reference code (reference notes §4.2).

Round ``t``, with one sampled set ``S`` for all stages:

1. *Gradient stage.* Each client computes one gradient per task at ``theta^t``, each on
   its own fresh minibatch (train mode: dropout and augmentation on), keeps them, and
   uploads a rank-``r`` randomized-SVD compression ``C_k`` of its encoder gradient
   matrix ``G_k [d_enc, m]`` (:mod:`fedhv.weighting.randsvd`) and its exact local Gram
   ``G_k^T G_k``.
2. *Correction stage* (two-way estimator ``"randsvd"`` only). The server broadcasts a
   compression ``sumC`` of ``sum_k C_k``; clients return ``D_k^T (sumC - C_k)``,
   ``D_k^T D_k`` (``D_k = G_k - C_k``) and ``||C_k||^2, ||D_k||^2``. The server forms

       GG = (T1 + T2 + T3 + T4) / |S|,  T1 = sum G_k^T G_k,  T2 = sum C_k^T (sumC - C_k),
       T3 = 2 sum D_k^T (sumC - C_k),   T4 = (|S| - 1) sum D_k^T D_k  unless
       sqrt(sum ||C_k||^2 / sum ||D_k||^2) > 1.5 (then T4 = 0),

   symmetrised (the reference uses the possibly asymmetric matrix). The one-way
   ``"randsvd-direct"`` estimator uses ``GG = (sum C_k)^T (sum C_k) / |S|`` and skips
   this stage.
3. *FindWeights.* ``GG <- GG / n^2`` with ``n = mean_j sqrt(GG_jj + 1e-4)``; from the
   previous round's weights (warm start; ``1/m`` initially), ``steps`` projected
   steps ``w <- Proj_simplex(w - beta GG w)`` (``beta = 1e-3``, 1000 steps, momentum 0).
4. *Training stage.* The server sends ``w`` (clients still hold ``theta^t``); each
   client takes ``K`` SGD steps on ``sum_i w_i l_i``, the first one with the stored
   stage-1 gradients ``sum_i w_i g_{k,i}``, and uploads ``Delta_k``;
   ``theta^{t+1} = theta^t + eta_g mean_k Delta_k``.

In the simulator the clients' side of stages 1-2 (compression, correction terms) is
computed by the server from the gradients, which gives the same numbers; the bytes
and stages are counted as the protocol would send them. Heads are scaled by their
weights in the first step (``scale_decoders``); the reference's hidden loss rollback
is not implemented.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import torch
from typing_extensions import Self

from fedhv.algorithms.base import Federation, Replies, Request, StepResult, fedavg_step, one_hot_rows
from fedhv.algorithms.method import BuildContext, Built, Method, choice, positive, register
from fedhv.algorithms.plain import StateError, array_from_plain, array_to_plain, fields, int_from_plain
from fedhv.algorithms.tuning import Dimension, Range
from fedhv.algorithms.weight_check import check_weights, source_text
from fedhv.config.validation import at_most
from fedhv.errors import ConfigError
from fedhv.models.params import TaskSlices
from fedhv.rng import torch_generator
from fedhv.weighting.randsvd import compress, compression_rank
from fedhv.weighting.simplex import project_simplex, project_simplex_floats

#: Bounds on the sketch and FindWeights settings (issue 52), each far above the paper's (B.6) and every preset's:
#: ``extra_upload`` (1) and ``oversample`` (0.1) scale the sketch, which is never larger than the gradient matrix
#: itself (and 1e308 overflowed its rank); ``power_iterations`` (2; Halko et al.: 1 or 2 suffice) costs two QR
#: factorisations per client sketch each (``10**19`` ran no round in 150 s); FindWeights' ``weight_lr`` (1e-3)
#: acts on the normalised Gramian, where 100 already jumps between vertices, and ``weight_steps`` (1000) cost
#: about 2 ms a thousand at m = 2 (a million took over 10 s a round on a loaded 2-core machine).
MAX_SKETCH_FACTOR = 100.0
MAX_POWER_ITERATIONS = 100
MAX_WEIGHT_LR = 100.0
MAX_WEIGHT_STEPS = 100_000


@dataclass(frozen=True)
class FedCMOOSketch:
    """FedCMOO's Gram estimate (paper B.6, reference notes §4.2), shared by every method on its exchange.

    Attributes
    ----------
    estimator : {"randsvd", "randsvd-direct"}
        Two-way (four-term) or one-way Gram estimate.
    extra_upload : float
        ``e`` in the rank formula (paper B.6: 1).
    oversample, power_iterations : float, int
        Randomized-SVD oversampling (``floor(0.1 r)`` extra columns) and power iterations.
    symmetrize : bool
        Use ``(GG + GG^T) / 2``.
    """

    estimator: str = "randsvd"
    extra_upload: float = 1.0
    oversample: float = 0.1
    power_iterations: int = 2
    symmetrize: bool = True
    #: The section's name in messages (``[fedcmoo]``; a method on FedCMOO's exchange sets its own).
    key: ClassVar[str] = "fedcmoo"

    def check(self) -> None:
        """Refuse values the estimator cannot use (one line naming the keys)."""
        k = self.key
        choice(f"{k}.estimator", self.estimator, ("randsvd", "randsvd-direct"))
        positive(f"{k}.extra_upload", self.extra_upload)
        if self.oversample < 0 or self.power_iterations < 0:
            raise ConfigError(f"{k}.oversample = {self.oversample} and {k}.power_iterations = "
                              f"{self.power_iterations} must be >= 0")
        at_most(f"{k}.extra_upload", self.extra_upload, MAX_SKETCH_FACTOR,
                "the upload is about extra_upload x d values, 100 already beyond every m <= 100 tasks' uncompressed "
                "m x d; e.g. 1 (the paper's)")
        at_most(f"{k}.oversample", self.oversample, MAX_SKETCH_FACTOR,
                "the sketch is at most the matrix's size anyway; e.g. 0.1 (the paper's)")
        at_most(f"{k}.power_iterations", self.power_iterations, MAX_POWER_ITERATIONS,
                "each costs two QR factorisations of every client's sketch per round; e.g. 2 (the paper's)")


@dataclass(frozen=True)
class FedCMOOConfig(FedCMOOSketch):
    """FedCMOO's hyper-parameters, the ``[fedcmoo]`` section (paper B.6, reference notes §4.2).

    Attributes
    ----------
    estimator, extra_upload, oversample, power_iterations, symmetrize
        The Gram estimate (:class:`FedCMOOSketch`).
    weight_lr, weight_steps, weight_momentum : float, int, float
        FindWeights (paper B.6: 1e-3, 1000, 0).
    """

    weight_lr: float = 1e-3
    weight_steps: int = 1000
    weight_momentum: float = 0.0

    def check(self) -> None:
        """Refuse values the estimator or FindWeights cannot use (one line naming the keys)."""
        super().check()
        positive("fedcmoo.weight_lr", self.weight_lr)
        at_most("fedcmoo.weight_lr", self.weight_lr, MAX_WEIGHT_LR,
                "on the normalised Gramian a step of 100 already jumps between the simplex's vertices; e.g. 1e-3 "
                "(the paper's)")
        if self.weight_steps < 1 or not 0 <= self.weight_momentum < 1:
            raise ConfigError(f"fedcmoo.weight_steps = {self.weight_steps} must be >= 1 and fedcmoo.weight_momentum "
                              f"= {self.weight_momentum} in [0, 1)")
        at_most("fedcmoo.weight_steps", self.weight_steps, MAX_WEIGHT_STEPS,
                "100 times the paper's, about 0.2 s of server time a round at m = 2; e.g. 1000 (the paper's)")


@dataclass(frozen=True)
class FedCMOOState:
    """Warm-started task weights and the round counter (it keys the sketches)."""

    weights: np.ndarray
    round: int = 0
    kind: ClassVar[str] = "fedcmoo"
    #: Whether a checkpointed state's weights must lie on the simplex (FindWeights' do).
    on_simplex: ClassVar[bool] = True

    @property
    def num_tasks(self) -> int:
        """``m``, the number of tasks."""
        return len(self.weights)

    def to_plain(self) -> dict[str, Any]:
        """``{"weights": Tensor [m], "round": int}``."""
        return {"weights": array_to_plain(self.weights), "round": int(self.round)}

    @classmethod
    def from_plain(cls, data: Any) -> Self:
        """Inverse of :meth:`to_plain`; finite weights (on the simplex when ``on_simplex``), a counter >= 0."""
        d = fields(data, cls.kind, ("weights", "round"))
        weights = array_from_plain(d["weights"], f"{cls.kind} weights")
        assert weights is not None
        if cls.on_simplex and ((weights < 0).any() or abs(float(weights.sum()) - 1.0) > 1e-6):
            raise StateError(f"{cls.kind} weights {weights.tolist()} are not on the simplex (>= 0, sum 1)")
        return cls(weights, int_from_plain(d["round"], f"{cls.kind} round"))


def find_weights(gram: np.ndarray, start: np.ndarray, lr: float = 1e-3, steps: int = 1000,
                 momentum: float = 0.0) -> np.ndarray:
    """FedCMOO's FindWeights: projected (heavy-ball) steps on ``w^T GG w / 2`` from ``start``.

    ``GG`` is first divided by ``n^2``, ``n = mean_j sqrt(GG_jj + 1e-4)``.
    """
    g = np.asarray(gram, dtype=np.float64)
    n = float(np.mean(np.sqrt(np.clip(np.diag(g), 0.0, None) + 1e-4)))
    g = g / (n * n)
    w = np.asarray(start, dtype=np.float64).copy()
    project_simplex(w)  # validates the start (finite, a vector) once
    if len(w) <= SMALL_M:
        return np.array(_find_weights_small(g.tolist(), w.tolist(), lr, steps, momentum))
    buf = np.zeros_like(w)
    for _ in range(steps):
        grad = g @ w
        buf = momentum * buf + grad if momentum else grad
        w = project_simplex(w - lr * buf)
    return w


#: Up to this many tasks :func:`find_weights` iterates on Python floats: NumPy's per-call
#: overhead dominates vectors this short (m = 2, 1000 steps: 2.2 ms against 14 ms).
SMALL_M = 8


def _find_weights_small(g: list[list[float]], w: list[float], lr: float, steps: int,
                        momentum: float) -> list[float]:
    """:func:`find_weights`' loop on Python floats.

    The same operations in the same order (``g @ w`` row by row, then
    :func:`~fedhv.weighting.simplex.project_simplex_floats`).
    """
    m = len(w)
    buf = [0.0] * m
    for _ in range(steps):
        grad = [sum(row[j] * w[j] for j in range(m)) for row in g]
        buf = [momentum * b + d for b, d in zip(buf, grad)] if momentum else grad
        w = project_simplex_floats([wi - lr * bi for wi, bi in zip(w, buf)])
    return w


@dataclass(frozen=True)
class FedCMOOAlgorithm:
    """FedCMOO's round logic: a randomized-SVD Gram estimate and warm-started FindWeights.

    Parameters
    ----------
    slices : TaskSlices
        Encoder / head positions in the flat parameter vector.
    lr_global : float
        Server learning rate ``eta_g``.
    seed : int
        Keys the clients' and the server's sketching matrices.
    config : FedCMOOSketch
        The hyper-parameters (:class:`FedCMOOConfig` for FedCMOO itself).
    """

    slices: TaskSlices
    lr_global: float
    seed: int = 0
    config: Any = field(default_factory=FedCMOOConfig)
    name: str = "fedcmoo"

    def init_state(self, num_tasks: int) -> FedCMOOState:
        """Uniform weights ``1/m`` before round 0 (FindWeights' warm start)."""
        return FedCMOOState(np.full(num_tasks, 1.0 / num_tasks))

    def _sketch(self, g: torch.Tensor, *keys: int | str) -> tuple[torch.Tensor, int]:
        d, m = g.shape
        rank = compression_rank(d, m, self.config.extra_upload)
        c, (left, right) = compress(g, rank, torch_generator(self.seed, "randsvd", *keys),
                                    self.config.oversample, self.config.power_iterations)
        return c, (left.numel() + right.numel()) * g.element_size()

    def gram_estimate(self, grads: torch.Tensor, clients: np.ndarray, round_idx: int,
                      federation: Federation) -> np.ndarray:
        """``GG`` from the clients' encoder gradients ``grads [k, m, d]`` (counts the bytes)."""
        enc = grads[:, :, self.slices.encoder].transpose(1, 2)  # [k, d_enc, m]
        k, _, m = enc.shape
        item = enc.element_size()
        sketches = [self._sketch(enc[i], "client", round_idx, int(c)) for i, c in enumerate(clients)]
        cs = torch.stack([c for c, _ in sketches])
        up_sketch = sketches[0][1]
        if self.config.estimator == "randsvd-direct":
            federation.count_uplink(up_sketch)
            total = cs.sum(0)
            gg = total.T @ total / k
        else:
            federation.count_uplink(up_sketch + m * m * item)  # C_k factors + exact local Gram
            sum_c, down_sketch = self._sketch(cs.sum(0), "server", round_idx)
            ds = enc - cs
            rest = sum_c.unsqueeze(0) - cs
            t1 = torch.einsum("kdi,kdj->ij", enc, enc)
            t2 = torch.einsum("kdi,kdj->ij", cs, rest)
            t3 = 2 * torch.einsum("kdi,kdj->ij", ds, rest)
            ratio = torch.sqrt(cs.square().sum() / ds.square().sum().clamp_min(1e-30))
            t4 = torch.zeros_like(t1) if ratio > 1.5 else (k - 1) * torch.einsum("kdi,kdj->ij", ds, ds)
            gg = (t1 + t2 + t3 + t4) / k
            # Correction stage: sumC factors down; D^T(sumC - C), D^T D and two norms up.
            federation.relay(down_bytes=down_sketch, up_bytes=(2 * m * m + 2) * item)
        gg_np = gg.double().cpu().numpy()
        return 0.5 * (gg_np + gg_np.T) if self.config.symmetrize else gg_np

    def round(self, state: Any, theta: torch.Tensor, federation: Federation) -> StepResult:
        """One round: the gradient (and correction) stage, the weights, the training stage."""
        m = state.num_tasks
        stage1 = federation.exchange(theta, self.gradient_request(m))
        assert stage1.gradients is not None
        grads = stage1.gradients  # [k, m, d], kept by the clients
        gg = self.gram_estimate(grads, federation.clients, state.round, federation)
        w, new_state, log = self.weights(gg, state, stage1)
        w_t = torch.as_tensor(w, dtype=grads.dtype, device=grads.device)
        first = torch.einsum("i,kid->kd", w_t, grads).unsqueeze(1)
        stage2 = federation.exchange(
            theta,
            Request(payload={"weights": w.astype(np.float32)}, send_model=False, train=w[None, :], first_step=first),
        )
        assert stage2.deltas is not None
        new_theta = fedavg_step(theta, stage2.deltas[:, 0], self.lr_global, stage2.weights)
        return StepResult(new_theta, new_state, log)

    def gradient_request(self, num_tasks: int) -> Request:
        """Stage 1: one gradient per task at ``theta^t``, kept by the clients (their sketches are counted)."""
        return Request(gradients=one_hot_rows(num_tasks), upload_gradients=False)

    def weights(self, gram: np.ndarray, state: Any, stage1: Replies) -> tuple[np.ndarray, Any, dict[str, Any]]:
        """FindWeights from the previous weights: ``(w, new state, log)``.

        The hook a method on FedCMOO's exchange overrides (:mod:`fedhv.algorithms.gramian`).
        """
        c = self.config
        w = check_weights(find_weights(gram, state.weights, c.weight_lr, c.weight_steps, c.weight_momentum),
                          name=self.name, round_index=state.round, kind="simplex",
                          source=lambda: source_text("the Gramian", gram), section=c, num_tasks=state.num_tasks)
        return w, replace(state, weights=w, round=state.round + 1), {"weights": w.tolist(), "gram": gram.tolist()}


@register
@dataclass(frozen=True)
class FedCMOO(Method):
    """FedCMOO (Askin et al., 2025): compressed task gradients, server-side weight optimisation.

    Parameters
    ----------
    lr_global : float
        Server learning rate ``eta_g`` (``[lr.fedcmoo] global``).
    config : FedCMOOConfig
        The ``[fedcmoo]`` hyper-parameters.
    """

    lr_global: float = 1.0
    config: FedCMOOConfig = field(default_factory=FedCMOOConfig)
    name: ClassVar[str] = "fedcmoo"
    section: ClassVar[type] = FedCMOOConfig
    state: ClassVar[type] = FedCMOOState
    needs_heads: ClassVar[bool] = True
    secure_aggregation: ClassVar[bool] = False
    #: ``fedhv tune`` searches FindWeights' step size (paper B.6: 1e-3).
    tuning: ClassVar[tuple[Dimension, ...]] = (Range("weight_lr", 1e-4, 1e-2, log=True, authors=(1e-3,)),)
    secure_refusal: ClassVar[str] = ("FedCMOO's gradient stage needs every client's own gradients G_k (the server "
                                     "sketches each and checks each first step W @ G_k), which SecAgg+ cannot mask")

    def build(self, context: BuildContext) -> Built:
        """:class:`FedCMOOAlgorithm` over the run's encoder / head split, its sketches keyed by the seed."""
        return Built(FedCMOOAlgorithm(context.task_slices(), self.lr_global, context.seed, self.config))
