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
(``"fedhv-report"``). The server validates every reply (:meth:`FedHVStrategy.reply_problem`;
an invalid one is dropped, logged with its node id and counted, never raised), averages the
valid replies' arrays and reports (the plain mean over them, as the paper, or weighted by the
validated ``"num-examples"`` with ``weighted_by_key="num-examples"``; the weight is never the
client's ``"fedhv-unit"``) and sets

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
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from fedhv.algorithms.validation import (
    REPORT_OUTLIER_RATIO,
    ClientReply,
    ReplySpec,
    array_problem,
    count_problem,
    reply_problem,
    report_outliers,
)
from fedhv.errors import ConfigError
from fedhv.weighting import hv_weights, reference_from_losses

log = logging.getLogger("fedhv")

WEIGHTS_KEY = "fedhv-weights"
REPORT_KEY = "fedhv-report"
UNIT_KEY = "fedhv-unit"  # 1 per reply (older servers weighted by it); the server now weights replies itself
EXAMPLES_KEY = "num-examples"

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
    task losses evaluated at the model it *received* (before training) — plus ``num-examples``.
    Further ``metrics`` (finite numbers) are accepted by the server only when its Strategy
    declares their keys (``metric_keys=[...]``); otherwise the reply is dropped."""
    values = [float(v) for v in report]
    if not values or not all(np.isfinite(values)):
        raise ConfigError(f"report = {values}: give the m finite task losses at the received model")
    record = {REPORT_KEY: values, UNIT_KEY: 1.0, EXAMPLES_KEY: int(num_examples), **(metrics or {})}
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(record)}), reply_to=msg)


class FedHVStrategy(FedAvg):
    """FedHV task weighting over FedAvg's sampling and averaging (see the module docstring).

    Every reply is validated before it reaches the model or the weights (:meth:`reply_problem`):
    one ArrayRecord with exactly the broadcast arrays' names and shapes, real numbers (float or
    integer; the dtype may differ, as an integer buffer comes back from a float mean), all finite; one
    MetricRecord with a report of ``num_tasks`` finite values ``>= 0``, no report above
    ``max_report_ratio`` times the round's lower median of its task
    (:func:`fedhv.algorithms.validation.report_outliers`), ``fedhv-unit`` absent or 1,
    ``num-examples`` an integer in ``[1, max_num_examples]`` (absent allowed unless the
    weighting uses it), and no metric key but these and ``metric_keys``. An invalid reply
    is dropped, logged with its node id and the reason, and counted (:attr:`rejected`); a
    round without a valid reply keeps the model and the weights. The aggregation weight is
    the server's: ``1/k`` per valid reply (plain mean) or, with
    ``weighted_by_key="num-examples"``, the validated ``num-examples`` share.

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
        ``"fedhv-unit"`` (default): the plain mean over the valid replies, as the paper;
        ``"num-examples"``: the mean weighted by the replies' (validated) ``num-examples``.
    max_report_ratio : float
        A report above this factor times the round's lower median of its task is dropped
        (default 10; 0 = off).
    max_num_examples : int
        Largest ``num-examples`` a reply may state (default ``10**9``).
    metric_keys : sequence of str
        Further metric keys the ClientApp's replies carry (``fedhv_reply(..., metrics=...)``):
        finite numbers, averaged like the report. Any other key makes a reply invalid.
    **fedavg : Any
        FedAvg's sampling options (``fraction_train``, ``min_train_nodes``, ``min_available_nodes``, …).

    Attributes
    ----------
    weights : ndarray ``[m]``
        ``wᵗ`` sent in the next round.
    history : list of dict
        Per aggregated round: ``round``, ``phase`` (``"calibration"`` / ``"train"``), ``report``
        ``Fᵗ``, ``weights`` ``wᵗ`` used in that round, ``replies`` (valid replies aggregated) and
        ``rejected`` (``[node id, reason]`` of the replies dropped).
    rejected : list of tuple
        Every dropped reply: ``(round, phase, node id, reason)``.
    skipped : list of tuple
        ``(round, phase)`` of every round without a valid reply (model and weights kept).
    """

    adaptive = True

    def __init__(self, num_tasks: int, reference: Sequence[float] | None = None, *, calibration_rounds: int = 20,
                 margin: float = 0.15, rho_clip: float = 1e-6, weighted_by_key: str = UNIT_KEY,
                 max_report_ratio: float = REPORT_OUTLIER_RATIO, max_num_examples: int = 10**9,
                 metric_keys: Sequence[str] = (), **fedavg: Any) -> None:
        if num_tasks < 1:
            raise ConfigError(f"num_tasks = {num_tasks}: need at least one task")
        if reference is not None:
            ref = np.asarray(reference, dtype=np.float64)
            if ref.shape != (num_tasks,) or not np.isfinite(ref).all():
                raise ConfigError(f"reference = {list(reference)} must be {num_tasks} finite values (num_tasks)")
        if reference is None and self.adaptive and calibration_rounds < 1:
            raise ConfigError("calibration_rounds must be >= 1 without a reference; give reference=[...] or "
                              "calibration_rounds=20")
        if not 0 <= margin < np.inf:
            raise ConfigError(f"margin = {margin} must be finite and >= 0; use e.g. margin = 0.15")
        if not 0 < rho_clip < np.inf:
            raise ConfigError(f"rho_clip = {rho_clip} must be finite and > 0")
        if weighted_by_key not in (UNIT_KEY, EXAMPLES_KEY):
            raise ConfigError(f"weighted_by_key = {weighted_by_key!r}: use {UNIT_KEY!r} (the plain mean) or "
                              f"{EXAMPLES_KEY!r}")
        if not 0 <= max_report_ratio < np.inf or 0 < max_report_ratio <= 1:
            raise ConfigError(f"max_report_ratio = {max_report_ratio} must be finite and > 1 (0 = off); use 10")
        if count_problem(max_num_examples, "max_num_examples", 1, 2**62) is not None:
            raise ConfigError(f"max_num_examples = {max_num_examples!r} must be an integer >= 1")
        reserved = {REPORT_KEY, UNIT_KEY, EXAMPLES_KEY} & set(metric_keys)
        if reserved:
            raise ConfigError(f"metric_keys = {list(metric_keys)} name fedhv's own keys {sorted(reserved)}")
        fedavg.setdefault("fraction_evaluate", 0.0)
        fedavg.setdefault("min_evaluate_nodes", 0)
        super().__init__(weighted_by_key=weighted_by_key, **fedavg)
        self.num_tasks, self.margin, self.rho_clip = num_tasks, margin, rho_clip
        self.reference = None if reference is None else np.asarray(reference, dtype=np.float64)
        self.calibration_rounds = calibration_rounds
        self.max_report_ratio, self.max_num_examples = float(max_report_ratio), int(max_num_examples)
        self.metric_keys = tuple(metric_keys)
        self.weights = np.full(num_tasks, 1.0 / num_tasks)
        self.history: list[dict[str, Any]] = []
        self.rejected: list[tuple[int, str, int, str]] = []
        self.skipped: list[tuple[int, str]] = []
        self._phase = "train"
        self._calibration_reports: list[list[float]] = []
        self._sent: dict[str, tuple[int, ...]] | None = None  # the broadcast arrays: name -> shape

    # ---------------------------------------------------------------- the round
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        config[WEIGHTS_KEY] = [float(w) for w in self.weights]
        self._sent = {name: tuple(a.shape) for name, a in arrays.items()}
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The server-weighted mean of the valid replies' arrays and metrics (``None, None``
        when no reply is valid: the model and the weights stay); never raises on a reply."""
        valid: list[tuple[int, ArrayRecord, MetricRecord]] = []
        rejected: list[tuple[int, str]] = []
        for reply in replies:
            node = _node_id(reply)
            try:
                problem = self.reply_problem(reply)
            except Exception as exc:  # noqa: BLE001 - a reply no check foresaw is dropped, never raised
                problem = f"unreadable reply ({type(exc).__name__}: {exc})"
            if problem is None:
                valid.append((node, *_records(reply)))
            else:
                rejected.append((node, problem))
        outliers = report_outliers(
            [ClientReply(k, report=np.asarray(m[REPORT_KEY], dtype=np.float64)) for k, (_, _, m) in enumerate(valid)],
            ReplySpec(num_tasks=self.num_tasks, dim=0, report=True, max_report_ratio=self.max_report_ratio))
        rejected += [(valid[k][0], problem) for k, problem in enumerate(outliers) if problem is not None]
        valid = [v for v, problem in zip(valid, outliers) if problem is None]
        for node, problem in rejected:
            self.rejected.append((server_round, self._phase, node, problem))
            log.warning("round %d (%s): reply of node %s dropped: %s", server_round, self._phase, node, problem)
        if not valid:
            self.skipped.append((server_round, self._phase))
            log.warning("round %d (%s): no valid reply (%d dropped); round skipped: the model and the task "
                        "weights %s stay", server_round, self._phase, len(rejected), self.weights.tolist())
            return None, None
        arrays, metrics = self._aggregate(valid)
        report = [float(v) for v in metrics[REPORT_KEY]]  # type: ignore[union-attr]
        self.history.append({"round": server_round, "phase": self._phase, "report": report,
                             "weights": self.weights.tolist(), "replies": len(valid),
                             "rejected": [list(r) for r in rejected]})
        if self._phase == "calibration":
            self._calibration_reports.append(report)
        elif self.adaptive and self.reference is not None:
            self.weights = hv_weights(np.asarray(report), self.reference, self.rho_clip).weights
        return arrays, metrics

    def reply_problem(self, reply: Message) -> str | None:
        """Why a train reply must be dropped, or ``None`` when it is valid (see the class docstring)."""
        if reply.has_error():
            return f"Flower error {reply.error.code}: {reply.error.reason}"
        content = reply.content
        if len(content.array_records) != 1 or len(content.metric_records) != 1 or content.config_records:
            return (f"{len(content.array_records)} ArrayRecords, {len(content.metric_records)} MetricRecords and "
                    f"{len(content.config_records)} ConfigRecords; expected one ArrayRecord and one MetricRecord "
                    "(build the reply with fedhv.flower.strategy.fedhv_reply)")
        arrays, metrics = _records(reply)
        problem = self._arrays_problem(arrays)
        if problem is not None:
            return problem
        return self._metrics_problem(metrics)

    def _arrays_problem(self, arrays: ArrayRecord) -> str | None:
        sent = self._sent
        if sent is None:  # aggregate_train without configure_train: nothing to compare with
            return "no arrays were broadcast in this round"
        names = list(arrays.keys())
        if set(names) != set(sent) or len(names) != len(sent):
            missing, extra = sorted(set(sent) - set(names)), sorted(set(names) - set(sent))
            return f"array names differ from the broadcast ones (missing {missing[:5]}, unexpected {extra[:5]})"
        for name in names:
            problem = array_problem(f"array {name!r}", arrays[name].numpy(), sent[name])
            if problem is not None:
                return problem
        return None

    def _metrics_problem(self, metrics: MetricRecord) -> str | None:
        allowed = {REPORT_KEY, UNIT_KEY, EXAMPLES_KEY, *self.metric_keys}
        extra = sorted(set(metrics.keys()) - allowed)
        if extra:
            return f"unexpected metric keys {extra[:5]} (declare them with metric_keys=[...])"
        missing = [k for k in (REPORT_KEY, *self.metric_keys) if k not in metrics]
        if self.weighted_by_key == EXAMPLES_KEY and EXAMPLES_KEY not in metrics:
            missing.append(EXAMPLES_KEY)
        if missing:
            return f"metric keys {missing} missing (build the reply with fedhv.flower.strategy.fedhv_reply)"
        report = metrics[REPORT_KEY]
        if not isinstance(report, list):
            return f"{REPORT_KEY} = {report!r} is not a list of {self.num_tasks} losses"
        problem = reply_problem(ClientReply(0, report=report), ReplySpec(num_tasks=self.num_tasks, dim=0, report=True))
        if problem is not None:
            return problem
        if UNIT_KEY in metrics and metrics[UNIT_KEY] != 1:
            return f"{UNIT_KEY} = {metrics[UNIT_KEY]!r}, expected 1 (the server weights the replies, not the client)"
        if EXAMPLES_KEY in metrics:
            problem = count_problem(metrics[EXAMPLES_KEY], EXAMPLES_KEY, 1, self.max_num_examples)
            if problem is not None:
                return problem
        for key in self.metric_keys:
            value = metrics[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
                return f"metric {key!r} = {value!r} is not a finite number"
        return None

    def _aggregate(self, valid: list[tuple[int, ArrayRecord, MetricRecord]]) -> tuple[ArrayRecord, MetricRecord]:
        """Mean of the valid replies, weighted by the server: ``1/k`` each, or the ``num-examples`` shares."""
        if self.weighted_by_key == EXAMPLES_KEY:
            counts = [float(m[EXAMPLES_KEY]) for _, _, m in valid]  # type: ignore[arg-type]
            total = sum(counts)
            share = [c / total for c in counts]
        else:
            share = [1.0 / len(valid)] * len(valid)
        assert self._sent is not None
        out: dict[str, np.ndarray] = {}
        for (_, arrays, _), w in zip(valid, share):
            for name in self._sent:  # the broadcast order
                value = arrays[name].numpy() * w
                out[name] = value if name not in out else out[name] + value
        metrics = MetricRecord()
        for key in (REPORT_KEY, *self.metric_keys):
            rows = np.asarray([np.asarray(m[key], dtype=np.float64) for _, _, m in valid])
            mean = np.tensordot(np.asarray(share), rows, axes=1)
            metrics[key] = mean.tolist() if key == REPORT_KEY else float(mean)
        return ArrayRecord({k: Array(np.asarray(v)) for k, v in out.items()}), metrics

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
                dropped = [r for r in self.rejected if r[1] == "calibration"]
                example = f", e.g. node {dropped[0][2]}: {dropped[0][3]}" if dropped else ""
                raise ConfigError(f"the calibration got no valid reply in {self.calibration_rounds} rounds "
                                  f"({len(dropped)} replies dropped{example}); no reference can be computed")
            self.reference = np.asarray(reference_from_losses(self._calibration_reports, self.margin))
            log.info("fedhv: reference r = %s", self.reference.tolist())
            self.weights = np.full(self.num_tasks, 1.0 / self.num_tasks)
        self._phase = "train"
        return super().start(grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn)


def _node_id(reply: Message) -> int:
    try:
        return int(reply.metadata.src_node_id)
    except Exception:  # noqa: BLE001 - a reply without metadata is still dropped with a reason
        return -1


def _records(reply: Message) -> tuple[ArrayRecord, MetricRecord]:
    content = reply.content
    return next(iter(content.array_records.values())), next(iter(content.metric_records.values()))


class UniformStrategy(FedHVStrategy):
    """Fixed uniform task weights ``wᵢ = 1/m`` with FedHV's message format (the baseline)."""

    adaptive = False

    def __init__(self, num_tasks: int, **kwargs: Any) -> None:
        super().__init__(num_tasks, None, calibration_rounds=0, **kwargs)
