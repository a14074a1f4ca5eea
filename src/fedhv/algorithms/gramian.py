"""Gramian aggregators on the two gradient-geometry exchanges (FSMGDA's and FedCMOO's).

FSMGDA and FedCMOO each build the ``m x m`` Gramian of the tasks' directions and turn it into task
weights with one rule, MGDA's min-norm point. The aggregators of multi-task learning -- UPGrad, DualProj,
CAGrad, PCGrad, IMTL-G, Aligned-MTL (:mod:`fedhv.algorithms.aggregators`), FedMGDA+
(:mod:`fedhv.algorithms.fedmgda_plus`) and FedCMOO-Pref's EPO program (:mod:`fedhv.algorithms.fedcmoo_pref`)
-- are other maps from the same Gramian to weights. A method of this family is such a *rule* on one of
the two exchanges; the client never changes:

- **FSMGDA's exchange** (one stage, ``Theta(m d)`` up): every sampled client runs ``K`` local steps per
  task; the server averages them per task, ``Dbar_i``, forms ``G = V V^T`` from their encoder parts
  (with the heads when ``count_decoders``), and steps ``theta += eta_g sum_i w_i Dbar_i`` (each head by its
  own weight when ``scale_decoders``). With MGDA's rule this is :class:`fedhv.FSMGDA`.
- **FedCMOO's exchange** (two or three stages, ``Theta(d)`` up): each client computes one gradient per task,
  uploads a randomized-SVD sketch; the server estimates ``GG`` (:meth:`FedCMOOAlgorithm.gram_estimate`), sends
  the weights ``w``, and the clients train ``K`` steps on ``sum_i w_i l_i`` (the first step with their stored
  gradients). With MGDA's FindWeights rule this is :class:`fedhv.FedCMOO`.

A rule is a frozen dataclass whose fields are its hyper-parameters, with

- ``weights(inputs: GramianInputs) -> ndarray [m]``: the weights from the Gramian (float64);
- ``check_rule(key)``: refuses bad hyper-parameters naming ``key.field``;
- class attributes ``rule_name`` (the method's name after ``<exchange>-``), ``label`` (its name in tables), ``server_work`` (Table 12's third column) and
  ``needs_losses`` (FedCMOO-Pref: the clients also report their task losses in stage 1, ``m`` floats up).

:func:`gramian_method` registers the method ``<exchange>-<rule>`` (``fsmgda-upgrad``, ``fedcmoo-cagrad``, ...):
its section ``[fsmgda-upgrad]`` holds the rule's fields and the exchange's (:class:`FSMGDAExchange`,
:class:`FedCMOOSketch`), each default written once, in its class. Its learning rates are the exchange's
(``rates_from``: FSMGDA-trajectory methods take FSMGDA's preset rates, FedCMOO-Gram methods FedCMOO's).

The rules keep whatever scale their authors give the aggregated direction (UPGrad's weights sum to at least
1, CAGrad's to ``1 + c ...``, Aligned-MTL's ``B 1`` is rescaled by the Gramian's spectrum, as the authors'
sum); where an author's code sums the tasks (PCGrad), fedhv takes the mean (a factor ``1/m`` on ``eta_g``;
the rule's docstring says so). Every round logs ``weight_sum`` (``sum_i w_i``, the effective step against
MGDA's simplex weights). Weights may be negative (IMTL-G and Aligned-MTL can give them); they are
checkpointed as given.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import torch

from fedhv.algorithms.base import Replies, Request
from fedhv.algorithms.fedcmoo import FedCMOOAlgorithm, FedCMOOSketch, FedCMOOState
from fedhv.algorithms.fsmgda import FSMGDAAlgorithm, FSMGDAExchange
from fedhv.algorithms.method import BuildContext, Built, Method, register
from fedhv.algorithms.weight_check import WeightRuleError, check_weights, describe, source_text
from fedhv.errors import ConfigError, FedHVError

#: What to install for the aggregators that run through torchjd (and FedMGDA+'s / EPO's solvers).
GRAMIAN_EXTRA = "pip install 'fedhv[gramian]'"


@dataclass(frozen=True)
class GramianInputs:
    """What a rule sees in one round.

    Attributes
    ----------
    gram : ndarray ``[m, m]``
        The Gramian of the tasks' directions (float64, symmetric).
    previous : ndarray ``[m]``
        The weights of the previous round (``1/m`` before the first).
    round_index : int
        The 0-based round (keys a random rule's draw with ``seed``).
    seed : int
        The run's training seed.
    losses : ndarray ``[m]`` or None
        The participating clients' mean task losses at ``theta^t`` (rules with ``needs_losses``).
    """

    gram: np.ndarray
    previous: np.ndarray
    round_index: int
    seed: int
    losses: np.ndarray | None = None


class GramianRule(Protocol):
    """A map from the tasks' Gramian to task weights (see the module docstring)."""

    label: ClassVar[str]
    server_work: ClassVar[str]
    needs_losses: ClassVar[bool]

    def weights(self, inputs: GramianInputs) -> np.ndarray:
        """``[m]`` task weights (float64)."""

    def check_rule(self, key: str) -> None:
        """Refuse bad hyper-parameters, naming ``key.field``."""


@dataclass(frozen=True)
class GramianState(FedCMOOState):
    """The server state of a Gramian method: the last weights (``1/m`` before the first round) and the round
    counter (it keys the sketches and a random rule's draws); the weights need not lie on the simplex."""

    kind: ClassVar[str] = "gramian"
    on_simplex: ClassVar[bool] = False


def _source(gram: np.ndarray, losses: np.ndarray | None) -> str:
    text = source_text("the Gramian", gram)
    return text if losses is None else f"{text} and {source_text('the averaged losses', losses)}"


def _rule_weights(rule: Any, gram: np.ndarray, state: GramianState, seed: int,
                  losses: np.ndarray | None = None, name: str | None = None,
                  ) -> tuple[np.ndarray, GramianState, dict[str, Any]]:
    """The rule's weights, finite and one per task, else a one-line
    :class:`~fedhv.algorithms.weight_check.WeightRuleError` naming the method's settings (a solver that fails on
    them, e.g. ``fsmgda-cagrad.c = 1e308``, as well)."""
    key = str(name or getattr(rule, "key", type(rule).__name__))
    try:
        w = rule.weights(GramianInputs(gram, state.weights, state.round, seed, losses))
    except (FedHVError, ImportError):
        raise
    except Exception as exc:  # a solver's own error (quadprog's ValueError, cvxpy's SolverError, ...) on these inputs
        reason = f"solver failed ({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})"
        raise WeightRuleError(describe(key, state.round, reason, _source(gram, losses), rule)) from exc
    w = check_weights(w, name=key, round_index=state.round, kind="finite", source=lambda: _source(gram, losses),
                      section=rule, num_tasks=state.num_tasks)
    log: dict[str, Any] = {"weights": w.tolist(), "weight_sum": float(w.sum()), "gram": gram.tolist()}
    if losses is not None:
        log["losses"] = losses.tolist()
    return w, GramianState(w, state.round + 1), log


@dataclass(frozen=True)
class FSMGDAGramian(FSMGDAAlgorithm):
    """FSMGDA's exchange with another rule (its ``config`` is the method's section, a rule)."""

    seed: int = 0

    def init_state(self, num_tasks: int) -> GramianState:  # type: ignore[override]
        """``1/m`` before round 0."""
        return GramianState(np.full(num_tasks, 1.0 / num_tasks))

    def weights(self, gram: np.ndarray, state: Any) -> tuple[np.ndarray, Any, dict[str, Any]]:
        """The rule's weights of the averaged task updates' Gramian."""
        return _rule_weights(self.config, gram, state, self.seed, name=self.name)


@dataclass(frozen=True)
class FedCMOOGramian(FedCMOOAlgorithm):
    """FedCMOO's exchange with another rule (its ``config`` is the method's section, a rule)."""

    def init_state(self, num_tasks: int) -> GramianState:  # type: ignore[override]
        """``1/m`` before round 0."""
        return GramianState(np.full(num_tasks, 1.0 / num_tasks))

    def gradient_request(self, num_tasks: int) -> Request:
        """Stage 1; with a rule that ``needs_losses``, the clients also report (eval mode, whole local data)."""
        request = super().gradient_request(num_tasks)
        return dataclasses.replace(request, report="all") if self.config.needs_losses else request

    def weights(self, gram: np.ndarray, state: Any, stage1: Replies) -> tuple[np.ndarray, Any, dict[str, Any]]:
        """The rule's weights of the estimated Gramian."""
        losses = None
        if self.config.needs_losses:
            assert stage1.reports is not None
            losses = stage1.reports.double().mean(0).cpu().numpy()
        return _rule_weights(self.config, gram, state, self.seed, losses, self.name)


@dataclass(frozen=True)
class Exchange:
    """One of the two gradient-geometry exchanges a rule can run on.

    Attributes
    ----------
    name : str
        ``"fsmgda"`` or ``"fedcmoo"``: the prefix of its methods' names and whose learning rates they take.
    label : str
        Its name in tables (``"FSMGDA"``).
    section : type
        The exchange's own section fields (:class:`FSMGDAExchange`, :class:`FedCMOOSketch`).
    algorithm : type
        Its round logic with a rule (:class:`FSMGDAGramian`, :class:`FedCMOOGramian`).
    client, communication : str
        Table 12's first two columns.
    secure_aggregation : bool
        Whether SecAgg+ can carry its uploads.
    secure_refusal : str
        Why not, when it cannot.
    """

    name: str
    label: str
    section: type
    algorithm: type
    client: str
    communication: str
    secure_aggregation: bool = True
    secure_refusal: str = ""


FSMGDA_EXCHANGE = Exchange("fsmgda", "FSMGDA", FSMGDAExchange, FSMGDAGramian,
                           "m local trajectories (one per task)", "Θ(md)")
FEDCMOO_EXCHANGE = Exchange(
    "fedcmoo", "FedCMOO", FedCMOOSketch, FedCMOOGramian, "m gradients, compression, one weighted local trajectory", "Θ(d)",
    secure_aggregation=False,
    secure_refusal=("the Gram estimate needs every client's own gradient sketches (and the first local step its own "
                    "gradients), which SecAgg+ cannot mask"))


@dataclass(frozen=True)
class GramianMethod(Method):
    """Base of a Gramian method: a rule (its section) on an exchange (see the module docstring)."""

    lr_global: float = 1.0
    state: ClassVar[type] = GramianState
    needs_heads: ClassVar[bool] = True
    exchange: ClassVar[Exchange]

    def build(self, context: BuildContext) -> Built:
        """The exchange's round logic around the configured rule (checks that its packages are installed)."""
        rule = self.options()
        require = getattr(rule, "require", None)
        if require is not None:
            require(self.name)
        algorithm = self.exchange.algorithm(context.task_slices(), self.lr_global, config=rule, name=self.name,
                                            seed=context.seed)
        return Built(algorithm)

    @classmethod
    def front_overrides(cls, direction: tuple[float, ...], margin: float | None = None) -> tuple[str, ...] | None:
        """The rule's aim at ``direction`` (its ``front_values``: section key -> value, e.g. EPO's
        preference), under this method's section; ``None`` for a rule that takes no direction."""
        aim = getattr(cls.section, "front_values", None)
        if aim is None:
            return None
        return tuple(f"{cls.name}.{key}={value!r}" for key, value in aim(direction).items())


def gramian_method(exchange: Exchange, rule: Any, name: str | None = None, class_name: str | None = None,
                   label: str | None = None, doc: str = "") -> type[Method]:
    """Register the method ``rule`` on ``exchange`` and return its class.

    The class and its section class are made here (a dataclass subclassing the rule and the exchange's
    section) and bound, under their names, in the calling module (so that pickling finds them).

    Parameters
    ----------
    exchange : Exchange
        :data:`FSMGDA_EXCHANGE` or :data:`FEDCMOO_EXCHANGE`.
    rule : type
        The rule's frozen dataclass (see the module docstring).
    name : str, optional
        The method's name (default ``"<exchange>-<rule.rule_name>"``).
    class_name : str, optional
        The class's name (default the exchange's label and the rule's class name: ``FSMGDAUPGrad``).
    label : str, optional
        Its name in tables (default ``"<rule.label> (<exchange.label>)"``: ``"UPGrad (FSMGDA)"``).
    doc : str
        The method class's docstring.

    Returns
    -------
    type
        The registered :class:`GramianMethod` subclass.
    """
    method_name = name or f"{exchange.name}-{rule.rule_name}"
    module = sys._getframe(1).f_globals
    class_name = class_name or f"{exchange.label}{rule.__name__}"
    base_section: Any = exchange.section

    def check(self: Any) -> None:
        base_section.check(self)
        self.check_rule(method_name)

    section = dataclasses.make_dataclass(
        f"{class_name}Config", [], bases=(rule, base_section), frozen=True,
        namespace={"key": method_name, "check": check,
                   "__doc__": f"The ``[{method_name}]`` section: {rule.__name__}'s fields and the {exchange.name} "
                              "exchange's."})
    label = label or f"{rule.label} ({exchange.label})"
    cls = dataclasses.make_dataclass(
        class_name, [("config", section, field(default_factory=section))], bases=(GramianMethod,),
        frozen=True,
        namespace={"name": method_name, "section": section, "exchange": exchange, "rates_from": exchange.name,
                   "tuning": getattr(rule, "tuning", ()),  # the rule's own search dimensions (fedhv tune)
                   "label": label, "secure_aggregation": exchange.secure_aggregation,
                   "secure_refusal": exchange.secure_refusal,
                   "complexity": (exchange.client, exchange.communication, rule.server_work),
                   "__doc__": doc or f"{rule.label} on {exchange.name}'s exchange; ``lr_global`` is ``eta_g``."})
    for made in (section, cls):
        made.__module__ = module["__name__"]
        module[made.__name__] = made
    return register(cls)


def torchjd_module(what: str) -> Any:
    """``torchjd.aggregation``, or a one-line :class:`ConfigError` naming the extra to install."""
    try:
        from torchjd import aggregation
    except ImportError as exc:
        raise ConfigError(f"{what} runs through torchjd, which is not installed: {GRAMIAN_EXTRA}") from exc
    return aggregation


def torchjd_weights(weighting: Any, gram: np.ndarray) -> np.ndarray:
    """A torchjd ``Weighting`` applied to ``G / trace(G)`` (float64 in, float64 out; ``1/m`` when ``G = 0``).

    Every rule here gives the same weights for ``G`` and ``c G`` (``c > 0``); torchjd's quadprog projector
    and CAGrad, though, treat a Gramian whose trace is below ``norm_eps = 1e-4`` as zero (made for the
    gradients of one minibatch). Federated task updates and late-round gradients are often that small, so
    fedhv passes the trace-normalised Gramian: torchjd's own normalisation is then the identity and its
    ``reg_eps`` relative to the trace, as it intends.
    """
    g = np.asarray(gram, dtype=np.float64)
    trace = float(np.trace(g))
    if not trace > 0:
        return np.full(len(g), 1.0 / len(g))
    return weighting(torch.as_tensor(g / trace)).cpu().numpy().astype(np.float64)
