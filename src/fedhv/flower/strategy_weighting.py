"""The task-weighting Strategies (FedHV, Uniform, every loss-only method) and their reply checks: the
classes that :mod:`fedhv.flower.strategy` (the public module, documented there) exports."""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from fedhv.algorithms.validation import (
    ClientReply,
    ReplySpec,
    count_problem,
    report_outliers,
)
from fedhv.algorithms.weight_check import check_weights, source_text
from fedhv.errors import ConfigError
from fedhv.flower.strategy_messages import (
    CALIBRATION_KEY,
    EXAMPLES_KEY,
    REPORT_KEY,
    UNIT_KEY,
    WEIGHTS_KEY,
    evaluate_reply_problem,
    fedhv_evaluate_reply,
    fedhv_reply,
    mean_metrics,
    node_id,
    records,
    task_weights,
    train_arrays_problem,
    train_metrics_problem,
)
from fedhv.flower.strategy_rules import StrategyCalibration, StrategyContext, loss_only_method
from fedhv.weighting import hv_weights, reference_from_losses

#: A child of Flower's logger: fedhv's lines go wherever the ServerApp's Flower log goes.
log = logging.getLogger("flwr.fedhv")

__all__ = ["EXAMPLES_KEY", "REPORT_KEY", "UNIT_KEY", "WEIGHTS_KEY", "FedHVResult", "FedHVWeighting",
           "fedhv_evaluate_reply", "fedhv_reply", "task_weights"]

#: Attributes of the FedHV layer (kept when start() restores the base Strategy after the calibration).
_FEDHV_STATE = ("num_tasks", "margin", "rho_clip", "reference", "calibration_rounds", "max_report_ratio",
                "max_num_examples", "metric_keys", "nonnegative", "weights", "history", "rejected", "skipped", "_phase",
                "_calibration_reports", "_sent", "_sent_dtypes", "_restarting", "_announced", "method", "seed", "_rule", "_memory",
                "_rule_rounds", "_calibrate")


@dataclasses.dataclass
class FedHVResult(Result):
    """Flower's ``Result`` of the FedHV run plus what the task weighting did.

    Attributes
    ----------
    task_weights, reports : dict[int, list[float]]
        Per aggregated round of the run: the weights ``wᵗ`` sent and the averaged report ``Fᵗ``.
    reference : list of float or None
        ``r`` (given or calibrated).
    calibration : Result or None
        The calibration rounds' own ``Result`` (``None`` when ``r`` was given).
    calibration_reports : dict[int, list[float]]
        The calibration rounds' averaged reports.
    rejected, skipped : list
        As :attr:`FedHVWeighting.rejected` / :attr:`FedHVWeighting.skipped`.
    """

    task_weights: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    reports: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    reference: list[float] | None = None
    calibration: Result | None = None
    calibration_reports: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    rejected: list[tuple[int, str, int, str]] = dataclasses.field(default_factory=list)
    skipped: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    def __repr__(self) -> str:
        lines = [f"\t{r}: weights {[round(w, 4) for w in self.task_weights[r]]} report "
                 f"{[round(v, 4) for v in self.reports[r]]}" for r in sorted(self.reports)]
        return (super().__repr__() + f"\nFedHV reference: {self.reference}\nFedHV task weights per round:\n"
                + "\n".join(lines) + "\n")


class FedHVWeighting(FedAvg):
    """FedHV task weighting on a FedAvg-family Strategy (see the module docstring).

    Not built directly: :class:`FedHVStrategy` is it on FedAvg, :func:`fedhv_strategy` puts it
    on FedAdam, FedYogi, FedAdagrad, FedAvgM, FedProx or a subclass of your own (it sits right
    above FedAvg, so the server optimiser steps from the validated, task-weighted mean).

    Every reply is validated before it reaches the model or the weights (:meth:`reply_problem`):
    one ArrayRecord with exactly the broadcast arrays' names and shapes, real numbers (float or
    integer) of a dtype that casts safely to the broadcast's (float32 to float64 and an integer buffer's
    int64 to the float mean it was broadcast as are kept; a float64 reply to a float32 broadcast is
    dropped: 1e300 is finite there and infinite in the clients' model), all finite; one
    MetricRecord with a report of ``num_tasks`` finite values (``>= 0`` for the tasks declared
    ``nonnegative``), no report (of a non-negative task) above
    ``max_report_ratio`` times the round's lower median of its task
    (:func:`fedhv.algorithms.validation.report_outliers`), ``fedhv-unit`` absent or 1,
    ``num-examples`` an integer in ``[1, max_num_examples]`` (absent allowed unless the
    weighting uses it), and no metric key but these and ``metric_keys``. An invalid reply
    is dropped, logged with its node id and the reason, and counted (:attr:`rejected`); a
    round without a valid reply keeps the model and the weights. The aggregation weight is
    the server's: ``1/k`` per valid reply (plain mean, the paper's) or, with
    ``weighted_by_key="num-examples"``, the validated ``num-examples`` share (FedAvg's).

    The aggregated train ``MetricRecord`` of a round (``Result.train_metrics_clientapp``) holds
    the report ``"fedhv-report"`` and the ``metric_keys`` averaged with the arrays' weights, the
    weights ``"fedhv-weights"`` sent in that round and ``"fedhv-calibration"`` (1 in a calibration
    round); ``num-examples`` is not averaged (FedAvg leaves its weighting key out too). A
    ``train_metrics_aggr_fn`` given gets the valid replies, each with its server weight under
    ``weighted_by_key``; fedhv's three keys are set after it.

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
        Further metric keys the ClientApp's train replies carry (``fedhv_reply(..., metrics=...)``):
        finite numbers, averaged like the report. Any other key makes a reply invalid.
    nonnegative : bool or sequence of bool
        Whether each task's loss is bounded below by 0 (default ``True``: cross-entropy, BCE, MSE).
        A negative report of such a task is invalid, and ``max_report_ratio`` applies to such
        tasks only; ``False`` (one for all tasks, or one per task) for a loss of any sign (a
        Gaussian negative log-likelihood), whose reports need only be finite.
    **base : Any
        The base Strategy's options (``fraction_train``, ``min_train_nodes``, ``configrecord_key``,
        ``eta``, ``proximal_mu``, …); ``fraction_evaluate`` defaults to 0 (no evaluation rounds).

    Attributes
    ----------
    weights : ndarray ``[m]``
        ``wᵗ`` sent in the next round.
    history : list of dict
        Per aggregated round: ``round``, ``phase`` (``"calibration"`` / ``"train"``), ``report``
        ``Fᵗ``, ``weights`` ``wᵗ`` used in that round, ``replies`` (valid replies aggregated) and
        ``rejected`` (``[node id, reason]`` of the replies dropped).
    rejected : list of tuple
        Every dropped reply: ``(round, phase, node id, reason)``; phase ``"evaluate"`` for an
        evaluate reply.
    skipped : list of tuple
        ``(round, phase)`` of every round without a valid reply (model and weights kept).
    """

    adaptive = True

    def _fedhv_init(self, num_tasks: int, reference: Sequence[float] | None, calibration_rounds: int, margin: float,
                    rho_clip: float, weighted_by_key: str, max_report_ratio: float, max_num_examples: int,
                    metric_keys: Sequence[str], method: Any = None, seed: int = 0) -> None:
        """Validate and set the FedHV layer's options (the base Strategy's ``__init__`` runs after).

        With ``method`` (a loss-only method), its rule sets the weights instead of FedHV's map; it
        calibrates only when the method ``uses_calibration()`` (STCH), and then takes no reference.
        """
        self.method = None if method is None else loss_only_method(method)
        self.seed = int(seed)
        self._calibrate = self.adaptive if self.method is None else self.method.uses_calibration()
        if self.method is not None and reference is not None:
            raise ConfigError(f"reference is FedHV's; {self.method.name} takes none")
        if isinstance(num_tasks, bool) or not isinstance(num_tasks, (int, np.integer)) or num_tasks < 1:
            raise ConfigError(f"num_tasks = {num_tasks!r}: need at least one task")
        if reference is not None:
            ref = np.asarray(reference, dtype=np.float64)
            if ref.shape != (num_tasks,) or not np.isfinite(ref).all():
                raise ConfigError(f"reference = {list(reference)} must be {num_tasks} finite values (num_tasks)")
        if reference is None and self._calibrate and calibration_rounds < 1:
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
        reserved = {REPORT_KEY, UNIT_KEY, EXAMPLES_KEY, WEIGHTS_KEY, CALIBRATION_KEY} & set(metric_keys)
        if reserved:
            raise ConfigError(f"metric_keys = {list(metric_keys)} name fedhv's own keys {sorted(reserved)}")
        self.num_tasks, self.margin, self.rho_clip = int(num_tasks), margin, rho_clip
        self.reference = None if reference is None else np.asarray(reference, dtype=np.float64)
        self.calibration_rounds = calibration_rounds
        self.max_report_ratio, self.max_num_examples = float(max_report_ratio), int(max_num_examples)
        self.metric_keys = tuple(metric_keys)
        self.weights = np.full(num_tasks, 1.0 / num_tasks)
        self._rule: Any = None
        self._memory: tuple[np.ndarray, ...] = ()
        self._rule_rounds = 0
        if self.method is not None and not self._calibrate:
            self._start_rule(None)
        self.history: list[dict[str, Any]] = []
        self.rejected: list[tuple[int, str, int, str]] = []
        self.skipped: list[tuple[int, str]] = []
        self._phase = "train"
        self._calibration_reports: list[list[float]] = []
        self._sent: dict[str, tuple[int, ...]] | None = None  # the broadcast arrays: name -> shape
        self._sent_dtypes: dict[str, np.dtype[Any]] | None = None  # ... and name -> dtype
        self._restarting = False  # start() runs the calibration and restarts from the initial arrays
        self._announced = False

    @property
    def calibrating(self) -> bool:
        """Whether the next round is a calibration round (FedHV or STCH, no reference yet)."""
        return self._calibrate and self.reference is None

    def _start_rule(self, calibration: StrategyCalibration | None) -> None:
        """The method's rule for this run and its first weights (loss-only methods)."""
        assert self.method is not None
        self._rule = self.method.rule(StrategyContext(self.num_tasks, self.seed, calibration))
        if getattr(self._rule, "client_draw", None) is not None:
            raise ConfigError(f"{self.method.name}'s clients draw their task weights at every local step, which a "
                              "Strategy's own ClientApp does not do (it trains on the weights it is sent); configure "
                              f"{self.method.name} to draw once per round (its section's draw = \"round\") or run it "
                              "with fedhv's ServerApp")
        weights, memory = self._rule.first(self.num_tasks)
        self.weights, self._memory, self._rule_rounds = np.asarray(weights, dtype=np.float64), tuple(memory), 0

    def summary(self) -> None:
        """Flower's summary lines, then fedhv's."""
        super().summary()
        kind = ("FedHV" if self.adaptive else "Uniform") if self.method is None else \
            (type(self.method).label or self.method.name)
        ref = f"calibrated in {self.calibration_rounds} uniform rounds" if self.reference is None \
            else str(self.reference.tolist())
        log.info("\t└──> fedhv: %s task weighting of %d tasks, reference %s, aggregation %s", kind, self.num_tasks,
                 ref if self._calibrate else "-", "plain mean" if self.weighted_by_key == UNIT_KEY else "by num-examples")

    # ---------------------------------------------------------------- the round
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._phase = "calibration" if self.calibrating else "train"
        if self._phase == "calibration" and not self._restarting and not self._announced:
            self._announced = True
            log.warning("fedhv: no reference given and %s drives the rounds: rounds 1..%d of this run calibrate it "
                        "with uniform task weights; FedHV weighting follows from the model they reach (not "
                        "restarted; FedHVStrategy.start() restarts from the initial arrays)",
                        type(self).__name__, self.calibration_rounds)
        if self._phase == "calibration":
            self.weights = np.full(self.num_tasks, 1.0 / self.num_tasks)
        config[WEIGHTS_KEY] = [float(w) for w in self.weights]
        self._sent = {name: tuple(a.shape) for name, a in arrays.items()}
        self._sent_dtypes = {name: np.dtype(a.numpy().dtype) for name, a in arrays.items()}
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The server-weighted mean of the valid replies (in node-id order) and their metrics
        (``None, None`` when no reply is valid: the model and the weights stay); never raises on a reply."""
        valid: list[tuple[int, ArrayRecord, MetricRecord]] = []
        rejected: list[tuple[int, str]] = []
        for reply in sorted(replies, key=node_id):  # a fixed order: float sums do not depend on arrivals
            node = node_id(reply)
            try:
                problem = self.reply_problem(reply)
            except Exception as exc:  # noqa: BLE001 - a reply no check foresaw is dropped, never raised
                problem = f"unreadable reply ({type(exc).__name__}: {exc})"
            if problem is None:
                valid.append((node, *records(reply)))
            else:
                rejected.append((node, problem))
        outliers = report_outliers(
            [ClientReply(k, report=np.asarray(m[REPORT_KEY], dtype=np.float64)) for k, (_, _, m) in enumerate(valid)],
            ReplySpec(num_tasks=self.num_tasks, dim=0, report=True, max_report_ratio=self.max_report_ratio,
                      nonnegative=self.nonnegative))
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
        sent = self.weights.tolist()
        metrics[WEIGHTS_KEY] = sent
        metrics[CALIBRATION_KEY] = int(self._phase == "calibration")
        self.history.append({"round": server_round, "phase": self._phase, "report": report, "weights": sent,
                             "replies": len(valid), "rejected": [list(r) for r in rejected]})
        if self._phase == "calibration":
            self._calibration_reports.append(report)
            if len(self._calibration_reports) >= self.calibration_rounds:
                self._calibrated()
        elif self._rule is not None:
            weights, memory = self._rule.next(np.asarray(report, dtype=np.float64), self._memory, self._rule_rounds)
            self.weights, self._memory = self._checked(weights, report), tuple(memory)
            self._rule_rounds += 1
        elif self.adaptive and self.reference is not None:
            self.weights = self._checked(hv_weights(np.asarray(report), self.reference, self.rho_clip).weights, report)
        log.info("fedhv: round %d (%s): report %s, task weights %s -> %s, %d replies (%d dropped)", server_round,
                 self._phase, [round(v, 4) for v in report], [round(w, 4) for w in sent],
                 [round(float(w), 4) for w in self.weights], len(valid), len(rejected))
        return arrays, metrics

    def _checked(self, weights: Any, report: Sequence[float]) -> np.ndarray:
        """The next task weights if finite and on the simplex (a scaled rule's: non-negative, a positive sum), else
        a one-line :class:`~fedhv.algorithms.weight_check.WeightRuleError` naming the settings (issue 52)."""
        method = self.method
        scaled = method is not None and not getattr(method.state, "on_simplex", True)
        return check_weights(weights, name=method.name if method is not None else "fedhv",
                             round_index=self._rule_rounds if method is not None else None,
                             kind="scaled" if scaled else "simplex",
                             source=lambda: source_text("the averaged report", report) + (
                                 "" if method is not None else f" with the reference r = {self.reference.tolist()} "
                                 f"and rho_clip = {self.rho_clip:g}"),
                             section=method.options() if method is not None else None, num_tasks=self.num_tasks)

    def _calibrated(self) -> None:
        self.reference = np.asarray(reference_from_losses(self._calibration_reports, self.margin))
        self.weights = np.full(self.num_tasks, 1.0 / self.num_tasks)
        if self.method is not None:
            self._start_rule(StrategyCalibration(self.reference.tolist(), {"0": list(self._calibration_reports)},
                                                 np.max(self._calibration_reports, axis=0).tolist(), self.margin))
        log.info("fedhv: reference r = %s from %d calibration rounds", self.reference.tolist(),
                 len(self._calibration_reports))

    def reply_problem(self, reply: Message) -> str | None:
        """Why a train reply must be dropped, or ``None`` when it is valid (see the class docstring)."""
        if reply.has_error():
            return f"Flower error {reply.error.code}: {reply.error.reason}"
        content = reply.content
        if len(content.array_records) != 1 or len(content.metric_records) != 1 or content.config_records:
            return (f"{len(content.array_records)} ArrayRecords, {len(content.metric_records)} MetricRecords and "
                    f"{len(content.config_records)} ConfigRecords; expected one ArrayRecord and one MetricRecord "
                    "(build the reply with fedhv.flower.strategy.fedhv_reply)")
        arrays, metrics = records(reply)
        if self._sent is None:  # aggregate_train without configure_train: nothing to compare with
            return "no arrays were broadcast in this round"
        return train_arrays_problem(arrays, self._sent, self._sent_dtypes) or train_metrics_problem(
            metrics, self.num_tasks, self.nonnegative, self.metric_keys, self.max_num_examples,
            need_examples=self.weighted_by_key == EXAMPLES_KEY)

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
        ours = mean_metrics([MetricRecord({k: m[k] for k in (REPORT_KEY, *self.metric_keys)}) for _, _, m in valid],
                            share)
        if self.train_metrics_aggr_fn is aggregate_metricrecords:
            metrics = ours
        else:  # the user's aggregation, each reply carrying its server weight under weighted_by_key
            contents = [RecordDict({"metrics": MetricRecord({**dict(m.items()), self.weighted_by_key: w})})
                        for (_, _, m), w in zip(valid, share)]
            metrics = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
            metrics[REPORT_KEY] = ours[REPORT_KEY]
        return ArrayRecord({k: Array(np.asarray(v)) for k, v in out.items()}), metrics

    # ---------------------------------------------------------------- evaluation
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        if self._restarting and self._phase == "calibration":
            return []  # start()'s calibration model is thrown away: nothing to evaluate
        return super().configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The ``num-examples``-weighted mean of the valid evaluate replies (node-id order), each key over
        the replies carrying it; an invalid reply is dropped, logged and counted (phase ``"evaluate"``)."""
        replies = sorted(replies, key=node_id)
        if not replies:  # no evaluation in this round (fraction_evaluate = 0, or start()'s calibration)
            return None
        valid: list[MetricRecord] = []
        for reply in replies:
            node = node_id(reply)
            try:
                problem = evaluate_reply_problem(reply, self.num_tasks, self.max_num_examples)
            except Exception as exc:  # noqa: BLE001 - dropped, never raised
                problem = f"unreadable reply ({type(exc).__name__}: {exc})"
            if problem is None:
                valid.append(next(iter(reply.content.metric_records.values())))
            else:
                self.rejected.append((server_round, "evaluate", node, problem))
                log.warning("round %d (evaluate): reply of node %s dropped: %s", server_round, node, problem)
        if not valid:
            log.warning("round %d (evaluate): no valid evaluate reply", server_round)
            return None
        if self.evaluate_metrics_aggr_fn is not aggregate_metricrecords:
            return self.evaluate_metrics_aggr_fn([RecordDict({"metrics": m}) for m in valid], EXAMPLES_KEY)
        return mean_metrics(valid, [float(m[EXAMPLES_KEY]) for m in valid], skip=(EXAMPLES_KEY,))  # type: ignore[arg-type]

    # ---------------------------------------------------------------- calibration, then the run
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Any = None) -> FedHVResult:
        """Calibrate ``r`` when it is not given (uniform rounds from ``initial_arrays``), then run
        ``num_rounds`` FedHV rounds from ``initial_arrays`` again, the base Strategy's state (a server
        optimiser's moments) as before the calibration; returns that run's :class:`FedHVResult`."""
        calibration: Result | None = None
        first = len(self.history)
        if self.calibrating:
            saved = copy.deepcopy({k: v for k, v in vars(self).items() if k not in _FEDHV_STATE})
            log.info("fedhv: calibrating the reference with %d uniform rounds", self.calibration_rounds)
            self._restarting = True
            try:
                calibration = super().start(grid, initial_arrays, self.calibration_rounds, timeout,
                                            ConfigRecord(dict(train_config or {})))
            finally:
                self._restarting = False
            if self.reference is None and self._calibration_reports:  # some rounds were skipped
                self._calibrated()
            if self.reference is None:
                dropped = [r for r in self.rejected if r[1] == "calibration"]
                example = f", e.g. node {dropped[0][2]}: {dropped[0][3]}" if dropped else ""
                raise ConfigError(f"the calibration got no valid reply in {self.calibration_rounds} rounds "
                                  f"({len(dropped)} replies dropped{example}); no reference can be computed")
            vars(self).update(saved)  # the base Strategy (e.g. FedAdam's moments) as before the calibration
            log.info("fedhv: the FedHV run starts again from the initial arrays")
        cal = [h for h in self.history[first:] if h["phase"] == "calibration"]
        first = len(self.history)
        result = super().start(grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn)
        run = [h for h in self.history[first:] if h["phase"] == "train"]
        fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(Result)}
        return FedHVResult(**fields, task_weights={h["round"]: h["weights"] for h in run},
                           reports={h["round"]: h["report"] for h in run},
                           reference=None if self.reference is None else self.reference.tolist(),
                           calibration=calibration, calibration_reports={h["round"]: h["report"] for h in cal},
                           rejected=list(self.rejected), skipped=list(self.skipped))
