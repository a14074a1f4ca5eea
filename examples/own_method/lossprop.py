"""A federated method in one file: loss-proportional task weights (an example plug-in).

Each round the server broadcasts theta^t and the weights w^t; the sampled clients report their
m task losses at theta^t, train K local steps on sum_i w_i l_i and return their updates (FedHV's
own one-stage protocol). The server keeps an exponential moving average of the averaged reports,
``E^{t} = decay E^{t-1} + (1 - decay) F^t`` (``E^0 = F^0``), and sets

    w^{t+1}_i = E_i^t ** power / sum_j E_j^t ** power,

so a task whose loss stays high gets more weight. It is an illustration of the extension API
(``docs/methods.md``, "Write your own method"), not a method from the literature.

Install it as a package whose ``pyproject.toml`` declares::

    [project.entry-points."fedhv.methods"]
    lossprop = "lossprop:LossProp"

and every fedhv entry point knows it: ``method = "lossprop"`` with a ``[lossprop]`` table in a
TOML file, ``--set lossprop.decay=0.5``, ``fedhv grid --methods fedhv,lossprop``, ``fedhv table``,
checkpoints and ``--resume``, the Flower App; in Python, ``fedhv.simulate(..., method=LossProp())``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

import fedhv
from fedhv.algorithms import BuildContext, Built, Federation, Request, StepResult, fedavg_step
from fedhv.algorithms.plain import array_from_plain, array_to_plain, fields


@dataclass(frozen=True)
class LossPropConfig:
    """The ``[lossprop]`` section: ``decay`` of the moving average, ``power`` of the weights."""

    decay: float = 0.8
    power: float = 1.0

    def check(self) -> None:
        """One line naming the key, the value and the fix."""
        if not 0.0 <= self.decay < 1.0:
            raise fedhv.ConfigError(f"lossprop.decay = {self.decay} must be in [0, 1), e.g. 0.8")
        if not self.power > 0:
            raise fedhv.ConfigError(f"lossprop.power = {self.power} must be > 0, e.g. 1.0")


@dataclass(frozen=True)
class LossPropState:
    """Weights for the coming round and the moving average of the reports (``None`` before one)."""

    weights: np.ndarray
    average: np.ndarray | None = None
    kind: ClassVar[str] = "lossprop"

    @property
    def num_tasks(self) -> int:
        return len(self.weights)

    def to_plain(self) -> dict[str, Any]:
        return {"weights": array_to_plain(self.weights), "average": array_to_plain(self.average)}

    @classmethod
    def from_plain(cls, data: Any) -> LossPropState:
        d = fields(data, cls.kind, ("weights", "average"))
        weights = array_from_plain(d["weights"], "lossprop weights")
        assert weights is not None
        return cls(weights, array_from_plain(d["average"], "lossprop average", optional=True))


@dataclass(frozen=True)
class LossPropAlgorithm:
    """The round logic (one stage, as FedHV's)."""

    lr_global: float
    config: LossPropConfig
    name: str = "lossprop"

    def init_state(self, num_tasks: int) -> LossPropState:
        return LossPropState(np.full(num_tasks, 1.0 / num_tasks))

    def round(self, state: LossPropState, theta: Any, federation: Federation) -> StepResult:
        request = Request(payload={"weights": state.weights.astype(np.float32)}, report="all",
                          train=state.weights[None, :])
        replies = federation.exchange(theta, request)
        assert replies.reports is not None and replies.deltas is not None
        report = replies.reports.double().mean(0).cpu().numpy()
        c = self.config
        average = report if state.average is None else c.decay * state.average + (1 - c.decay) * report
        scores = np.maximum(average, 0.0) ** c.power
        weights = scores / scores.sum() if scores.sum() > 0 else np.full(len(report), 1.0 / len(report))
        log = {"weights": state.weights.tolist(), "report": report.tolist(), "next_weights": weights.tolist()}
        new_theta = fedavg_step(theta, replies.deltas[:, 0], self.lr_global, replies.weights)
        return StepResult(new_theta, replace(state, weights=weights, average=average), log)


@fedhv.register_method
@dataclass(frozen=True)
class LossProp(fedhv.Method):
    """Loss-proportional task weights; ``lr_global`` is the server learning rate ``eta_g``."""

    lr_global: float = 1.0
    config: LossPropConfig = field(default_factory=LossPropConfig)
    name: ClassVar[str] = "lossprop"
    section: ClassVar[type] = LossPropConfig
    state: ClassVar[type] = LossPropState
    complexity: ClassVar[tuple[str, str, str]] = (
        "objective estimation, one weighted local trajectory", "Θ(d + m)", "moving average of the reports")

    def build(self, context: BuildContext) -> Built:
        return Built(LossPropAlgorithm(self.lr_global, self.config))
