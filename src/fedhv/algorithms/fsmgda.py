"""FSMGDA: federated stochastic multiple-gradient descent.

Yang et al., NeurIPS 2023, as implemented in the FedCMOO reference code (reference notes §4.1).

Round ``t`` (one synchronization stage):

1. each sampled client ``k`` runs, for every task ``i`` separately, ``K`` local SGD steps
   on ``l_i`` alone from ``theta^t`` (only the encoder and head ``i`` move) and uploads
   the ``m`` updates ``Delta_{k,i}`` (``m`` model-sized uplinks);
2. the server averages per task, ``Dbar_i = mean_k Delta_{k,i}``, and computes MGDA
   weights ``lambda = argmin_{simplex} ||sum_i lambda_i Dbar_i^enc||^2`` from the
   encoder part (plus the heads with ``count_decoders``);
3. ``theta_enc += eta_g sum_i lambda_i Dbar_i^enc`` and ``head_i += eta_g lambda_i
   Dbar_i^head`` (``scale_decoders``; otherwise ``head_i += eta_g Dbar_i^head``).

Choices where the paper is silent (following the reference code): the two-task
solution uses the reference's ``[0.001, 0.999]`` boundary values
(``reference_clip``); task updates are not normalised. Each task trajectory draws
its own minibatches (the reference continues one loader across tasks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from fedhv.algorithms.base import Federation, Request, StepResult, mean_update, one_hot_rows
from fedhv.algorithms.method import BuildContext, Built, Method, register
from fedhv.algorithms.plain import StateError, array_from_plain, array_to_plain, fields, int_from_plain
from fedhv.algorithms.weight_check import check_weights, source_text
from fedhv.config.validation import at_most
from fedhv.errors import ConfigError
from fedhv.models.params import TaskSlices
from fedhv.weighting import min_norm


@dataclass(frozen=True)
class FSMGDAExchange:
    """How FSMGDA's protocol turns task weights into a step (shared by every method on its exchange).

    Attributes
    ----------
    scale_decoders : bool
        Scale each head's update by its task weight.
    count_decoders : bool
        Include the heads in the Gramian of the task updates.
    """

    scale_decoders: bool = True
    count_decoders: bool = False
    #: The section's name in messages (``[fsmgda]``; a method on FSMGDA's exchange sets its own).
    key: ClassVar[str] = "fsmgda"

    def check(self) -> None:
        """Nothing to refuse: two switches."""


@dataclass(frozen=True)
class FSMGDAConfig(FSMGDAExchange):
    """FSMGDA's hyper-parameters, the ``[fsmgda]`` section.

    Reference notes §4.1; the defaults follow the reference code.

    Attributes
    ----------
    scale_decoders, count_decoders : bool
        The exchange's switches (:class:`FSMGDAExchange`).
    reference_clip : bool
        Two tasks: the reference code's ``[0.001, 0.999]`` boundary values.
    max_iter, tol : int, float
        Min-norm solver limits (``m >= 3``).
    """

    reference_clip: bool = True
    max_iter: int = 1000
    tol: float = 1e-10

    def check(self) -> None:
        """Refuse solver limits that cannot converge (one line naming the keys)."""
        if self.max_iter < 1 or not self.tol > 0:
            raise ConfigError(f"fsmgda.max_iter = {self.max_iter} must be >= 1 and fsmgda.tol = {self.tol} > 0")
        # Wolfe's algorithm ends in finitely many corrals (a few per task); a million iterations are far beyond
        # any m this runs, and bound the solver's time whatever the Gramian.
        at_most("fsmgda.max_iter", self.max_iter, 1_000_000, "e.g. 1000 (the reference code's)")


@dataclass(frozen=True)
class FSMGDAState:
    """Task count and the last MGDA weights (for logging)."""

    num_tasks: int
    last_weights: np.ndarray | None = None
    kind: ClassVar[str] = "fsmgda"

    def to_plain(self) -> dict[str, Any]:
        """``{"num_tasks": int, "last_weights": Tensor [m] or None}``."""
        return {"num_tasks": int(self.num_tasks), "last_weights": array_to_plain(self.last_weights)}

    @classmethod
    def from_plain(cls, data: Any) -> FSMGDAState:
        """Inverse of :meth:`to_plain`."""
        d = fields(data, cls.kind, ("num_tasks", "last_weights"))
        m = int_from_plain(d["num_tasks"], "fsmgda num_tasks", minimum=1)
        last = array_from_plain(d["last_weights"], "fsmgda last_weights", optional=True)
        if last is not None and len(last) != m:
            raise StateError(f"fsmgda last_weights has {len(last)} values for {m} tasks")
        return cls(m, last)


@dataclass(frozen=True)
class FSMGDAAlgorithm:
    """FSMGDA's round logic: min-norm weights from averaged multi-step task updates.

    Parameters
    ----------
    slices : TaskSlices
        Encoder / head positions in the flat parameter vector.
    lr_global : float
        Server learning rate ``eta_g``.
    config : FSMGDAExchange
        The hyper-parameters (:class:`FSMGDAConfig` for FSMGDA itself).
    """

    slices: TaskSlices
    lr_global: float
    config: Any = field(default_factory=FSMGDAConfig)
    name: str = "fsmgda"

    def init_state(self, num_tasks: int) -> FSMGDAState:
        """The task count, no weights yet."""
        return FSMGDAState(num_tasks)

    def round(self, state: Any, theta: torch.Tensor, federation: Federation) -> StepResult:
        """One stage: ``m`` task trajectories per client, weights from their means' Gramian, the update."""
        m = state.num_tasks
        replies = federation.exchange(theta, Request(train=one_hot_rows(m)))
        assert replies.deltas is not None
        mean = mean_update(replies.deltas, replies.weights)  # [m, d]
        vectors = mean[:, self.slices.encoder]
        c = self.config
        if c.count_decoders:
            vectors = torch.cat([vectors] + [mean[:, h] for h in self.slices.heads], 1)
        v = vectors.double()
        gram = (v @ v.T).cpu().numpy()
        weights, new_state, log = self.weights(gram, state)
        lam = torch.as_tensor(weights, dtype=mean.dtype, device=mean.device)
        combined = lam @ mean  # encoder: sum_i lam_i Dbar_i; head i: lam_i Dbar_i (others' heads are 0)
        if not c.scale_decoders:
            for i, h in enumerate(self.slices.heads):
                combined[h] = mean[i, h]
        return StepResult(theta + self.lr_global * combined, new_state, log)

    def weights(self, gram: np.ndarray, state: Any) -> tuple[np.ndarray, Any, dict[str, Any]]:
        """MGDA's min-norm weights of the Gramian ``[m, m]`` (float64): ``(lambda, new state, log)``.

        The hook a method on FSMGDA's exchange overrides (:mod:`fedhv.algorithms.gramian`).
        """
        c = self.config
        sol = min_norm(gram, c.max_iter, c.tol, c.reference_clip)
        check_weights(sol.weights, name=self.name, round_index=None, kind="simplex",
                      source=lambda: source_text("the Gramian", gram), section=c, num_tasks=state.num_tasks)
        return sol.weights, FSMGDAState(state.num_tasks, sol.weights), {"weights": sol.weights.tolist(),
                                                                        "min_norm_sq": sol.norm_sq}


@register
@dataclass(frozen=True)
class FSMGDA(Method):
    """FSMGDA (Yang et al., 2023): min-norm weights of the clients' task updates.

    Parameters
    ----------
    lr_global : float
        Server learning rate ``eta_g`` (``[lr.fsmgda] global``).
    config : FSMGDAConfig
        The ``[fsmgda]`` hyper-parameters.
    """

    lr_global: float = 1.0
    config: FSMGDAConfig = field(default_factory=FSMGDAConfig)
    name: ClassVar[str] = "fsmgda"
    section: ClassVar[type] = FSMGDAConfig
    state: ClassVar[type] = FSMGDAState
    needs_heads: ClassVar[bool] = True

    def build(self, context: BuildContext) -> Built:
        """:class:`FSMGDAAlgorithm` over the run's encoder / head split."""
        return Built(FSMGDAAlgorithm(context.task_slices(), self.lr_global, self.config))
