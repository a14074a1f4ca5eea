"""fedhv's Strategies as a Flower user expects them (real flwr Strategies, Messages and ``start()``
over the in-process :class:`loopback_grid.LoopbackGrid`): evaluation rounds, the ``Result``'s
task weights / reports / calibration, bit-identical runs whatever order replies arrive in,
every constructor option honoured, fedhv's lines on Flower's logger, and the task weighting
composed with FedAdam / FedYogi / FedProx and inside Flower's DP wrapper."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import (
    DifferentialPrivacyServerSideFixedClipping,
    FedAdam,
    FedAvg,
    FedMedian,
    FedProx,
    FedYogi,
)

import fedhv.flower.strategy as strategy_module
from fedhv.errors import ConfigError
from fedhv.flower.strategy import (
    REPORT_KEY,
    WEIGHTS_KEY,
    FedHVStrategy,
    UniformStrategy,
    fedhv_reply,
    task_weights,
)
from loopback_grid import LoopbackGrid
from loopback_grid import task_identity as _task_identity

M = 2
NODES = (3, 1, 4, 2, 5)
EXAMPLES = {1: 10, 2: 20, 3: 30, 4: 40, 5: 50, 9: 90}
REFERENCE = [4.0, 3.0]


@pytest.fixture(autouse=True)
def identity() -> Iterator[object]:
    yield from _task_identity()


def initial() -> ArrayRecord:
    rng = np.random.default_rng(0)
    return ArrayRecord({"w": Array(rng.normal(size=(4, 3)).astype(np.float32)),
                        "b": Array(rng.normal(size=3).astype(np.float32))})


def report_of(node: int, arrays: ArrayRecord) -> list[float]:
    """A report that depends on the received model, so weights and model interact over rounds."""
    s = float(np.abs(arrays["w"].numpy()).mean())
    return [1.0 + 0.1 * node + s, 0.5 + 0.3 * node * s]


def evaluate_metrics(node: int) -> dict[str, object]:
    return {"accuracy": 0.1 * node, "task-loss": [float(node), 2.0 * node], "num-examples": EXAMPLES[node]}


def evaluate_reply(msg: Message, node: int) -> Message:
    """A FedAvg-style evaluate reply (what ``fedhv_evaluate_reply`` builds, see the test of the helper)."""
    return Message(RecordDict({"metrics": MetricRecord(evaluate_metrics(node))}), reply_to=msg)


def client(node: int, seen: list[list[float]] | None = None) -> Callable[[Message], Message]:
    """A ClientApp: trains (a node-specific float32 step scaled by the weights) or evaluates."""
    def handle(msg: Message) -> Message:
        if msg.metadata.message_type == MessageType.EVALUATE:
            return evaluate_reply(msg, node)
        w = task_weights(msg, M)
        if seen is not None:
            seen.append(w)
        got = next(iter(msg.content.array_records.values()))
        rng = np.random.default_rng(node)
        out = {k: (got[k].numpy() + np.float32(w[0]) * rng.normal(scale=10.0 ** -node, size=got[k].numpy().shape)
                   .astype(np.float32)) for k in got}
        return fedhv_reply(msg, ArrayRecord({k: Array(v) for k, v in out.items()}), report_of(node, got),
                           EXAMPLES[node])
    return handle


class ShuffledGrid(LoopbackGrid):
    """Replies handed back in a seeded random order (arrival order on a real SuperLink varies)."""

    def __init__(self, nodes: dict[int, Callable[[Message], Message]], seed: int) -> None:
        super().__init__(nodes)
        self.rng = random.Random(seed)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        out = list(super().pull_messages(message_ids))
        self.rng.shuffle(out)
        return out


def grid(seed: int | None = None, **extra: Callable[[Message], Message]) -> LoopbackGrid:
    nodes: dict[int, Callable[[Message], Message]] = {n: client(n) for n in NODES}
    nodes.update({int(k[1:]): v for k, v in extra.items()})
    return LoopbackGrid(nodes) if seed is None else ShuffledGrid(nodes, seed)


def sampling(n: int = len(NODES)) -> dict[str, int]:
    return {"min_available_nodes": n, "min_train_nodes": n}


def hv(reference: np.ndarray, report: np.ndarray) -> np.ndarray:
    inv = 1.0 / np.maximum(np.asarray(reference) - np.asarray(report), 1e-6)
    return inv / inv.sum()


# ------------------------------------------------------------------------------ evaluation rounds
@pytest.mark.parametrize("with_bad", [False, True], ids=["good-replies", "one-bad-reply"])
def test_evaluation_rounds_work_and_are_weighted_by_num_examples(with_bad: bool,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """``fraction_evaluate=1.0``: every round's evaluate replies are aggregated (weighted by ``num-examples``,
    as FedAvg's), a bad evaluate reply is dropped and named; before, every reply failed on ``fedhv-unit``."""
    def bad(msg: Message) -> Message:
        if msg.metadata.message_type == MessageType.EVALUATE:
            return Message(RecordDict({"metrics": MetricRecord({"accuracy": float("nan"), "num-examples": 5})}),
                           reply_to=msg)
        return client(1)(msg)

    n = len(NODES) + with_bad
    strategy = FedHVStrategy(M, REFERENCE, fraction_evaluate=1.0, min_evaluate_nodes=n, **sampling(n))
    result = strategy.start(grid=grid(n9=bad) if with_bad else grid(), initial_arrays=initial(), num_rounds=2)
    share = np.array([EXAMPLES[n] for n in sorted(NODES)], float)
    share /= share.sum()
    want_acc = float(share @ np.array([0.1 * n for n in sorted(NODES)]))
    want_loss = (share @ np.array([[n, 2.0 * n] for n in sorted(NODES)], float)).tolist()
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2]
    for metrics in result.evaluate_metrics_clientapp.values():
        assert metrics["accuracy"] == pytest.approx(want_acc, rel=1e-12)
        np.testing.assert_allclose(metrics["task-loss"], want_loss, rtol=1e-12)
        assert "num-examples" not in metrics  # the weighting key is left out, as FedAvg does
    assert [(r[1], r[2]) for r in strategy.rejected] == [("evaluate", 9)] * 2 * with_bad
    assert ("round 1 (evaluate): reply of node 9 dropped" in caplog.text) == with_bad


def test_the_evaluate_reply_helper_builds_what_the_strategy_accepts() -> None:
    from fedhv.flower.strategy import fedhv_evaluate_reply
    from fedhv.flower.strategy_messages import evaluate_reply_problem

    msg = next(iter(FedHVStrategy(M, REFERENCE, fraction_evaluate=1.0, min_evaluate_nodes=1, **sampling(1))
                    .configure_evaluate(1, initial(), ConfigRecord(), LoopbackGrid({2: client(2)}))))
    reply = fedhv_evaluate_reply(msg, {"accuracy": 0.2, "task-loss": [2.0, 4.0]}, num_examples=20)
    assert dict(next(iter(reply.content.metric_records.values())).items()) == evaluate_metrics(2)
    assert evaluate_reply_problem(reply, M, 10**9) is None
    assert "list of 3 values" in evaluate_reply_problem(
        fedhv_evaluate_reply(msg, {"task-loss": [1.0, 2.0, 3.0]}, num_examples=20), M, 10**9)
    with pytest.raises(ConfigError, match="metric 'accuracy'"):
        fedhv_evaluate_reply(msg, {"accuracy": float("inf")}, num_examples=20)
    with pytest.raises(ConfigError, match="num_examples"):
        fedhv_evaluate_reply(msg, {"accuracy": 0.5}, num_examples=0)


def test_the_users_metric_aggregation_functions_are_used() -> None:
    """``train_metrics_aggr_fn`` / ``evaluate_metrics_aggr_fn`` are FedAvg options: they are called."""
    calls: list[str] = []

    def train_fn(contents: list[RecordDict], key: str) -> MetricRecord:
        calls.append(f"train:{key}:{len(contents)}")
        return MetricRecord({"mine": 1.0})

    def eval_fn(contents: list[RecordDict], key: str) -> MetricRecord:
        calls.append(f"evaluate:{key}:{len(contents)}")
        return MetricRecord({"mine": 2.0})

    strategy = FedHVStrategy(M, REFERENCE, fraction_evaluate=1.0, min_evaluate_nodes=len(NODES),
                             train_metrics_aggr_fn=train_fn, evaluate_metrics_aggr_fn=eval_fn, **sampling())
    result = strategy.start(grid=grid(), initial_arrays=initial(), num_rounds=1)
    assert calls == ["train:fedhv-unit:5", "evaluate:num-examples:5"]
    assert result.train_metrics_clientapp[1]["mine"] == 1.0 and REPORT_KEY in result.train_metrics_clientapp[1]
    assert result.evaluate_metrics_clientapp[1]["mine"] == 2.0


# ------------------------------------------------------------------------------ the Result
def test_the_result_carries_weights_reports_and_the_calibration() -> None:
    strategy = FedHVStrategy(M, calibration_rounds=2, **sampling())
    result = strategy.start(grid=grid(), initial_arrays=initial(), num_rounds=3)
    cal = [h for h in strategy.history if h["phase"] == "calibration"]
    run = [h for h in strategy.history if h["phase"] == "train"]
    assert len(cal) == 2 and len(run) == 3
    assert result.calibration is not None and sorted(result.calibration.train_metrics_clientapp) == [1, 2]
    assert result.calibration_reports == {h["round"]: h["report"] for h in cal}
    np.testing.assert_allclose(result.reference, np.max([h["report"] for h in cal], axis=0) + 0.15, rtol=1e-12)
    assert result.task_weights == {h["round"]: h["weights"] for h in run}
    assert result.reports == {h["round"]: h["report"] for h in run}
    assert result.task_weights[1] == [0.5, 0.5]  # the run's first round: uniform, then the FedHV rule
    for r in (2, 3):
        np.testing.assert_allclose(result.task_weights[r], hv(np.asarray(result.reference), result.reports[r - 1]),
                                   rtol=1e-12)
        metrics = result.train_metrics_clientapp[r]  # Flower's own field carries them too
        assert metrics[WEIGHTS_KEY] == result.task_weights[r] and metrics[REPORT_KEY] == result.reports[r]
        assert metrics["fedhv-calibration"] == 0 and "num-examples" not in metrics
    assert result.calibration.train_metrics_clientapp[1]["fedhv-calibration"] == 1


# ------------------------------------------------------------------------------ a fixed order
@pytest.mark.parametrize("kind", ["fedhv", "uniform", "fedadam"])
def test_identical_runs_are_bit_identical_whatever_the_arrival_order(kind: str) -> None:
    """Replies are aggregated in node-id order: two runs whose replies arrive in different orders give
    the same bits (float32 arrays; before, they differed in the last bits)."""
    def run(seed: int) -> tuple[dict[str, np.ndarray], list[list[float]]]:
        if kind == "fedhv":
            strategy = FedHVStrategy(M, calibration_rounds=1, **sampling())
        elif kind == "uniform":
            strategy = UniformStrategy(M, **sampling())
        else:
            strategy = strategy_module.fedhv_strategy(FedAdam, M, calibration_rounds=1, **sampling())
        result = strategy.start(grid=grid(seed), initial_arrays=initial(), num_rounds=3)
        return {k: v.numpy() for k, v in result.arrays.items()}, [h["report"] for h in strategy.history]

    (a, ra), (b, rb), (c, rc) = run(1), run(2), run(3)
    for name in a:
        assert a[name].tobytes() == b[name].tobytes() == c[name].tobytes(), name
    assert ra == rb == rc


# ------------------------------------------------------------------------------ options honoured
def test_configrecord_key_is_honoured() -> None:
    """``configrecord_key="cfg"``: the weights travel in ``"cfg"`` and the clients find them (before, every
    client failed: ``task_weights`` read ``"config"``)."""
    seen: list[list[float]] = []
    nodes = {n: client(n, seen) for n in NODES}
    strategy = FedHVStrategy(M, REFERENCE, configrecord_key="cfg", arrayrecord_key="model", **sampling())
    grid_ = LoopbackGrid(nodes)
    result = strategy.start(grid=grid_, initial_arrays=initial(), num_rounds=2)
    assert strategy.rejected == [] and len(seen) == 2 * len(NODES)
    assert set(grid_.pushed[0].content.config_records) == {"cfg"}
    assert set(grid_.pushed[0].content.array_records) == {"model"}
    np.testing.assert_allclose(seen[-1], hv(np.asarray(REFERENCE), result.reports[1]), rtol=1e-12)


def test_fedhvs_lines_reach_flowers_logger() -> None:
    """fedhv logs on a child of Flower's ``flwr`` logger: a ServerApp's Flower log shows its rounds."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep(logging.INFO)
    logging.getLogger("flwr").addHandler(handler)
    try:
        FedHVStrategy(M, calibration_rounds=1, **sampling()).start(grid=grid(), initial_arrays=initial(),
                                                                   num_rounds=1)
    finally:
        logging.getLogger("flwr").removeHandler(handler)
    assert any(line.startswith("fedhv: reference r = ") for line in lines), lines
    assert any(line.startswith("fedhv: round 1 (train): report ") for line in lines), lines


# ------------------------------------------------------------------------------ composition
def test_fedadam_with_fedhv_weighting_applies_adam_to_the_validated_mean() -> None:
    """Round 1: the task weights move by the FedHV rule and the model is FedAdam's step from the plain mean
    of the valid replies (a bad reply dropped), written out here in numpy."""
    bad = client(9)

    def nan_reply(msg: Message) -> Message:
        out = bad(msg)
        next(iter(out.content.array_records.values()))["b"] = Array(np.full(3, np.nan, np.float32))
        return out

    eta, tau, b1, b2 = 0.05, 1e-3, 0.9, 0.99
    strategy = strategy_module.fedhv_strategy(FedAdam, M, REFERENCE, eta=eta, tau=tau, **sampling(len(NODES) + 1))
    assert type(strategy).__name__ == "FedHVFedAdam"
    g = grid(n9=nan_reply)
    start = {k: v.numpy().astype(np.float64) for k, v in initial().items()}
    arrays, _ = strategy.aggregate_train(1, g.send_and_receive(strategy.configure_train(
        1, initial(), ConfigRecord(), g)))
    assert [r[2] for r in strategy.rejected] == [9]
    replies = [client(n)(m) for n, m in ((n, _msg_to(g, n)) for n in sorted(NODES))]
    mean = {k: np.mean([next(iter(r.content.array_records.values()))[k].numpy().astype(np.float64)
                        for r in replies], axis=0) for k in start}
    for k, x in start.items():
        delta = mean[k] - x
        m, v = (1 - b1) * delta, (1 - b2) * delta**2
        eta_norm = eta * np.sqrt(1 - b2**2) / (1 - b1**2)
        np.testing.assert_allclose(arrays[k].numpy(), x + eta_norm * m / (np.sqrt(v) + tau), rtol=1e-4, atol=1e-6)
        assert not np.allclose(arrays[k].numpy(), mean[k], atol=1e-3)  # the server optimiser did step
    report = np.mean([report_of(n, initial()) for n in NODES], axis=0)
    np.testing.assert_allclose(strategy.weights, hv(np.asarray(REFERENCE), report), rtol=1e-12)
    assert not np.allclose(strategy.weights, 0.5)


def _msg_to(g: LoopbackGrid, node: int) -> Message:
    return next(m for m in g.pushed if m.metadata.dst_node_id == node)


@pytest.mark.parametrize("base, options", [(FedAdam, {"eta": 0.05}), (FedYogi, {"eta": 0.05}),
                                           (FedProx, {"proximal_mu": 0.3})], ids=["fedadam", "fedyogi", "fedprox"])
def test_server_optimisers_calibrate_adapt_and_restart_like_a_given_reference(base: type, options: dict) -> None:
    """``start()`` on FedAdam / FedYogi / FedProx with FedHV weighting: the reference is calibrated, the
    weights adapt (not 0.5 / 0.5) and the run after the calibration equals, bit for bit, a run given that
    reference from the start (the optimiser's moments are restored); FedProx's ``proximal-mu`` is sent."""
    cal = strategy_module.fedhv_strategy(base, M, calibration_rounds=2, **options, **sampling())
    g = grid()
    res = cal.start(grid=g, initial_arrays=initial(), num_rounds=3)
    assert cal.reference is not None and not np.allclose(res.task_weights[3], 0.5)
    given = strategy_module.fedhv_strategy(base, M, res.reference, **options, **sampling())
    res2 = given.start(grid=grid(), initial_arrays=initial(), num_rounds=3)
    assert res.task_weights == res2.task_weights
    for k in res.arrays:
        assert res.arrays[k].numpy().tobytes() == res2.arrays[k].numpy().tobytes(), k
    if base is FedProx:
        assert all(m.content["config"]["proximal-mu"] == 0.3 for m in g.pushed)
    else:  # the optimiser moved the model away from the plain FedHV mean
        plain = FedHVStrategy(M, res.reference, **sampling()).start(grid=grid(), initial_arrays=initial(),
                                                                   num_rounds=3)
        assert not np.allclose(plain.arrays["w"].numpy(), res.arrays["w"].numpy(), atol=1e-4)


def test_inside_flowers_dp_wrapper_fedhv_still_calibrates_and_adapts() -> None:
    """``DifferentialPrivacyServerSideFixedClipping(FedHVStrategy(...))`` drives the rounds with its own
    ``start()``: rounds 1-2 calibrate, FedHV weights follow (before: 0.5 / 0.5 every round), and the DP
    wrapper clips the updates."""
    inner = FedHVStrategy(M, calibration_rounds=2, **sampling())
    clip = 1e-3
    dp = DifferentialPrivacyServerSideFixedClipping(inner, noise_multiplier=0.0, clipping_norm=clip,
                                                    num_sampled_clients=len(NODES))
    result = dp.start(grid=grid(), initial_arrays=initial(), num_rounds=4)
    assert [h["phase"] for h in inner.history] == ["calibration", "calibration", "train", "train"]
    assert inner.reference is not None
    weights = {r: m[WEIGHTS_KEY] for r, m in result.train_metrics_clientapp.items()}
    assert weights[1] == weights[2] == weights[3] == [0.5, 0.5]
    np.testing.assert_allclose(weights[4], hv(inner.reference, inner.history[2]["report"]), rtol=1e-12)
    assert not np.allclose(weights[4], 0.5)
    step = np.sqrt(sum(float(((result.arrays[k].numpy().astype(np.float64) - v.numpy()) ** 2).sum())
                       for k, v in initial().items()))
    assert step <= 4 * clip * (1 + 1e-4)  # each round's mean update is clipped to the norm


@pytest.mark.parametrize("base", [FedMedian, DifferentialPrivacyServerSideFixedClipping, int])
def test_a_strategy_that_bypasses_the_weighting_is_refused(base: type) -> None:
    with pytest.raises(ConfigError, match="base = "):
        strategy_module.fedhv_strategy(base, M, REFERENCE)


@pytest.mark.parametrize("base", [FedAvg, FedAdam], ids=["fedavg", "fedadam"])
def test_uniform_weighting_composes_too(base: type) -> None:
    strategy = strategy_module.fedhv_strategy(base, M, weighting="uniform", **sampling())
    result = strategy.start(grid=grid(), initial_arrays=initial(), num_rounds=2)
    assert result.task_weights == {1: [0.5, 0.5], 2: [0.5, 0.5]} and result.calibration is None
