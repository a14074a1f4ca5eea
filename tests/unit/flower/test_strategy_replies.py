"""FedHVStrategy / UniformStrategy trust no reply: a fuzz of bad replies (real flwr Messages, as a
ClientApp would send them) is dropped, logged with the node id and counted; the model, the report
and the task weights equal those of the good replies alone (computed here with numpy); a round
without a valid reply is skipped; a calibration reply cannot own the reference."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from fedhv.flower.strategy import (
    REPORT_KEY,
    UNIT_KEY,
    FedHVStrategy,
    UniformStrategy,
    fedhv_reply,
    task_weights,
)
from loopback_grid import LoopbackGrid
from loopback_grid import task_identity as _task_identity

M = 2
GOOD = (1, 2, 3)  # node ids of the honest clients
BAD = 9
REFERENCE = [3.0, 2.0]
EXAMPLES = {1: 10, 2: 20, 3: 30, BAD: 40}


@pytest.fixture(autouse=True)
def identity() -> Iterator[object]:
    yield from _task_identity()


def initial() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.arange(6, dtype=np.float32).reshape(3, 2) / 10),
                        "b": Array(np.array([0.5, -0.5], dtype=np.float32))})


def report_of(node: int) -> list[float]:
    return [1.0 + 0.1 * node, 0.5 + 0.05 * node]


def trained(msg: Message, node: int) -> dict[str, np.ndarray]:
    """What honest client ``node`` sends back: the received arrays moved by a node-specific step."""
    got = next(iter(msg.content.array_records.values()))
    return {name: got[name].numpy() + np.float32(0.01 * node) for name in got}


def honest(node: int) -> Callable[[Message], Message]:
    def reply(msg: Message) -> Message:
        task_weights(msg, M)  # the ClientApp reads the weights as documented
        arrays = ArrayRecord({k: Array(v) for k, v in trained(msg, node).items()})
        return fedhv_reply(msg, arrays, report_of(node), EXAMPLES[node])
    return reply


def raw_reply(msg: Message, arrays: dict[str, np.ndarray], metrics: dict[str, object]) -> Message:
    return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                               "metrics": MetricRecord(metrics)}), reply_to=msg)


def good_metrics() -> dict[str, object]:
    return {REPORT_KEY: report_of(BAD), UNIT_KEY: 1.0, "num-examples": EXAMPLES[BAD]}


def bad_metrics(**change: object) -> Callable[[Message], Message]:
    def reply(msg: Message) -> Message:
        metrics = {**good_metrics(), **change}
        return raw_reply(msg, trained(msg, BAD), {k: v for k, v in metrics.items() if v is not None})
    return reply


def bad_arrays(edit: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]) -> Callable[[Message], Message]:
    def reply(msg: Message) -> Message:
        return raw_reply(msg, edit(trained(msg, BAD)), good_metrics())
    return reply


def nan_at(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    a["w"][0, 0] = np.nan
    return a


def error_reply(msg: Message) -> Message:
    return Message(Error(code=0, reason="client crashed"), reply_to=msg)


def two_metric_records(msg: Message) -> Message:
    out = raw_reply(msg, trained(msg, BAD), good_metrics())
    out.content["more"] = MetricRecord({"x": 1.0})
    return out


nan, inf = math.nan, math.inf
#: The reply fuzz: every case is one client's reply among three good ones.
FUZZ: dict[str, Callable[[Message], Message]] = {
    "report-nan": bad_metrics(**{REPORT_KEY: [nan, 1.0]}),
    "report-inf": bad_metrics(**{REPORT_KEY: [inf, 1.0]}),
    "report-minus-inf": bad_metrics(**{REPORT_KEY: [-inf, 1.0]}),
    "report-negative": bad_metrics(**{REPORT_KEY: [-5.0, 1.0]}),
    "report-huge-finite": bad_metrics(**{REPORT_KEY: [1e300, 0.5]}),
    "report-outlier": bad_metrics(**{REPORT_KEY: [1e6, 0.1]}),
    "report-short": bad_metrics(**{REPORT_KEY: [1.0]}),
    "report-long": bad_metrics(**{REPORT_KEY: [1.0, 1.0, 1.0]}),
    "report-scalar": bad_metrics(**{REPORT_KEY: 1.0}),
    "report-missing": bad_metrics(**{REPORT_KEY: None}),
    "extra-metric-key": bad_metrics(accuracy=0.5),
    "update-nan": bad_arrays(nan_at),
    "update-inf": bad_arrays(lambda a: {**a, "b": np.array([np.inf, 0], dtype=np.float32)}),
    "update-wrong-shape": bad_arrays(lambda a: {**a, "w": np.zeros((2, 3), dtype=np.float32)}),
    "update-wrong-name": bad_arrays(lambda a: {"w2": a["w"], "b": a["b"]}),
    "update-missing-array": bad_arrays(lambda a: {"w": a["w"]}),
    "update-extra-array": bad_arrays(lambda a: {**a, "c": np.zeros(2, dtype=np.float32)}),
    "update-complex": bad_arrays(lambda a: {**a, "b": a["b"].astype(np.complex64)}),
    "update-bool": bad_arrays(lambda a: {**a, "b": a["b"] > 0}),
    # finite in float64, infinite in the clients' float32 model (issue 52: it destroyed a real Baseline run)
    "update-float64-huge": bad_arrays(lambda a: {**a, "w": np.full((3, 2), 1e300)}),
    "update-float64": bad_arrays(lambda a: {k: v.astype(np.float64) for k, v in a.items()}),
    "update-int64-for-float32": bad_arrays(lambda a: {**a, "b": np.array([2**40, 0], dtype=np.int64)}),
    "unit-huge": bad_metrics(**{UNIT_KEY: 1e9}),
    "unit-negative": bad_metrics(**{UNIT_KEY: -1.0}),
    "unit-nan": bad_metrics(**{UNIT_KEY: nan}),
    "unit-zero": bad_metrics(**{UNIT_KEY: 0.0}),
    "examples-zero": bad_metrics(**{"num-examples": 0}),
    "examples-negative": bad_metrics(**{"num-examples": -1}),
    "examples-nan": bad_metrics(**{"num-examples": nan}),
    "examples-huge": bad_metrics(**{"num-examples": 1e18}),
    "examples-fraction": bad_metrics(**{"num-examples": 2.5}),
    "flower-error": error_reply,
    "two-metric-records": two_metric_records,
}


def round_of(strategy: FedHVStrategy, bad: Callable[[Message], Message] | None, round_: int = 1
             ) -> tuple[ArrayRecord | None, MetricRecord | None, list[Message]]:
    """One real ``configure_train`` -> ClientApp replies -> ``aggregate_train`` round."""
    nodes = {n: honest(n) for n in GOOD} | ({BAD: bad} if bad is not None else {})
    grid = LoopbackGrid(nodes)
    messages = list(strategy.configure_train(round_, initial(), ConfigRecord(), grid))
    replies = list(grid.send_and_receive(messages))
    assert len(replies) == len(nodes)
    arrays, metrics = strategy.aggregate_train(round_, replies)
    return arrays, metrics, messages


def expected(weighted: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The good replies' mean arrays and report (numpy, float64), plain or by num-examples."""
    share = np.array([EXAMPLES[n] for n in GOOD], float) if weighted else np.ones(len(GOOD))
    share /= share.sum()
    start = {k: v.numpy().astype(np.float64) for k, v in initial().items()}
    arrays = {k: sum(s * (v + 0.01 * n) for s, n in zip(share, GOOD)) for k, v in start.items()}
    report = sum(s * np.array(report_of(n)) for s, n in zip(share, GOOD))
    return arrays, report


def hv(report: np.ndarray) -> np.ndarray:
    inv = 1.0 / np.maximum(np.array(REFERENCE) - report, 1e-6)
    return inv / inv.sum()


def make(kind: str, weighted: bool) -> FedHVStrategy:
    key = {"weighted_by_key": "num-examples"} if weighted else {}
    common = {"min_available_nodes": 1, "min_train_nodes": 1, **key}
    if kind == "fedhv":
        return FedHVStrategy(M, REFERENCE, **common)
    return UniformStrategy(M, **common)


@pytest.mark.parametrize("weighted", [False, True], ids=["plain-mean", "num-examples"])
@pytest.mark.parametrize("kind", ["fedhv", "uniform"])
@pytest.mark.parametrize("case", sorted(FUZZ))
def test_a_bad_reply_is_dropped_and_the_round_equals_the_good_replies(case: str, kind: str, weighted: bool,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    strategy = make(kind, weighted)
    arrays, metrics, _ = round_of(strategy, FUZZ[case])  # never raises
    want_arrays, want_report = expected(weighted)
    assert arrays is not None and metrics is not None
    assert set(arrays.keys()) == set(want_arrays)
    for name, value in want_arrays.items():
        np.testing.assert_allclose(arrays[name].numpy(), value, rtol=1e-6, atol=1e-7, err_msg=name)
    np.testing.assert_allclose(metrics[REPORT_KEY], want_report, rtol=1e-12)
    want_weights = hv(want_report) if kind == "fedhv" else np.full(M, 1 / M)
    np.testing.assert_allclose(strategy.weights, want_weights, rtol=1e-9)
    assert [(r[0], r[2]) for r in strategy.rejected] == [(1, BAD)], strategy.rejected  # dropped and counted
    assert strategy.history[-1]["replies"] == len(GOOD)
    assert f"reply of node {BAD} dropped" in caplog.text


def test_good_replies_alone_are_aggregated_as_before() -> None:
    """No bad reply: nothing dropped; the plain mean and the weights of the three replies."""
    strategy = make("fedhv", False)
    arrays, metrics, _ = round_of(strategy, None)
    want_arrays, want_report = expected(False)
    np.testing.assert_allclose(arrays["w"].numpy(), want_arrays["w"], rtol=1e-6)
    np.testing.assert_allclose(metrics[REPORT_KEY], want_report, rtol=1e-12)
    np.testing.assert_allclose(strategy.weights, hv(want_report), rtol=1e-9)
    assert strategy.rejected == [] and strategy.skipped == []


@pytest.mark.parametrize("kind", ["fedhv", "uniform"])
@pytest.mark.parametrize("case", ["unit-zero", "report-nan", "update-wrong-name", "examples-nan"])
def test_a_round_without_a_valid_reply_is_skipped(kind: str, case: str, caplog: pytest.LogCaptureFixture) -> None:
    """Every reply bad (all ``fedhv-unit`` 0 gave a raw ZeroDivisionError before): no model, the weights stay."""
    strategy = make(kind, False)
    before = strategy.weights.copy()
    grid = LoopbackGrid({n: FUZZ[case] for n in (4, 5)})
    messages = list(strategy.configure_train(1, initial(), ConfigRecord(), grid))
    arrays, metrics = strategy.aggregate_train(1, grid.send_and_receive(messages))
    assert arrays is None and metrics is None
    np.testing.assert_array_equal(strategy.weights, before)
    assert strategy.skipped == [(1, "train")] and len(strategy.rejected) == 2
    assert "no valid reply" in caplog.text and "round skipped" in caplog.text


def test_the_aggregation_weight_is_the_servers() -> None:
    """A client stating ``fedhv-unit`` = 1 but many examples has the plain mean's share, not more."""
    strategy = make("uniform", False)
    bad = bad_metrics(**{"num-examples": 10**8})  # valid, but not the weight of the plain mean
    arrays, _, _ = round_of(strategy, bad)
    start = initial()["b"].numpy().astype(np.float64)
    want = np.mean([start + 0.01 * n for n in (*GOOD, BAD)], axis=0)
    np.testing.assert_allclose(arrays["b"].numpy(), want, rtol=1e-6)
    assert strategy.rejected == []


@pytest.mark.parametrize("report", [[1e6, 0.1], [-1e6, 2.0], [nan, 1.0], [1e300, 0.5]],
                         ids=["finite-outlier", "negative", "nan", "huge"])
def test_one_calibration_reply_cannot_own_the_reference(report: list[float],
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """``start()``'s calibration: the reference is that of the good replies (``max_t mean + margin``), the bad
    node is named; before, ``[1e6, 0.1]`` set r ~ [333334, ...] and ``[nan, 1]`` aborted naming no node."""
    strategy = FedHVStrategy(M, calibration_rounds=2, margin=0.15, min_available_nodes=1, min_train_nodes=1)
    grid = LoopbackGrid({n: honest(n) for n in GOOD} | {BAD: bad_metrics(**{REPORT_KEY: report})})
    strategy.start(grid=grid, initial_arrays=initial(), num_rounds=1)
    _, good_report = expected(False)
    np.testing.assert_allclose(strategy.reference, good_report + 0.15, rtol=1e-12)
    calibration = [r for r in strategy.rejected if r[1] == "calibration"]
    assert [r[2] for r in calibration] == [BAD, BAD]
    assert f"reply of node {BAD} dropped" in caplog.text
    # the FedHV round that followed used the calibrated reference on the good replies only
    np.testing.assert_allclose(strategy.weights, hv_with(strategy.reference, good_report), rtol=1e-9)


def hv_with(reference: np.ndarray, report: np.ndarray) -> np.ndarray:
    inv = 1.0 / np.maximum(reference - report, 1e-6)
    return inv / inv.sum()


def test_a_calibration_without_a_valid_reply_names_a_node() -> None:
    from fedhv.errors import ConfigError

    strategy = FedHVStrategy(M, calibration_rounds=2, min_available_nodes=1, min_train_nodes=1)
    grid = LoopbackGrid({BAD: bad_metrics(**{REPORT_KEY: [nan, 1.0]})})
    with pytest.raises(ConfigError, match=rf"no valid reply in 2 rounds \(2 replies dropped, e\.g\. node {BAD}: "
                                          r"report has non-finite values"):
        strategy.start(grid=grid, initial_arrays=initial(), num_rounds=1)


@pytest.mark.parametrize("kwargs, match", [
    ({"max_report_ratio": 0.5}, "max_report_ratio"),
    ({"max_report_ratio": math.inf}, "max_report_ratio"),
    ({"max_num_examples": 0}, "max_num_examples"),
    ({"weighted_by_key": "accuracy"}, "weighted_by_key"),
    ({"metric_keys": ["num-examples"]}, "metric_keys"),
    ({"reference": [nan, 1.0]}, "reference"),
    ({"rho_clip": math.inf}, "rho_clip"),
    ({"margin": nan}, "margin"),
])
def test_bad_strategy_options_are_one_line_errors(kwargs: dict[str, object], match: str) -> None:
    from fedhv.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        FedHVStrategy(M, **kwargs)  # type: ignore[arg-type]


def test_declared_metric_keys_are_averaged_and_checked() -> None:
    strategy = FedHVStrategy(M, REFERENCE, metric_keys=["accuracy"], min_available_nodes=1, min_train_nodes=1)

    def with_accuracy(node: int, value: float) -> Callable[[Message], Message]:
        def reply(msg: Message) -> Message:
            return raw_reply(msg, trained(msg, node), {REPORT_KEY: report_of(node), "accuracy": value})
        return reply

    grid = LoopbackGrid({1: with_accuracy(1, 0.5), 2: with_accuracy(2, 0.7), BAD: with_accuracy(BAD, nan)})
    messages = list(strategy.configure_train(1, initial(), ConfigRecord(), grid))
    _, metrics = strategy.aggregate_train(1, grid.send_and_receive(messages))
    assert metrics is not None and metrics["accuracy"] == pytest.approx(0.6)
    assert [r[2] for r in strategy.rejected] == [BAD] and "accuracy" in strategy.rejected[0][3]


def test_an_update_is_checked_against_the_broadcast_dtype_and_a_narrower_one_is_kept() -> None:
    """A reply's dtype must fit the broadcast's (issue 52): float32 replies to a float64 broadcast and an
    integer buffer's int64 reply to the float64 mean it was broadcast as are kept; a float64 reply to a
    float32 broadcast is dropped, naming both dtypes."""
    strategy = make("uniform", False)
    start = ArrayRecord({"w": Array(np.ones((3, 2))), "n": Array(np.array([3.0])), "b": Array(np.zeros(2, np.float32))})

    def node(k: int, wide: bool = False) -> Callable[[Message], Message]:
        def reply(msg: Message) -> Message:
            arrays = {"w": np.full((3, 2), 0.5 * k, dtype=np.float32), "n": np.array([4], dtype=np.int64),
                      "b": np.full(2, 1e300 if wide else 0.1, dtype=np.float64 if wide else np.float32)}
            return raw_reply(msg, arrays, {REPORT_KEY: report_of(k), UNIT_KEY: 1.0})
        return reply

    grid = LoopbackGrid({1: node(1), 2: node(2), BAD: node(BAD, wide=True)})
    messages = list(strategy.configure_train(1, start, ConfigRecord(), grid))
    arrays, _ = strategy.aggregate_train(1, grid.send_and_receive(messages))
    assert arrays is not None
    np.testing.assert_allclose(arrays["w"].numpy(), 0.75)
    np.testing.assert_allclose(arrays["b"].numpy(), 0.1, rtol=1e-6)
    assert [r[2] for r in strategy.rejected] == [BAD]
    assert "float64" in strategy.rejected[0][3] and "float32" in strategy.rejected[0][3]
