"""Losses of any sign: a task declares whether its loss is bounded below by 0.

A Gaussian negative log-likelihood (a regression head predicting a mean and a log-variance)
goes below 0 as soon as the predicted variance drops below ``1 / (2 pi e)``. Before, every
report below 0 was rejected as invalid, so FedHV skipped most rounds once its clients'
losses turned negative and the run still "completed" (``skipped_rounds`` only in
``summary.json``). Now a task's loss sign is declared (``Task(nonnegative=...)``; the
built-in losses are ``>= 0``, a loss of your own may have any sign), reports are validated per
task, and a run whose recent rounds are mostly skipped says so on its progress line and stops.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import fedhv
from fedhv.algorithms.validation import ClientReply, ReplySpec, reply_problem, report_outliers
from fedhv.api.tasks import TaskObjective
from fedhv.experiment.divergence import DivergenceError, check_calibration_reports
from fedhv.objectives import CLASSIFICATION
from fedhv.weighting import hv_weights, reference_from_losses


def gaussian_nll(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample Gaussian NLL (constant dropped) of ``o = [mean, log-variance]``; ``y[:, 0]`` the target."""
    mu, log_var = o[:, 0], o[:, 1]
    return 0.5 * (log_var + (y[:, 0] - mu) ** 2 * torch.exp(-log_var))


class MeanVarNet(nn.Module):
    """Shared encoder, one ``[mean, log-variance]`` head per task."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.enc = nn.Sequential(nn.Linear(4, 32), nn.Tanh())
        self.heads = nn.ModuleList([nn.Linear(32, 2), nn.Linear(32, 2)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.enc(x)
        return [head(h) for head in self.heads]


def nll_data(nonnegative: bool | None = None) -> fedhv.FederatedDataset:
    """Two regression tasks with noise 0.1 / 0.2 (best NLL about -1.8 / -1.1), 10 clients of 100."""
    g = torch.Generator().manual_seed(0)
    n = 1200
    x = torch.randn(n, 4, generator=g)
    pad = torch.zeros(n, 1)  # the target has one column per model output; the NLL reads the first
    y1 = torch.cat([2 * x[:, :1] + 0.1 * torch.randn(n, 1, generator=g), pad], 1)
    y2 = torch.cat([x[:, 1:2] - x[:, 2:3] + 0.2 * torch.randn(n, 1, generator=g), pad], 1)
    sign = {} if nonnegative is None else {"nonnegative": nonnegative}  # None: the default (an own loss: any sign)
    tasks = [fedhv.Task(name, "regression", 2, loss=gaussian_nll, **sign) for name in ("a", "b")]
    return fedhv.FederatedDataset.from_tensors(
        x[:1000], [y1[:1000], y2[:1000]], tasks, partition=[list(range(i * 100, i * 100 + 100)) for i in range(10)],
        test=(x[1000:], [y1[1000:], y2[1000:]]))


TRAIN = {"clients_per_round": 5, "local_steps": 10, "batch_size": 32, "lr_local": 0.05, "progress": False}


@pytest.fixture(scope="module")
def nll_runs() -> dict[str, fedhv.History]:
    data = nll_data()
    return {"uniform": fedhv.simulate(MeanVarNet(), data, fedhv.Uniform(), rounds=10, eval_every=10, **TRAIN),
            "fedhv": fedhv.simulate(MeanVarNet(), data, fedhv.FedHV(calibration_rounds=3), rounds=10, eval_every=10,
                                    **TRAIN)}


def test_gaussian_nll_fedhv_learns_like_uniform(nll_runs: dict[str, fedhv.History]) -> None:
    """Before: 8 of 10 FedHV rounds skipped (40 replies < 0 rejected), mean NLL stuck at +0.34."""
    uniform, hv = nll_runs["uniform"], nll_runs["fedhv"]
    nll_u, nll_hv = uniform.evaluations[-1]["mean_loss"], hv.evaluations[-1]["mean_loss"]
    skipped = sum(bool(r.get("skipped")) for r in hv.rounds)
    rejected = sum(r.get("rejected_clients", 0) for r in hv.rounds)
    assert skipped == rejected == 0, f"{skipped} rounds skipped, {rejected} replies rejected; NLL {nll_hv} vs {nll_u}"
    # measured: Uniform -0.89, FedHV -0.71 (before: FedHV +0.34, 8 of 10 rounds skipped)
    assert nll_u < -0.7 and nll_hv < -0.6 and abs(nll_hv - nll_u) < 0.3, (nll_u, nll_hv)
    reports = np.array([r["report"] for r in hv.rounds])
    assert (reports < 0).any(), reports  # negative reports accepted and used by the weighting
    # FedHV's weights are the inverse slacks of the accepted (negative) reports: recompute round by round
    ref = np.asarray(hv.reference)
    for prev, nxt in zip(hv.rounds, hv.rounds[1:]):
        slack = ref - np.asarray(prev["report"])
        np.testing.assert_allclose(nxt["weights"], (1 / slack) / (1 / slack).sum(), rtol=1e-9)


def test_task_loss_sign_declarations() -> None:
    from fedhv.objectives import nonnegative_losses

    own, builtin = fedhv.Task("nll", "regression", 2, loss=gaussian_nll), fedhv.Task("cls", size=3)
    assert TaskObjective((builtin, fedhv.Task("mse", "regression", 1), own)).nonnegative == (True, True, False)
    declared = fedhv.Task("own-ce", size=3, loss=nn.CrossEntropyLoss(), nonnegative=True)
    assert declared.loss_nonnegative and not fedhv.Task("x", "regression", 1, loss=gaussian_nll).loss_nonnegative
    assert nonnegative_losses(CLASSIFICATION, 3) == (True, True, True)  # the built-in benchmarks: CE / BCE
    with pytest.raises(fedhv.ConfigError, match=r"nonnegative = 'yes' must be True"):
        fedhv.Task("x", nonnegative="yes")  # type: ignore[arg-type]


def test_reports_are_validated_per_task() -> None:
    spec = ReplySpec(num_tasks=2, dim=0, report=True, nonnegative=(True, False))
    assert reply_problem(ClientReply(0, report=[0.3, -1.5]), spec) is None
    problem = reply_problem(ClientReply(0, report=[-0.2, 0.5]), spec)
    assert problem is not None and "task(s) [0]" in problem and "Task(..., nonnegative=False)" in problem
    assert reply_problem(ClientReply(0, report=[0.3, float("nan")]), spec) is not None  # finite always
    assert reply_problem(ClientReply(0, report=[0.3, -1.5]), ReplySpec(num_tasks=2, dim=0, report=True)) is not None


def test_report_outlier_ratio_only_for_nonnegative_tasks() -> None:
    """A ratio to the median has no meaning for a signed loss: median -0.5 would reject every report above -5."""
    replies = [ClientReply(k, report=[v, w]) for k, (v, w) in enumerate([(1.0, -0.5), (1.1, -0.6), (30.0, 0.2)])]
    spec = ReplySpec(num_tasks=2, dim=0, report=True, max_report_ratio=10.0, nonnegative=(True, False))
    assert report_outliers(replies, spec) == [None, None, report_outliers(replies, spec)[2]]
    assert "of task 0" in str(report_outliers(replies, spec)[2])
    signed_only = [ClientReply(k, report=[1.0, w]) for k, w in enumerate([-0.5, -0.6, 0.2])]
    assert report_outliers(signed_only, spec) == [None, None, None]


def test_declared_nonnegative_task_rejects_negative_reports_and_the_run_stops(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    """The NLL declared >= 0 by mistake: its negative reports are rejected; once most recent rounds are
    skipped the run stops with the fix in the message, and its finished rounds are kept."""
    from fedhv.experiment.loop import SkippedRoundsError

    data = nll_data(nonnegative=True)
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="fedhv"), pytest.raises(SkippedRoundsError) as err:
        fedhv.simulate(MeanVarNet(), data, fedhv.FedHV(reference=[4.0, 4.0]), rounds=12, eval_every=12, out=out,
                       **{**TRAIN, "progress": True})
    message = str(err.value)
    assert message.startswith("round ") and "rounds were skipped (no valid client reply)" in message, message
    assert "Task(..., nonnegative=False)" in message and "finished rounds are kept" in message, message
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert rounds and rounds[-1]["round"] == int(message.split(":")[0].split()[-1])  # every finished round kept
    skipped = [r["round"] for r in rounds if r.get("skipped")]
    window = rounds[-10:]
    assert sum(bool(r.get("skipped")) for r in window) > len(window) / 2 and len(rounds) >= 4
    assert (out / "checkpoint.pt").exists()
    # the progress line and the log say so
    first = skipped[0]
    assert f"round {first}: no valid client reply" in caplog.text and f"1 of {first} rounds skipped" in caplog.text
    assert f"skipped 1/{first} rounds" in capsys.readouterr().err


def test_hv_weights_for_negative_reports_match_numpy() -> None:
    z = np.array([-1.2, -0.3, 0.5])
    r = np.array(reference_from_losses([[-0.9, -0.1, 0.4], [-1.4, 0.05, 0.45]], margin=0.15))
    np.testing.assert_allclose(r, [-0.75, 0.2, 0.6])  # max + margin, negative values too
    inv = 1.0 / (r - z)
    np.testing.assert_allclose(hv_weights(z, r).weights, inv / inv.sum(), rtol=1e-12)
    # shifting every loss and the reference by a constant leaves the weights unchanged (the slack is r - F)
    np.testing.assert_allclose(hv_weights(z - 5.0, r - 5.0).weights, inv / inv.sum(), rtol=1e-12)


def test_calibration_growth_rule_only_for_nonnegative_tasks() -> None:
    """A learning NLL falls from -0.3 to -1.0: not 'grew past 10x round 1' (the ratio assumed F >= 0)."""
    reports = {"0": [[2.3, -0.3], [1.9, -0.7], [1.5, -1.0]]}
    check_calibration_reports(reports, [2.45, -0.15], "lower train.lr_local", nonnegative=(True, False))
    with pytest.raises(DivergenceError, match="grew past 10x"):
        check_calibration_reports({"0": [[0.2, -0.3], [2.5, -0.7]]}, [2.65, -0.15], "lower", nonnegative=(True, False))


@pytest.fixture
def flower_identity() -> Iterator[object]:
    pytest.importorskip("flwr")
    from loopback_grid import task_identity

    yield from task_identity()


def test_strategy_accepts_negative_reports_of_a_signed_task(flower_identity: object,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """FedHVStrategy(nonnegative=[False, True]): task 0's negative reports are aggregated (no ratio bound),
    task 1's negative report drops that reply; the weights are the inverse slacks of the accepted mean."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message

    from fedhv.flower.strategy import REPORT_KEY, FedHVStrategy, fedhv_reply
    from loopback_grid import LoopbackGrid

    reports = {1: [-1.1, 0.5], 2: [-1.2, 0.6], 3: [-0.2, 0.7], 9: [-1.0, -0.2]}  # node 9: task 1 below 0

    def client(node: int) -> Callable[[Message], Message]:
        def reply(msg: Message) -> Message:
            got = next(iter(msg.content.array_records.values()))
            arrays = ArrayRecord({k: Array(got[k].numpy() + np.float32(0.01 * node)) for k in got})
            return fedhv_reply(msg, arrays, reports[node], 10)
        return reply

    reference = [0.0, 1.0]
    strategy = FedHVStrategy(2, reference, nonnegative=[False, True], min_available_nodes=1, min_train_nodes=1)
    grid = LoopbackGrid({n: client(n) for n in reports})
    initial = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
    messages = list(strategy.configure_train(1, initial, ConfigRecord(), grid))
    _, metrics = strategy.aggregate_train(1, list(grid.send_and_receive(messages)))
    assert [r[2] for r in strategy.rejected] == [9] and "task(s) [1]" in strategy.rejected[0][3], strategy.rejected
    mean = np.mean([reports[n] for n in (1, 2, 3)], axis=0)  # a ratio to the median -1.1 would drop them all
    assert metrics is not None
    np.testing.assert_allclose(metrics[REPORT_KEY], mean, rtol=1e-12)
    inv = 1.0 / (np.asarray(reference) - mean)
    np.testing.assert_allclose(strategy.weights, inv / inv.sum(), rtol=1e-9)
    with pytest.raises(fedhv.ConfigError, match="nonnegative = "):
        FedHVStrategy(2, reference, nonnegative=[False])


def test_flower_backend_validates_reports_per_task(flower_identity: object) -> None:
    """fedhv's own ServerApp federation with ``nonnegative=(False, True)`` (a user benchmark's tasks): task 0's
    negative reports pass (no ratio bound), a negative task-1 report is rejected; a real Uniform stage."""
    from flwr.app import Message

    from fedhv.algorithms.uniform import UniformAlgorithm
    from fedhv.flower.federation import FlowerFederation, NodeMap
    from fedhv.flower.node import StageResult
    from fedhv.flower.protocol import result_content
    from loopback_grid import LoopbackGrid

    reports = {0: [-1.1, 0.5], 1: [-1.2, 0.6], 2: [-0.2, 0.7], 3: [-1.0, -0.2]}  # client 3: task 1 below 0

    def node(client: int) -> Callable[[Message], Message]:
        def reply(msg: Message) -> Message:
            return Message(result_content(StageResult(report=np.array(reports[client]),
                                                      deltas=np.full((1, 4), 0.1 * client))), reply_to=msg)
        return reply

    def stage(nonnegative: tuple[bool, ...] | None) -> tuple[FlowerFederation, list[float]]:
        grid = LoopbackGrid({10 + c: node(c) for c in reports})
        nodes = NodeMap({c: 10 + c for c in reports}, {c: {"samples": 10} for c in reports})  # type: ignore[arg-type]
        fed = FlowerFederation(grid, nodes, np.array(sorted(reports)), 0, 1, "train", "sha", 2,
                               nonnegative=nonnegative)
        algorithm = UniformAlgorithm(lr_global=1.0, report=True)
        return fed, algorithm.round(algorithm.init_state(2), torch.zeros(4, dtype=torch.float64), fed).log["report"]

    fed, report = stage((False, True))
    assert [c for c, _ in fed.rejected] == [3] and "task(s) [1]" in fed.rejected[0][1], fed.rejected
    np.testing.assert_allclose(report, np.mean([reports[c] for c in (0, 1, 2)], axis=0), rtol=1e-12)
    from fedhv.algorithms.validation import NoValidReplies

    with pytest.raises(NoValidReplies) as err:  # the built-in benchmarks: every task >= 0, every reply rejected
        stage(None)
    assert len(err.value.rejected) == 4 and all("negative losses" in r for _, r in err.value.rejected)
