"""fedhv's own Flower back-end (:class:`fedhv.flower.federation.FlowerFederation`) trusts no reply and
no node's self-reported fact: the reply fuzz of ``test_strategy_replies`` in the back-end's protocol
(real flwr Messages built with the nodes' own ``result_content``), run through a real stage
(``exchange`` -> ``_collect`` -> ``_validated``) and a real Uniform round, in training and in
calibration; the handshake refuses bad partition facts and sample counts naming the SuperNode."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from fedhv.algorithms.uniform import UniformAlgorithm
from fedhv.flower.federation import FlowerFederation, FlowerSetupError, NodeMap, handshake
from fedhv.flower.node import StageResult
from fedhv.flower.protocol import NODE, REPORT, UPDATE, result_content
from loopback_grid import LoopbackGrid
from loopback_grid import task_identity as _task_identity

M, D = 2, 5
GOOD = (0, 1, 2)  # clients; client c is served by SuperNode 10 + c
BAD = 3
SAMPLES = {0: 100, 1: 200, 2: 300, BAD: 400}
nan, inf = math.nan, math.inf


@pytest.fixture(autouse=True)
def identity() -> Iterator[object]:
    yield from _task_identity()


def node_of(client: int) -> int:
    return 10 + client


def report_of(client: int) -> np.ndarray:
    return np.array([1.0 + 0.1 * client, 0.5 + 0.05 * client])


def delta_of(client: int) -> np.ndarray:
    return np.linspace(-1, 1, D)[None, :] * (client + 1) / 10  # [T=1, d]


def honest(client: int) -> Callable[[Message], Message]:
    def reply(msg: Message) -> Message:
        return Message(result_content(StageResult(report=report_of(client), deltas=delta_of(client))), reply_to=msg)
    return reply


def tampered(report: object = "keep", deltas: object = "keep", array_name: str = "deltas",
             records: Callable[[RecordDict], None] | None = None) -> Callable[[Message], Message]:
    """Client ``BAD``'s reply with its report / update replaced (``None`` = left out)."""
    def reply(msg: Message) -> Message:
        content = RecordDict()
        losses = report_of(BAD).tolist() if isinstance(report, str) else report
        if losses is not None:
            content[REPORT] = MetricRecord({"losses": losses})
        update = delta_of(BAD) if isinstance(deltas, str) else deltas
        if update is not None:
            content[UPDATE] = ArrayRecord({array_name: Array(np.ascontiguousarray(update))})
        if records is not None:
            records(content)
        return Message(content, reply_to=msg)
    return reply


def with_nan(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a[0, 2] = nan
    return a


#: The back-end's reply fuzz: one bad client among three good ones.
FUZZ: dict[str, Callable[[Message], Message]] = {
    "report-nan": tampered(report=[nan, 1.0]),
    "report-inf": tampered(report=[inf, 1.0]),
    "report-minus-inf": tampered(report=[-inf, 1.0]),
    "report-negative": tampered(report=[-5.0, 1.0]),
    "report-huge-finite": tampered(report=[1e300, 0.5]),
    "report-outlier": tampered(report=[1e6, 0.1]),
    "report-minus-outlier": tampered(report=[-1e6, 2.0]),
    "report-short": tampered(report=[1.0]),
    "report-long": tampered(report=[1.0, 1.0, 1.0]),
    "report-scalar": tampered(report=1.0),
    "report-missing": tampered(report=None),
    "update-nan": tampered(deltas=with_nan(delta_of(BAD))),
    "update-inf": tampered(deltas=np.full((1, D), -inf)),
    "update-wrong-shape": tampered(deltas=np.zeros((1, D + 1))),
    "update-two-rows": tampered(deltas=np.zeros((2, D))),
    "update-wrong-name": tampered(array_name="delta"),
    "update-missing": tampered(deltas=None),
    "update-complex": tampered(deltas=np.zeros((1, D), dtype=np.complex128)),
    "flower-error": lambda msg: Message(Error(code=0, reason="client crashed"), reply_to=msg),
}


def federation(grid: LoopbackGrid, stream: str, aggregation: str, samples: dict[int, object] | None = None,
               clients: tuple[int, ...] = (*GOOD, BAD)) -> FlowerFederation:
    served = {c: {"samples": (samples or SAMPLES)[c]} for c in clients}
    nodes = NodeMap({c: node_of(c) for c in clients}, served)  # type: ignore[arg-type]
    return FlowerFederation(grid, nodes, np.array(clients), 0, 1, stream, "sha", M, aggregation=aggregation)


def expected(aggregation: str, good: tuple[int, ...] = GOOD) -> tuple[np.ndarray, np.ndarray]:
    """Model ``theta + mean(deltas)`` and mean report of the good clients (numpy)."""
    share = np.array([SAMPLES[c] for c in good], float) if aggregation == "samples" else np.ones(len(good))
    share /= share.sum()
    theta = np.linspace(0.1, 0.5, D) + sum(s * delta_of(c)[0] for s, c in zip(share, good))
    report = np.mean([report_of(c) for c in good], axis=0)  # Uniform's log: the plain mean of the reports
    return theta, report


def run_round(bad: Callable[[Message], Message] | None, stream: str, aggregation: str
              ) -> tuple[FlowerFederation, torch.Tensor, list[float]]:
    grid = LoopbackGrid({node_of(c): honest(c) for c in GOOD} | ({node_of(BAD): bad} if bad else {}))
    fed = federation(grid, stream, aggregation, clients=(*GOOD, BAD) if bad else GOOD)
    theta = torch.linspace(0.1, 0.5, D, dtype=torch.float64)
    algorithm = UniformAlgorithm(lr_global=1.0, report=True)
    result = algorithm.round(algorithm.init_state(M), theta, fed)  # a real stage: exchange, _collect, _validated
    return fed, result.theta, result.log["report"]


@pytest.mark.parametrize("aggregation", ["mean", "samples"])
@pytest.mark.parametrize("stream", ["train", "calibration"])
@pytest.mark.parametrize("case", sorted(FUZZ))
def test_a_bad_reply_is_rejected_and_the_round_equals_the_good_replies(case: str, stream: str, aggregation: str,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    fed, theta, report = run_round(FUZZ[case], stream, aggregation)
    want_theta, want_report = expected(aggregation)
    np.testing.assert_allclose(theta.numpy(), want_theta, rtol=1e-12)
    np.testing.assert_allclose(report, want_report, rtol=1e-12)
    assert [c for c, _ in fed.rejected] == [BAD], fed.rejected
    assert fed.clients.tolist() == list(GOOD)
    assert f"client {BAD} (SuperNode {node_of(BAD)}) rejected" in caplog.text


@pytest.mark.parametrize("aggregation", ["mean", "samples"])
def test_good_replies_alone_are_aggregated_as_before(aggregation: str) -> None:
    fed, theta, report = run_round(None, "train", aggregation)
    want_theta, want_report = expected(aggregation)
    np.testing.assert_allclose(theta.numpy(), want_theta, rtol=1e-12)
    np.testing.assert_allclose(report, want_report, rtol=1e-12)
    assert fed.rejected == []


def test_a_node_that_reported_no_samples_gets_no_weight_and_is_rejected() -> None:
    """``train.aggregation = "samples"``: a sampled client whose node said 0 samples (all 0 gave NaN before)."""
    grid = LoopbackGrid({node_of(c): honest(c) for c in (*GOOD, BAD)})
    fed = federation(grid, "train", "samples", samples={**SAMPLES, BAD: 0})
    theta = torch.linspace(0.1, 0.5, D, dtype=torch.float64)
    result = UniformAlgorithm(lr_global=1.0, report=True).round(UniformAlgorithm(1.0).init_state(M), theta, fed)
    np.testing.assert_allclose(result.theta.numpy(), expected("samples")[0], rtol=1e-12)
    assert [c for c, _ in fed.rejected] == [BAD] and "0 samples" in fed.rejected[0][1]


def hello_node(facts: dict[str, object] | None) -> Callable[[Message], Message]:
    def reply(msg: Message) -> Message:
        records = {} if facts is None else {NODE: ConfigRecord(facts)}  # type: ignore[arg-type]
        return Message(RecordDict(records), reply_to=msg)
    return reply


GOOD_FACTS = {"partition-id": 1, "num-partitions": 2, "samples": 300}


@pytest.mark.parametrize("facts, reason", [
    ({"samples": -199}, r"samples = -199 is outside \[0, "),
    ({"samples": "abc"}, r"samples = 'abc' is not an integer"),
    ({"samples": nan}, r"samples = nan is not an integer"),
    ({"samples": 1e18}, r"samples = 1e\+18 is outside"),
    ({"samples": 2**40}, r"samples = 1099511627776 is outside"),
    ({"samples": 2.5}, r"samples = 2.5 is not an integer"),
    ({"samples": True}, r"samples = True is not an integer"),
    ({"partition-id": "x"}, r"partition-id = 'x' is not an integer"),
    ({"partition-id": 7}, r"partition-id = 7 is outside \[0, 1\]"),
    ({"partition-id": -1}, r"partition-id = -1 is outside"),
    ({"num-partitions": 0}, r"num-partitions = 0 is outside"),
    (None, r"no 'fedhv.node' record"),
], ids=["samples-negative", "samples-text", "samples-nan", "samples-huge", "samples-huge-int", "samples-fraction",
        "samples-bool",
        "pid-text", "pid-range", "pid-negative", "partitions-zero", "no-record"])
def test_the_handshake_refuses_bad_self_reported_facts_naming_the_node(facts: dict[str, object] | None,
                                                                        reason: str) -> None:
    grid = LoopbackGrid({20: hello_node({"partition-id": 0, "num-partitions": 2, "samples": 100}),
                         21: hello_node(None if facts is None else {**GOOD_FACTS, **facts})})
    with pytest.raises(FlowerSetupError, match=rf"SuperNode 21 answered the handshake with {reason}"):
        handshake(grid, "config", 2, wait_s=5.0)


def test_the_handshake_keeps_good_facts() -> None:
    grid = LoopbackGrid({20: hello_node({"partition-id": 0, "num-partitions": 2, "samples": 100}),
                         21: hello_node(GOOD_FACTS)})
    nodes = handshake(grid, "config", 2, wait_s=5.0)
    assert nodes.nodes == {0: 20, 1: 21} and nodes.served[1] == {"samples": 300}


@pytest.mark.needs_data
@pytest.mark.parametrize("bad_report", [[1e6, 0.1], [-1e6, 2.0], [nan, 1.0]], ids=["outlier", "negative", "nan"])
def test_one_node_cannot_own_the_calibrated_reference(bad_report: list[float],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """``fedhv.experiment.calibration.calibrate`` over the Flower back-end (the ServerApp's path): honest
    nodes report ``[2.3, 2.2]``; one node's ``[1e6, 0.1]`` (accepted before: r ~ [1.7e5, ...]) and the
    invalid ones are rejected naming the client and its SuperNode; r = [2.45, 2.35] as without it."""
    from fedhv.config import load_config
    from fedhv.experiment.calibration import calibrate
    from fedhv.experiment.setup import federated_data
    from fedhv.flower.protocol import MODEL

    from conftest import SMALL

    cfg = load_config("multimnist", [*SMALL, "train.clients_per_round=6", "calibration.rounds=2"])
    honest_report = np.array([2.3, 2.2])

    def node(client: int) -> Callable[[Message], Message]:
        def reply(msg: Message) -> Message:
            d = int(np.prod(msg.content.array_records[MODEL]["theta"].shape))
            report = np.array(bad_report) if client == BAD else honest_report
            update = np.full((1, d), 1e-4 * (client + 1), dtype=np.float32)  # the float32 model's dtype
            return Message(result_content(StageResult(report=report, deltas=update)), reply_to=msg)
        return reply

    clients = range(cfg.partition.clients)
    grid = LoopbackGrid({node_of(c): node(c) for c in clients})
    nodes = NodeMap({c: node_of(c) for c in clients}, {c: {"samples": 64} for c in clients})

    def factory(sampled: np.ndarray, round_idx: int, seed: int, stream: str) -> FlowerFederation:
        return FlowerFederation(grid, nodes, sampled, round_idx, seed, stream, "sha", M)

    result = calibrate(cfg, federated_data(cfg), federation_factory=factory)
    np.testing.assert_allclose(result.reference, honest_report + 0.15, rtol=1e-6)  # float32 model: float32 reports
    assert caplog.text.count(f"client {BAD} (SuperNode {node_of(BAD)}) rejected") == 2  # both rounds


@pytest.mark.parametrize("case", ["nan", "sizes", "complex"])
def test_a_reply_with_bad_model_buffers_is_rejected(case: str) -> None:
    """BatchNorm statistics travel with the update: a reply whose buffers are non-finite, of other sizes
    or not real is rejected as a whole (before, its update was averaged in); the global buffers are
    the good replies' mean."""
    from e2e.flower.test_flower import BN_CONFIG
    from fedhv.config.loader import config_from_toml_text
    from fedhv.experiment.setup import federated_data, make_engine, new_model
    from fedhv.flower.protocol import MODEL

    cfg = config_from_toml_text(BN_CONFIG)
    data = federated_data(cfg)
    engine = make_engine(cfg, new_model(cfg, data, 1), data, 1, "train")
    sizes = [b.numel() for b in engine.buffers]
    start = [b.detach().clone() for b in engine.buffers]

    def buffers_of(client: int) -> list[np.ndarray]:
        out = [s.numpy() + (client + 1) for s in start]
        if client == BAD:
            if case == "nan":
                out[0] = out[0].copy()
                out[0].flat[0] = nan
            elif case == "sizes":
                out[0] = np.zeros(sizes[0] + 1)
            else:
                out[0] = out[0].astype(np.complex128)
        return out

    def node(client: int) -> Callable[[Message], Message]:
        def reply(msg: Message) -> Message:
            d = int(np.prod(msg.content.array_records[MODEL]["theta"].shape))
            result = StageResult(report=report_of(client), deltas=np.full((1, d), 1e-3 * (client + 1)),
                                 buffers=buffers_of(client))
            return Message(result_content(result), reply_to=msg)
        return reply

    grid = LoopbackGrid({node_of(c): node(c) for c in (*GOOD, BAD)})
    fed = federation(grid, "train", "mean")
    fed.global_buffers = engine
    theta = torch.zeros(sum(p.numel() for p in new_model(cfg, data, 1).parameters()), dtype=torch.float64)
    UniformAlgorithm(lr_global=1.0, report=True).round(UniformAlgorithm(1.0).init_state(M), theta, fed)
    assert [c for c, _ in fed.rejected] == [BAD] and "buffers" in fed.rejected[0][1]
    for j, b in enumerate(engine.buffers):
        want = np.mean([buffers_of(c)[j] for c in GOOD], axis=0)
        np.testing.assert_allclose(b.detach().numpy().astype(np.float64), want.reshape(b.shape), rtol=1e-12)


@pytest.mark.parametrize("update", [np.full((1, D), 1e300), np.full((1, D), 2**40, dtype=np.int64)],
                         ids=["float64-huge", "int64"])
def test_an_update_that_does_not_fit_the_models_dtype_is_rejected(update: np.ndarray) -> None:
    """A float32 run: a float64 update of 1e300 is finite where it is checked and infinite once cast to the
    model's float32 (issue 52); an update is checked against the broadcast model's dtype. Honest float32
    updates (and a float32 update to a float64 model, test above) are kept."""
    grid = LoopbackGrid({node_of(c): honest32(c) for c in GOOD} | {node_of(BAD): tampered(deltas=update)})
    fed = federation(grid, "train", "mean")
    theta = torch.linspace(0.1, 0.5, D, dtype=torch.float32)
    result = UniformAlgorithm(lr_global=1.0, report=True).round(UniformAlgorithm(1.0).init_state(M), theta, fed)
    assert torch.isfinite(result.theta).all()
    np.testing.assert_allclose(result.theta.numpy(), expected("mean")[0], rtol=1e-6)
    assert [c for c, _ in fed.rejected] == [BAD] and "float32" in fed.rejected[0][1], fed.rejected


def honest32(client: int) -> Callable[[Message], Message]:
    def reply(msg: Message) -> Message:
        return Message(result_content(StageResult(report=report_of(client),
                                                  deltas=delta_of(client).astype(np.float32))), reply_to=msg)
    return reply
