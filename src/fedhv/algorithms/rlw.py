"""RLW, random loss weighting (Lin et al., "Reasonable Effectiveness of Random Weighting", TMLR 2022).

The task weights are ``w = softmax(eps)``, ``eps ~ N(0, std^2 I_m)``, a new draw at every local step
(LibMTL's ``weighting/RLW.py``, the authors' code: ``F.softmax(torch.randn(m))`` in every ``backward``,
weights summing to 1 as here). Default ``std = 1`` (the authors' standard normal).

``draw = "step"`` (default, the authors'): the client draws the weights of local step ``s`` of round ``t``
itself, from the run's counter-based stream ``(seed, stream, "rlw", t, client, s)``
(:class:`~fedhv.algorithms.base.StepDraw`; ``stream`` is ``"train"``), so a resumed run, the batched and
the sequential engine and a Flower node draw the same weights. The server sends no weights of its own: its
``w^t`` is the draws' mean ``1/m`` (by symmetry, ``E softmax(eps) = 1/m``), which the round logs with the
draw (``client_draw``).

``draw = "round"``: one draw per round, ``w^t`` from the stream ``(seed, "rlw", t)`` sent to every client
for all its local steps (fedhv's earlier RLW; the only form a Flower Strategy can send, since a user's
ClientApp trains on the weights it is given).

FedHV's loss-only protocol (:mod:`fedhv.algorithms.loss_only`): the reports are collected and logged
although the rule does not read them, so RLW runs on FedHV's accounting. Remaining differences from the
authors: the draw comes from fedhv's keyed numpy streams, not torch's global generator (same law).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fedhv.algorithms.base import StepDraw
from fedhv.algorithms.loss_only import LossOnlyMethod, check_report_batches, memoryless, softmax, uniform
from fedhv.algorithms.method import BuildContext, positive, register
from fedhv.algorithms.tuning import Dimension, Range
from fedhv.config.validation import at_most, choice
from fedhv.rng import numpy_rng

#: The largest ``rlw.std`` (issue 52): the authors' is 1, ``fedhv tune``'s largest 4; at 1000 the softmax of the
#: logits is one task's alone in nearly every draw, and ``1e308`` overflowed the logits to NaN weights.
MAX_STD = 1000.0

#: The values of ``rlw.draw``: a new draw at every local step on the client (the authors'), or one per round.
DRAWS = ("step", "round")


@dataclass(frozen=True)
class RLWConfig:
    """The ``[rlw]`` section.

    Attributes
    ----------
    std : float
        Standard deviation of the logits ``eps`` (the authors': 1).
    draw : str
        ``"step"``: the client draws at every local step (the authors'); ``"round"``: one draw per round.
    report_batches : int or "all"
        The clients' report budget.
    """

    std: float = 1.0
    draw: str = "step"
    report_batches: int | str = "all"

    def check(self) -> None:
        """Refuse a non-positive ``std``, an unknown ``draw`` or a bad report budget."""
        positive("rlw.std", self.std, "e.g. 1.0 (the authors' standard normal logits)")
        at_most("rlw.std", self.std, MAX_STD, "at 1000 every draw is already one task's alone; e.g. 1.0 (the "
                "authors' standard normal logits)")
        choice("rlw.draw", self.draw, DRAWS)
        check_report_batches("rlw.report_batches", self.report_batches)


@dataclass(frozen=True)
class RandomWeights:
    """``w^t = softmax(eps^t)``, ``eps^t`` from the stream ``(seed, "rlw", t)``: one draw per round."""

    seed: int
    std: float = 1.0
    check_memory = memoryless

    def draw(self, num_tasks: int, round_index: int) -> np.ndarray:
        """The weights of round ``round_index`` (0-based)."""
        return softmax(self.std * numpy_rng(self.seed, "rlw", round_index).standard_normal(num_tasks))

    def first(self, num_tasks: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """The draw of round 0."""
        return self.draw(num_tasks, 0), ()

    def next(self, report: np.ndarray, memory: tuple[np.ndarray, ...],
             round_index: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """The draw of the next round (the report is not read)."""
        return self.draw(len(report), round_index + 1), memory


@dataclass(frozen=True)
class StepRandomWeights:
    """The clients draw ``softmax(eps)``, ``eps ~ N(0, std^2 I)``, at every local step.

    Their law is :attr:`client_draw`; the server's ``w^t`` is the draws' mean ``1/m``.
    """

    std: float = 1.0
    check_memory = memoryless

    @property
    def client_draw(self) -> StepDraw:
        """``softmax-normal`` with scale ``std`` from the streams ``(seed, stream, "rlw", t, client, step)``."""
        return StepDraw("softmax-normal", "rlw", self.std)

    def first(self, num_tasks: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """``1/m``, the draws' mean."""
        return uniform(num_tasks), ()

    def next(self, report: np.ndarray, memory: tuple[np.ndarray, ...],
             round_index: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """``1/m`` again (the report is not read)."""
        return uniform(len(report)), memory


@register
@dataclass(frozen=True)
class RLW(LossOnlyMethod):
    """Random loss weighting; ``lr_global`` is the server learning rate ``eta_g``."""

    lr_global: float = 1.0
    config: RLWConfig = field(default_factory=RLWConfig)
    name: ClassVar[str] = "rlw"
    label: ClassVar[str] = "RLW"
    section: ClassVar[type] = RLWConfig
    #: ``fedhv tune`` searches the draw's scale std (the authors' standard normal: 1).
    tuning: ClassVar[tuple[Dimension, ...]] = (Range("std", 0.25, 4.0, log=True, authors=(1.0,)),)
    complexity: ClassVar[tuple[str, str, str]] = (
        "objective estimation, one weighted local trajectory", "Θ(d + m)", "a random draw of m logits")

    def rule(self, context: BuildContext) -> RandomWeights | StepRandomWeights:
        """Draws keyed by the run's seed: on the clients at every step (``draw = "step"``) or per round."""
        if self.config.draw == "step":
            return StepRandomWeights(self.config.std)
        return RandomWeights(context.seed, self.config.std)
