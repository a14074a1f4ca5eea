"""Flower Strategies for your own ServerApp: FedHV and Uniform task weighting (flwr 1.42).

A user with their own ``ServerApp`` and ``ClientApp`` (Flower's Message API) drops
:class:`FedHVStrategy` (or :class:`UniformStrategy`) where FedAvg would go::

    strategy = FedHVStrategy(num_tasks=3, calibration_rounds=10)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=50)

Protocol (one message round trip per round, as the paper's FedHV): the train message carries
the global arrays ``θᵗ`` and, in its ``ConfigRecord`` ``"config"``, the task weights ``wᵗ``
(``"fedhv-weights"``, read on the client with :func:`task_weights`). Each client evaluates its
*m* task losses at the received ``θᵗ`` (the report), trains on ``Σᵢ wᵢ ℓᵢ`` and replies with its
arrays and, through :func:`fedhv_reply`, the report in the ``MetricRecord``
(``"fedhv-report"``). The server averages arrays and reports (:class:`flwr.serverapp.strategy.FedAvg`'s
aggregation: the plain mean over the replies, as the paper, or weighted by ``"num-examples"``
with ``weighted_by_key="num-examples"``) and sets

    w^{t+1}_i ∝ 1 / max(r_i − F_i^t, ρ_clip)

(:func:`fedhv.weighting.hv_weights`), ``F^t`` the averaged report. The reference ``r`` is given,
or calibrated as the paper does: ``calibration_rounds`` uniform-weight rounds from the same
initial arrays, ``r = max_t F^t + margin`` (:func:`fedhv.weighting.reference_from_losses`), after
which the FedHV run starts again from the initial arrays.

FSMGDA and FedCMOO are not offered as Strategies: each round needs a gradient stage (every
client's *m* task gradients, or their sketches) before the training stage, a second round
trip with a reply format of its own, which ``Strategy.start``'s one train exchange per round
cannot express. They run through fedhv's own ServerApp (:mod:`fedhv.flower.app`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from fedhv.errors import ConfigError
from fedhv.weighting import hv_weights, reference_from_losses

log = logging.getLogger("fedhv")

WEIGHTS_KEY = "fedhv-weights"
REPORT_KEY = "fedhv-report"
UNIT_KEY = "fedhv-unit"  # 1 per reply: FedAvg's weighting by this key is the plain mean

__all__ = ["FedHVStrategy", "UniformStrategy", "fedhv_reply", "task_weights"]


def task_weights(msg: Message, num_tasks: int | None = None) -> list[float]:
    """The task weights ``wᵗ`` a FedHV / Uniform train message carries (client side)."""
    config = msg.content.config_records.get("config")
    if config is None or WEIGHTS_KEY not in config:
        raise ConfigError(f"the train message has no {WEIGHTS_KEY!r} in its 'config' record: send it with "
                          "fedhv.flower.strategy.FedHVStrategy or UniformStrategy")
    w = [float(v) for v in config[WEIGHTS_KEY]]  # type: ignore[union-attr]
    if num_tasks is not None and len(w) != num_tasks:
        raise ConfigError(f"the server sent {len(w)} task weights but this client has {num_tasks} tasks")
    return w


def fedhv_reply(msg: Message, arrays: ArrayRecord, report: Sequence[float], num_examples: int,
                metrics: dict[str, float] | None = None) -> Message:
    """The client's reply to a train message: its arrays and, next to them, the report — its *m*
    task losses evaluated at the model it *received* (before training) — plus ``num-examples``."""
    values = [float(v) for v in report]
    if not values or not all(np.isfinite(values)):
        raise ConfigError(f"report = {values}: give the m finite task losses at the received model")
    record = {REPORT_KEY: values, UNIT_KEY: 1.0, "num-examples": int(num_examples), **(metrics or {})}
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(record)}), reply_to=msg)


class FedHVStrategy(FedAvg):
    """FedHV task weighting over FedAvg's sampling and averaging (see the module docstring).

    Parameters
    ----------
    num_tasks : int
        ``m``, the number of task losses each client reports.
    reference : sequence of float, optional
        ``r``; ``None`` calibrates it (``calibration_rounds`` uniform rounds first).
    calibration_rounds : int
        Uniform-weight rounds of the calibration (``reference=None``); 20 in the paper.
    margin, rho_clip : float
        ``r = max_t Fᵗ + margin``; the slack floor ``ρ_clip``.
    weighted_by_key : str
        ``"fedhv-unit"`` (default): the plain mean over the replies, as the paper;
        ``"num-examples"``: FedAvg's sample-weighted mean.
    **fedavg : Any
        FedAvg's sampling options (``fraction_train``, ``min_train_nodes``, ``min_available_nodes``, …).

    Attributes
    ----------
    weights : ndarray ``[m]``
        ``wᵗ`` sent in the next round.
    history : list of dict
        Per round: ``round``, ``phase`` (``"calibration"`` / ``"train"``), ``report`` ``Fᵗ``,
        ``weights`` ``wᵗ`` used in that round.
    """

    adaptive = True

    def __init__(self, num_tasks: int, reference: Sequence[float] | None = None, *, calibration_rounds: int = 20,
                 margin: float = 0.15, rho_clip: float = 1e-6, weighted_by_key: str = UNIT_KEY,
                 **fedavg: Any) -> None:
        if num_tasks < 1:
            raise ConfigError(f"num_tasks = {num_tasks}: need at least one task")
        if reference is not None and len(reference) != num_tasks:
            raise ConfigError(f"reference has {len(reference)} values but num_tasks = {num_tasks}")
        if reference is None and self.adaptive and calibration_rounds < 1:
            raise ConfigError("calibration_rounds must be >= 1 without a reference; give reference=[...] or "
                              "calibration_rounds=20")
        if not rho_clip > 0:
            raise ConfigError(f"rho_clip = {rho_clip} must be > 0")
        fedavg.setdefault("fraction_evaluate", 0.0)
        fedavg.setdefault("min_evaluate_nodes", 0)
        super().__init__(weighted_by_key=weighted_by_key, **fedavg)
        self.num_tasks, self.margin, self.rho_clip = num_tasks, margin, rho_clip
        self.reference = None if reference is None else np.asarray(reference, dtype=np.float64)
        self.calibration_rounds = calibration_rounds
        self.weights = np.full(num_tasks, 1.0 / num_tasks)
        self.history: list[dict[str, Any]] = []
        self._phase = "train"
        self._calibration_reports: list[list[float]] = []

    # ---------------------------------------------------------------- the round
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        config[WEIGHTS_KEY] = [float(w) for w in self.weights]
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        for reply in replies:
            if not reply.has_error():
                self._check_report(reply)
        arrays, metrics = super().aggregate_train(server_round, replies)
        if metrics is None or REPORT_KEY not in metrics:
            log.warning("round %d: no valid reply; the task weights stay %s", server_round, self.weights.tolist())
            return arrays, metrics
        report = [float(v) for v in metrics[REPORT_KEY]]  # type: ignore[union-attr]
        self.history.append({"round": server_round, "phase": self._phase, "report": report,
                             "weights": self.weights.tolist()})
        if self._phase == "calibration":
            self._calibration_reports.append(report)
        elif self.adaptive and self.reference is not None:
            self.weights = hv_weights(np.asarray(report), self.reference, self.rho_clip).weights
        return arrays, metrics

    def _check_report(self, reply: Message) -> None:
        metrics = [r for r in reply.content.metric_records.values() if REPORT_KEY in r]
        if not metrics:
            raise ConfigError(f"a reply of node {reply.metadata.src_node_id} has no {REPORT_KEY!r}: build the "
                              "ClientApp's reply with fedhv.flower.strategy.fedhv_reply")
        got = len(metrics[0][REPORT_KEY])  # type: ignore[arg-type]
        if got != self.num_tasks:
            raise ConfigError(f"node {reply.metadata.src_node_id} reported {got} task losses, expected "
                              f"num_tasks = {self.num_tasks}")

    # ---------------------------------------------------------------- calibration, then the run
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Any = None) -> Result:
        """Calibrate ``r`` when it is not given (uniform rounds from ``initial_arrays``), then run
        ``num_rounds`` FedHV rounds from ``initial_arrays`` again; returns that run's ``Result``."""
        if self.adaptive and self.reference is None:
            self._phase = "calibration"
            self.weights = np.full(self.num_tasks, 1.0 / self.num_tasks)
            log.info("fedhv: calibrating the reference with %d uniform rounds", self.calibration_rounds)
            super().start(grid, initial_arrays, self.calibration_rounds, timeout, ConfigRecord(dict(train_config or {})))
            if not self._calibration_reports:
                raise ConfigError("the calibration got no valid reply; no reference can be computed")
            self.reference = np.asarray(reference_from_losses(self._calibration_reports, self.margin))
            log.info("fedhv: reference r = %s", self.reference.tolist())
            self.weights = np.full(self.num_tasks, 1.0 / self.num_tasks)
        self._phase = "train"
        return super().start(grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn)


class UniformStrategy(FedHVStrategy):
    """Fixed uniform task weights ``wᵢ = 1/m`` with FedHV's message format (the baseline)."""

    adaptive = False

    def __init__(self, num_tasks: int, **kwargs: Any) -> None:
        super().__init__(num_tasks, None, calibration_rounds=0, **kwargs)
