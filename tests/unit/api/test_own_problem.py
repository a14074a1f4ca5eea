"""A user's own model and tasks (issue 27): BatchNorm buffers, mixed task kinds, heads.

Each test fails on the code before issue 27: BatchNorm statistics never left their initial
values, a regression task's "accuracy" (-100 MSE) entered MeanAcc / WorstAcc, HV used a fixed
offset, and ``heads=`` naming a missing attribute ran silently.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedhv

from conftest import REPO


class BNNet(nn.Module):
    """BatchNorm on the raw inputs (so its statistics have a data-only oracle), then an MLP."""

    def __init__(self, d: int = 6, heads: tuple[int, ...] = (3, 1)) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(d)
        self.encoder = nn.Sequential(nn.Linear(d, 16), nn.BatchNorm1d(16), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(16, h) for h in heads])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(self.norm(x))
        return [head(h) for head in self.heads]


def _data(n: int = 240, clients: int = 6, dtype: torch.dtype = torch.float32, parts: list | None = None,
          test: bool = True) -> fedhv.FederatedDataset:
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(n, 6, generator=g) * torch.arange(1, 7) + torch.arange(6)).to(dtype)
    label = (x[:, 0] > 0.5).long() + (x[:, 1] > 2).long()
    value = (2 * x[:, 2] + x[:, 3]).unsqueeze(1)
    tasks = [fedhv.Task("cls", size=3), fedhv.Task("reg", "regression", 1)]
    split = n * 3 // 4
    partition = parts if parts is not None else [list(range(c, split, clients)) for c in range(clients)]
    return fedhv.FederatedDataset.from_tensors(
        x[:split], [label[:split], value[:split]], tasks, partition=partition,
        test=(x[split:], [label[split:], value[split:]]) if test else None)


def _run(data: fedhv.FederatedDataset, engine: str = "batched", dtype: torch.dtype = torch.float32, **kw):
    torch.manual_seed(0)
    model = BNNet().to(dtype)
    opts = {"rounds": 3, "clients_per_round": 3, "local_steps": 3, "batch_size": 8, "lr_local": 0.05, "engine": engine,
                "progress": False}
    opts.update(kw)
    method = opts.pop("method", fedhv.Uniform())
    return fedhv.simulate(model, data, method, **opts)


def test_batchnorm_statistics_are_federated_as_the_mean_of_the_clients_batches() -> None:
    """Oracle from the data alone: every client holds exactly one batch and takes one step, so its
    batch is all of its samples and BatchNorm's first update is 0.9 * init + 0.1 * batch statistics;
    the global statistics are the mean over all clients."""
    data = _data(n=96, clients=6)  # 72 training rows: 12 per client
    hist = _run(data, rounds=1, clients_per_round=6, local_steps=1, batch_size=12)
    norm = hist.model.norm
    means = torch.stack([data.x[data.parts[c]].mean(0) for c in range(6)])
    vars_ = torch.stack([data.x[data.parts[c]].var(0, unbiased=True) for c in range(6)])
    torch.testing.assert_close(norm.running_mean, (0.1 * means).mean(0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(norm.running_var, (0.9 + 0.1 * vars_).mean(0), atol=1e-4, rtol=1e-5)
    assert int(norm.num_batches_tracked) == 1


@pytest.mark.parametrize("engine", ["batched", "sequential"])
def test_batchnorm_model_evaluation_matches_plain_pytorch(engine: str) -> None:
    data = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the sequential engine
        hist = _run(data, engine=engine)
    assert hist.engine == engine
    model = hist.model
    assert not model.training  # returned in eval mode
    assert float(model.norm.running_mean.abs().sum()) > 0.1  # the statistics moved off their initial zeros
    xt, (lt, vt) = data.test[0], (data.test[1][:, 0].long(), data.test[1][:, 1:])
    with torch.no_grad():
        o_cls, o_reg = model(xt)
    acc = 100 * float((o_cls.argmax(1) == lt).float().mean())
    mse = float(F.mse_loss(o_reg, vt))
    last = hist.evaluations[-1]
    assert last["task_acc"][0] == pytest.approx(acc, abs=1e-4)  # float32 mean vs fedhv's float64 one
    assert last["task_score"][1] == pytest.approx(mse, rel=1e-5)
    assert last["task_loss"][0] == pytest.approx(float(F.cross_entropy(o_cls, lt)), rel=1e-5)


def test_batchnorm_batched_engine_equals_sequential_in_float64() -> None:
    data = _data(dtype=torch.float64)
    a = _run(data, "batched", torch.float64, momentum=0.9)
    b = _run(data, "sequential", torch.float64, momentum=0.9)
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        torch.testing.assert_close(x, y, atol=1e-12, rtol=1e-12, msg=name)


def test_mixed_kinds_metrics_use_accuracy_tasks_only_and_configured_hv() -> None:
    data = _data()
    hist = _run(data, hv_reference=[3.0, 50.0])
    last = hist.evaluations[-1]
    acc, mse = last["task_score"]
    assert last["task_acc"] == [acc, None]
    assert last["mean_acc"] == last["worst_acc"] == acc  # the regression task is not an accuracy
    l1, l2 = last["task_loss"]
    assert mse == pytest.approx(l2)  # the default regression score is the MSE
    assert mse > 3  # the paper's offset of 3 would give HV = 0 here
    assert last["hv"] == pytest.approx(max(3.0 - l1, 0) * (50.0 - l2))
    assert hist.task_metrics[1] == {"task": "reg", "metric": "mse", "higher_is_better": False, "is_accuracy": False}
    assert hist.hv_reference == [3.0, 50.0]


def test_regression_only_problem_has_no_mean_acc() -> None:
    x = torch.randn(200, 6)
    data = fedhv.FederatedDataset.from_tensors(x[:160], [x[:160, :1]], [fedhv.Task("r", "regression", 1)],
                                               clients=4, test=(x[160:], [x[160:, :1]]))
    model = nn.Sequential(nn.Linear(6, 1))
    hist = fedhv.simulate(model, data, fedhv.Uniform(), rounds=1, clients_per_round=2, batch_size=8,
                          local_steps=2, progress=False)
    assert hist.evaluations[-1]["mean_acc"] is None and hist.evaluations[-1]["task_acc"] == [None]


def test_heads_named_but_missing_is_refused_with_the_models_attributes() -> None:
    data = _data()
    with pytest.raises(fedhv.ConfigError, match=r"heads = 'decoders'.*\['norm', 'encoder', 'heads'\]"):
        fedhv.simulate(BNNet(), data, fedhv.FSMGDA(), rounds=1, heads="decoders", progress=False)

    class NoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(6, 4)

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            h = self.body(x)
            return [h[:, :3], h[:, 3:]]

    with pytest.raises(fedhv.ConfigError, match="FSMGDA, FedCMOO"):
        fedhv.simulate(NoHeads(), data, fedhv.FedCMOO(), rounds=1, progress=False)
    # FedHV and Uniform do not split the model: no heads needed
    assert fedhv.simulate(NoHeads(), data, fedhv.Uniform(), rounds=1, clients_per_round=2, batch_size=8,
                          lr_local=0.001, progress=False).rounds


def test_pytorch_convention_losses_work_and_reduced_losses_are_refused() -> None:
    data = _data()
    ce = fedhv.Task("cls", size=3, loss=nn.CrossEntropyLoss())  # mean-reduced module: used with reduction="none"
    reg = fedhv.Task("reg", "regression", 1, loss=nn.MSELoss())
    d2 = fedhv.FederatedDataset(( ce, reg), data.x, data.y, data.parts, data.test)
    a = _run(d2, rounds=2)
    b = _run(data, rounds=2)  # the built-in defaults compute the same losses
    torch.testing.assert_close(a.evaluations[-1]["task_loss"], b.evaluations[-1]["task_loss"], rtol=1e-5, atol=1e-6)
    fn = fedhv.Task("cls", size=3, loss=lambda o, y: F.cross_entropy(o, y))  # returns the batch mean
    d3 = fedhv.FederatedDataset((fn, reg), data.x, data.y, data.parts, data.test)
    with pytest.raises(fedhv.ConfigError, match="Task 'cls': its loss returned shape \\(\\) for 8 samples"):
        _run(d3, rounds=1)


def test_scale_free_slack_golden_values_and_calibrated_range() -> None:
    from fedhv.experiment.calibration import CalibrationResult
    from fedhv.methods import calibrated_range
    from fedhv.weighting import hv_weights

    # s = (r - z) / d = [2 / 4, 1 / 1] = [0.5, 1] -> w = [2, 1] / 3; the paper's map: s = [2, 1] -> [1, 2] / 3
    assert hv_weights([1.0, 2.0], [3.0, 3.0], 1e-6, [4.0, 1.0]).weights.tolist() == pytest.approx([2 / 3, 1 / 3])
    assert hv_weights([1.0, 2.0], [3.0, 3.0], 1e-6).weights.tolist() == pytest.approx([1 / 3, 2 / 3])
    cal = CalibrationResult([2.45, 0.85], [2.3, 0.7], 0.15, [0, 1],
                            {"0": [[2.3, 0.7], [1.1, 0.5]], "1": [[2.2, 0.69], [0.9, 0.6]]})
    assert calibrated_range(cal) == pytest.approx([2.45 - 0.9, 0.85 - 0.5])
    with pytest.raises(fedhv.ConfigError, match="calibrated-range\" needs a calibration"):
        fedhv.FedHV(reference=[1.0, 1.0], slack_scale="calibrated-range").algorithm([1.0, 1.0], None)


def test_scale_free_variant_changes_the_weights_and_the_default_does_not() -> None:
    data = _data()
    paper = _run(data, method=fedhv.FedHV(calibration_rounds=2), rounds=2)
    free = _run(data, method=fedhv.FedHV(calibration_rounds=2, slack_scale="calibrated-range"), rounds=2)
    assert paper.reference == free.reference
    from fedhv.methods import calibrated_range
    from fedhv.weighting import hv_weights

    d = calibrated_range(free.calibration)
    report = free.rounds[0]["report"]
    expected = hv_weights(report, free.reference, 1e-6, d).weights.tolist()
    assert free.rounds[1]["weights"] == pytest.approx(expected, rel=1e-9)
    assert paper.rounds[1]["weights"] == pytest.approx(hv_weights(paper.rounds[0]["report"], paper.reference).weights
                                                       .tolist(), rel=1e-9)
    assert free.rounds[1]["weights"] != pytest.approx(paper.rounds[1]["weights"], rel=1e-3)


def test_table_8_names_the_hv_offsets_the_runs_used(tmp_path) -> None:
    import subprocess
    import sys

    data = _data()
    _run(data, hv_reference=[3.0, 50.0], out=tmp_path / "runs" / "r", rounds=1, name="mixed")
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "fedhv.cli", "table", str(tmp_path / "runs"), "--table", "8"],
                          capture_output=True, text=True, timeout=60, check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert "r_eval = [3, 50]" in done.stdout and "eval.hv_reference" in done.stdout


def test_secure_aggregation_refuses_a_model_with_buffers_before_round_one(tmp_path) -> None:
    """SecAgg+ returns only the mean of the masked updates, not the clients' buffers: a BatchNorm model
    is refused, not run with stale statistics (the factory is never called). Plain Flower federates
    buffers (tests/e2e/flower/test_flower.py::test_flower_federates_batchnorm_buffers_like_the_simulator)."""
    import dataclasses

    from fedhv.api.simulate import _base_config, _benchmark, _train_keys
    from fedhv.experiment.problem import Problem
    from fedhv.experiment.runner import run_experiment

    data = _data()
    model = BNNet()
    train = _train_keys(2, 8, 0.05, 0.0, "sgd", None, None, None, "mean")
    cfg = fedhv.Uniform().configure(_base_config(model, data, "bn", 2, 2, train, 0, "sequential", "fp32", None, 1,
                                                 3.0))
    cfg = dataclasses.replace(cfg, flower=dataclasses.replace(cfg.flower, secure_aggregation=True))
    called = []
    problem = Problem.given(cfg.data.benchmark, _benchmark(model, data, "heads", "cpu"))
    with pytest.raises(fedhv.ConfigError, match="secure aggregation returns only the mean"):
        run_experiment(cfg, tmp_path / "r", progress=False, federation_factory=lambda *a: called.append(a),
                       problem=problem)
    assert not called and not (tmp_path / "r" / "rounds.jsonl").read_text().strip()


class TokenBag(nn.Module):
    """Token ids into an embedding, heads in an nn.ModuleDict keyed by task name, dict outputs."""

    def __init__(self, keys: tuple[str, str] = ("cls", "avg")) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.heads = nn.ModuleDict({keys[0]: nn.Linear(8, 3), keys[1]: nn.Linear(8, 1)})

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.emb(x).mean(1)
        return {task: m(h) for task, m in zip(("cls", "avg"), self.heads.values())}


def _tokens() -> fedhv.FederatedDataset:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 20, (200, 6), generator=g)
    tasks = [fedhv.Task("cls", size=3, loss=nn.CrossEntropyLoss()), fedhv.Task("avg", "regression", 1)]
    return fedhv.FederatedDataset.from_tensors(tokens, [tokens[:, 0] % 3, tokens.float().mean(1, keepdim=True) / 20],
                                               tasks, partition="ids", ids=tokens[:, 1] % 7)


def test_token_ids_and_module_dict_heads_split_by_task_name(caplog) -> None:
    from fedhv.api.simulate import _base_config, _benchmark, _train_keys
    from fedhv.experiment.method_setup import RunContext
    from fedhv.experiment.problem import Problem

    data = _tokens()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hist = fedhv.simulate(TokenBag(), data, fedhv.FSMGDA(), rounds=2, clients_per_round=3, batch_size=8,
                              local_steps=2, progress=False)
    assert hist.engine == "batched" and "cannot estimate" not in caplog.text  # the memory probe takes int inputs
    train = _train_keys(2, 8, 0.1, 0.0, "sgd", None, None, None, "mean")
    model = TokenBag()
    cfg = fedhv.FSMGDA().configure(_base_config(model, data, "t", 1, 3, train, 0, "batched", "fp32", None, 1, 3.0))
    problem = Problem.given(cfg.data.benchmark, _benchmark(model, data, "heads", "cpu"))
    slices = RunContext(cfg, problem.data(cfg), problem=problem).task_slices()
    assert [len(h) for h in slices.heads] == [8 * 3 + 3, 8 + 1]  # each task's own head, by name
    with pytest.raises(fedhv.ConfigError, match=r"nn.ModuleDict keyed \['a', 'b'\]; key it by the task names"):
        fedhv.simulate(TokenBag(("a", "b")), data, fedhv.FSMGDA(), rounds=1, progress=False)
