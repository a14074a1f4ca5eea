"""The loss-only protocol that FedHV shares with the loss-weighting methods of the field.

Round ``t`` (server holds ``theta^t`` and ``w^t``; one synchronization stage, as FedHV's):

1. broadcast ``(theta^t, w^t)`` to the sampled clients ``S_t``;
2. client ``k`` reports ``F_k^t``, its ``m`` task losses at ``theta^t`` (eval mode, over the report
   budget), runs ``K`` local steps on ``sum_i w_i^t l_i`` and returns ``(Delta theta_k^t, F_k^t)``;
3. ``theta^{t+1} = theta^t + eta_g mean_k Delta theta_k^t``, ``F^t = mean_k F_k^t`` and
   ``w^{t+1} = rule(F^t, memory)``.

The client never changes: a method of this family is its *weight rule* alone, a map from the averaged
reports (and what the rule remembers of earlier rounds) to the next weights. Per participating client it
costs ``2m`` scalars beyond the model (``m`` weights down, ``m`` reports up), ``Theta(d + m)``. A rule is an
object with

- ``first(m) -> (w^0, memory)``: the weights of round 1 (uniform for every rule here) and the rule's
  initial memory (a tuple of float arrays, checkpointed with the state);
- ``next(report, memory, round_index) -> (w^{t+1}, memory)``: ``round_index`` is ``t``, the 0-based
  index of the round whose report it is (keys a random rule's draw in the run's counter-based streams);
- optionally ``client_draw``: a :class:`~fedhv.algorithms.base.StepDraw` (or ``None``); when set, the
  clients draw the weights of every local step themselves from it (RLW, the authors' per-step draw) and
  ``w^t`` is what the round logs (the law's mean).

Scale. The weights of most rules lie on the simplex; a rule that keeps its authors' scale (STCH: the
gradient of the authors' loss) gives weights whose sum ``sum_i w_i`` is an effective step on ``eta_l``
that varies with the reports. Its method declares it by its state class, :class:`ScaledLossOnlyState`
(checkpoints then accept weights off the simplex). Every round logs ``weight_sum`` (``sum_i w^t_i``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol

import numpy as np
import torch

from fedhv.algorithms.base import Federation, Request, StepDraw, StepResult, fedavg_step
from fedhv.algorithms.method import BuildContext, Built, Method
from fedhv.algorithms.plain import StateError, array_from_plain, array_to_plain, fields, int_from_plain
from fedhv.algorithms.weight_check import check_weights, source_text
from fedhv.config.validation import MAX_REPORT_SAMPLES, at_most
from fedhv.errors import ConfigError


class WeightRule(Protocol):
    """A loss-only method's map from averaged reports to the next task weights."""

    def first(self, num_tasks: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """``(w^0, memory)`` before round 1."""

    def next(self, report: np.ndarray, memory: tuple[np.ndarray, ...],
             round_index: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """``(w^{t+1}, memory)`` from ``F^t`` (float64 ``[m]``) and the memory after round ``t - 1``."""


def memoryless(rule: Any, memory: tuple[np.ndarray, ...], num_tasks: int) -> None:
    """``check_memory`` of a rule that remembers nothing (``check_memory = memoryless`` in its class).

    A resumed memory must be empty.
    """
    if memory:
        raise StateError(f"{type(rule).__name__} keeps no memory, but the state holds {len(memory)} array(s)")


def uniform(num_tasks: int) -> np.ndarray:
    """``1/m`` in every entry (float64)."""
    return np.full(num_tasks, 1.0 / num_tasks)


def normalized(scores: np.ndarray) -> np.ndarray:
    """``scores / sum(scores)`` for finite, non-negative scores with a positive sum (float64).

    Scores whose sum overflows or is subnormal (``[1e308, 1e308]``, ``[1e-320, 1e-320]``) are first divided
    by their largest, so the weights stay exact (they were zeros or NaN); any other scores as they are.
    """
    scores = np.asarray(scores, dtype=np.float64)
    with np.errstate(over="ignore"):  # an overflowing sum is rescaled below
        total = scores.sum()
    if not np.isfinite(total) or 0 < total < np.finfo(np.float64).tiny:
        peak = scores.max()
        if np.isfinite(peak) and peak > 0:
            scores = scores / peak
            total = scores.sum()
    return scores / total


def softmax(x: np.ndarray) -> np.ndarray:
    """``exp(x_i - max x) / sum_j exp(x_j - max x)`` (float64; the shift changes nothing but overflow)."""
    e = np.exp(np.asarray(x, dtype=np.float64) - np.max(x))
    return e / e.sum()


@dataclass(frozen=True)
class LossOnlyState:
    """The server state of a loss-only method.

    Attributes
    ----------
    weights : ndarray ``[m]``
        ``w^t`` for the coming round (on the simplex; :class:`ScaledLossOnlyState`: finite, any sum).
    rounds : int
        Rounds whose reports the rule has seen.
    memory : tuple of ndarray
        What the rule keeps between rounds (earlier reports, logits, optimizer moments).
    """

    weights: np.ndarray
    rounds: int = 0
    memory: tuple[np.ndarray, ...] = ()
    kind: ClassVar[str] = "loss-only"
    #: Whether checkpointed weights must lie on the simplex (``>= 0``, sum 1).
    on_simplex: ClassVar[bool] = True

    @property
    def num_tasks(self) -> int:
        """``m``, the number of tasks."""
        return len(self.weights)

    def to_plain(self) -> dict[str, Any]:
        """``{"weights": Tensor [m], "rounds": int, "memory": [Tensor, ...]}`` (same dtypes)."""
        return {"weights": array_to_plain(self.weights), "rounds": int(self.rounds),
                "memory": [array_to_plain(a) for a in self.memory]}

    @classmethod
    def from_plain(cls, data: Any) -> LossOnlyState:
        """Inverse of :meth:`to_plain`.

        Every array must be finite, the weights on the simplex when :attr:`on_simplex`.
        """
        d = fields(data, cls.kind, ("weights", "rounds", "memory"))
        weights = array_from_plain(d["weights"], "loss-only weights")
        assert weights is not None
        if cls.on_simplex and ((weights < 0).any() or abs(float(weights.sum()) - 1.0) > 1e-6):
            raise StateError(f"loss-only weights {weights.tolist()} are not on the simplex (>= 0, sum 1)")
        if not isinstance(d["memory"], list):
            raise StateError(f"loss-only memory must be a list of tensors, found {type(d['memory']).__name__}")
        memory = []
        for i, value in enumerate(d["memory"]):
            a = array_from_plain(value, f"loss-only memory[{i}]")
            assert a is not None
            memory.append(a)
        return cls(weights, int_from_plain(d["rounds"], "loss-only rounds"), tuple(memory))


@dataclass(frozen=True)
class ScaledLossOnlyState(LossOnlyState):
    """The state of a loss-only method whose weights keep their authors' scale (not on the simplex).

    ``sum_i w_i`` is the round's effective step on the local learning rate.
    """

    kind: ClassVar[str] = "loss-only-scaled"
    on_simplex: ClassVar[bool] = False


@dataclass(frozen=True)
class LossOnlyAlgorithm:
    """The one-stage round of every loss-only method (FedHV's protocol) around a :class:`WeightRule`.

    Parameters
    ----------
    rule : WeightRule
        The method's weight map.
    lr_global : float
        Server learning rate ``eta_g``.
    name : str
        The method's name (as in ``method = ...``).
    report_batches : int or "all"
        The clients' report budget (``"all"``: each client's whole local dataset, as FedHV's default).
    state_class : type
        :class:`LossOnlyState` (weights on the simplex) or :class:`ScaledLossOnlyState`.
    section : dataclass, optional
        The method's section: named with its defaults when the rule's weights fail their check
        (:mod:`fedhv.algorithms.weight_check`).
    """

    rule: Any
    lr_global: float
    name: str
    report_batches: int | str = "all"
    state_class: type[LossOnlyState] = LossOnlyState
    section: Any = None

    def _checked(self, weights: Any, round_index: int, source: Any, num_tasks: int) -> np.ndarray:
        """The rule's weights if finite and on the simplex, else a one-line error.

        (:class:`ScaledLossOnlyState`: non-negative with a positive sum;
        :class:`~fedhv.algorithms.weight_check.WeightRuleError` otherwise.)
        """
        return check_weights(weights, name=self.name, round_index=round_index,
                             kind="simplex" if self.state_class.on_simplex else "scaled", source=source,
                             section=self.section if self.section is not None else self.rule, num_tasks=num_tasks)

    def init_state(self, num_tasks: int) -> LossOnlyState:
        """``w^0`` and the rule's initial memory."""
        weights, memory = self.rule.first(num_tasks)
        return self.state_class(self._checked(weights, 0, "the rule's first weights", num_tasks), 0, tuple(memory))

    def check_state(self, state: LossOnlyState) -> None:
        """Refuse a (resumed) state whose memory the rule cannot read.

        The rule's ``check_memory(memory, m)`` when it has one (:class:`~fedhv.algorithms.plain.StateError`
        naming the field).
        """
        check = getattr(self.rule, "check_memory", None)
        if check is not None:
            check(state.memory, state.num_tasks)

    def round(self, state: LossOnlyState, theta: torch.Tensor, federation: Federation) -> StepResult:
        """One stage: model + ``w`` down, update + report up; then ``w^{t+1}`` from the averaged report.

        With the rule's ``client_draw`` the clients draw every local step's weights themselves
        (:class:`~fedhv.algorithms.base.StepDraw`) and the round logs it as ``client_draw``.
        """
        draw: StepDraw | None = getattr(self.rule, "client_draw", None)
        replies = federation.exchange(theta, Request(payload={"weights": state.weights.astype(np.float32)},
                                                     report=self.report_batches, train=state.weights[None, :],
                                                     train_draw=draw))
        assert replies.reports is not None and replies.deltas is not None
        new_theta = fedavg_step(theta, replies.deltas[:, 0], self.lr_global, replies.weights)
        report = replies.reports.double().mean(0).cpu().numpy()
        weights, memory = self.rule.next(report, state.memory, state.rounds)
        weights = self._checked(weights, state.rounds, lambda: source_text("the averaged report", report),
                               len(report))
        log: dict[str, Any] = {"weights": state.weights.tolist(), "weight_sum": float(state.weights.sum()),
                               "report": report.tolist(), "next_weights": weights.tolist()}
        if draw is not None:
            log["client_draw"] = {"law": draw.law, "key": draw.key, "scale": draw.scale}
        return StepResult(new_theta, replace(state, weights=weights, rounds=state.rounds + 1, memory=tuple(memory)),
                          log)


def check_report_batches(key: str, value: int | str) -> None:
    """Refuse a report budget that is neither ``"all"`` nor a positive integer (one line naming ``key``)."""
    if isinstance(value, str):
        if value != "all":
            raise ConfigError(f"{key} = {value!r}: use \"all\" or a positive integer")
    elif value < 1:
        raise ConfigError(f"{key} = {value} must be >= 1 or \"all\"")
    else:  # the report plan is value x train.batch_size indices a client (validation.report_plan: the product)
        at_most(key, value, MAX_REPORT_SAMPLES, "lower it, e.g. 5, or use \"all\" (each client's own data)")


@dataclass(frozen=True)
class LossOnlyMethod(Method):
    """Base of a loss-only method: its section has ``report_batches``; a subclass gives :meth:`rule`."""

    state: ClassVar[type] = LossOnlyState
    rates_from: ClassVar[str | None] = "fedhv"  # FedHV's protocol and trajectory: FedHV's preset rates

    def rule(self, context: BuildContext) -> WeightRule:
        """The weight rule for one run."""
        raise NotImplementedError(f"{type(self).__name__} does not define rule(context)")

    def build(self, context: BuildContext) -> Built:
        """:class:`LossOnlyAlgorithm` around :meth:`rule`."""
        return Built(LossOnlyAlgorithm(self.rule(context), self.lr_global, self.name,
                                       self.options().report_batches, self.state, self.options()))
