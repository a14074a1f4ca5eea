"""Diagnostics (issue 31): the theory quantities against hand-computed values and independent
oracles, the per-client evaluation against a plain loop, and the run integration (report error
vanishes under full participation, Uniform measures against FedHV's reference, exact resume)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhv.config import load_config
from fedhv.diagnostics import (
    client_means,
    draw_probe,
    fairness_summary,
    jain_index,
    loghv_quantities,
    population_objective,
    slack_bound,
    task_gradients,
)
from fedhv.errors import ConfigError
from fedhv.experiment import loop, resume_experiment, run_experiment
from fedhv.experiment.setup import new_model
from fedhv.weighting import hv_weights

from helpers import small_config, small_data

DIAG = ["diagnostics.enabled=true", "diagnostics.probe_samples=96", "eval.test_period=2", "rounds=6"]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_loghv_quantities_golden_values() -> None:
    # G = diag(4, 1), s = r - f = (1, 0.5): u = (1, 2), ||grad Phi||^2 = 4 + 4 = 8;
    # min_l 4 l^2 + (1 - l)^2 at l = 0.2: 0.8; Phi = log 2; R_max(r = (2, 1)) = 2, bound = (1/2) / 2.
    q = loghv_quantities(np.diag([4.0, 1.0]), np.array([1.0, 0.5]), np.array([2.0, 1.0]))
    assert q["grad_phi_sq"] == pytest.approx(8.0)
    assert q["pareto_residual"] == pytest.approx(math.sqrt(0.8))
    assert q["pareto_lambda"] == pytest.approx([0.2, 0.8])
    assert q["pareto_bound"] == pytest.approx(math.sqrt(8.0) / 3.0)
    assert q["phi"] == pytest.approx(math.log(2.0))
    assert q["slack_bound"] == pytest.approx(0.25)
    assert q["min_slack"] == pytest.approx(0.5)
    out = loghv_quantities(np.eye(2), np.array([1.0, 1.2]), np.array([2.0, 1.0]))  # outside the reference box
    assert out["phi"] is None and out["grad_phi_sq"] is None and out["slack_bound"] is None
    assert out["min_slack"] == pytest.approx(-0.2)


def test_loghv_bounds_hold_on_random_problems() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        m = int(rng.integers(2, 6))
        v = rng.normal(size=(m, 7))
        r = rng.uniform(0.5, 3.0, m)
        f = r * rng.uniform(0.01, 0.99, m)  # 0 < s <= r: non-negative losses inside the box
        q = loghv_quantities(v @ v.T, f, r)
        assert q["pareto_residual"] <= q["pareto_bound"] + 1e-9  # the inverse-slack weights are feasible
        assert q["slack_bound"] <= q["min_slack"] + 1e-12  # §4.3 with B = Phi(theta)
        lam = np.asarray(q["pareto_lambda"])
        assert lam.min() >= -1e-12 and lam.sum() == pytest.approx(1.0)
        w = hv_weights(f, r).weights  # ||sum w_i g_i|| = ||grad Phi|| / c
        assert np.linalg.norm(w @ v) == pytest.approx(q["pareto_bound"], rel=1e-9)
        assert slack_bound(q["phi"], r) == pytest.approx(np.prod(r - f) / max(np.prod(np.delete(r, i))
                                                                              for i in range(m)))


def test_fairness_summary_and_jain_golden_values() -> None:
    s = fairness_summary(np.array([10.0, 20.0, 30.0, 40.0]), higher_is_better=True)
    assert s == pytest.approx({"mean": 25.0, "worst": 10.0, "p10": 13.0, "std": math.sqrt(125.0), "best": 40.0,
                               "jain": 100.0**2 / (4 * 3000.0)})
    low = fairness_summary(np.array([1.0, 2.0, 3.0, np.nan]), higher_is_better=False)  # nan: an empty client
    assert low["worst"] == 3.0 and low["best"] == 1.0 and low["p10"] == pytest.approx(2.8)
    assert jain_index(np.array([5.0, 5.0, 5.0])) == pytest.approx(1.0)
    assert jain_index(np.array([1.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)
    assert jain_index(np.array([-1.0, 2.0])) is None


@pytest.mark.needs_data
def test_client_means_equal_a_plain_loop_over_clients() -> None:
    cfg = small_config()
    data = small_data(cfg)
    model = new_model(cfg, data, 3).eval()
    loss, score, sizes = client_means(model, data, batch_size=50)
    with torch.no_grad():
        for k in range(data.num_clients):
            rows = data.parts[k]
            out = model(data.train_x[rows])
            per, correct = data.objective.per_sample(out, data.train_y[rows])
            assert loss[k] == pytest.approx(per.double().mean(0).numpy(), rel=1e-5)
            assert score[k] == pytest.approx(100 * correct.double().mean(0).numpy(), rel=1e-9)
    assert (sizes == 64).all()
    assert population_objective(loss) == pytest.approx(loss.mean(0))


def test_probe_draws_clients_uniformly_not_samples() -> None:
    from fedhv.api.dataset import RaggedParts

    # client 0 holds one sample, client 1 holds 99: an equal-weight mixture draws sample 0 half the time
    parts = RaggedParts([torch.tensor([0]), torch.arange(1, 100), torch.zeros(0, dtype=torch.int64)])
    rows = draw_probe(parts, 20000, seed=1)
    assert abs((rows == 0).mean() - 0.5) < 0.02
    assert set(np.unique(rows[rows > 0])) <= set(range(1, 100)) and len(np.unique(rows)) > 90
    assert np.array_equal(rows, draw_probe(parts, 20000, seed=1))
    assert not np.array_equal(rows, draw_probe(parts, 20000, seed=2))


@pytest.mark.needs_data
def test_task_gradients_equal_autograd_of_the_probe_mean() -> None:
    cfg = small_config()
    data = small_data(cfg)
    model = new_model(cfg, data, 1)
    rows = draw_probe(data.parts, 300, seed=0)  # > one chunk of 256
    grads, probe_loss = task_gradients(model, data.train_x, data.train_y, data.objective, rows)
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    per, _ = data.objective.per_sample(model(data.train_x[torch.as_tensor(rows)]), data.train_y[torch.as_tensor(rows)])
    for i in range(data.num_tasks):
        g = torch.autograd.grad(per[:, i].mean(), params, retain_graph=True)
        flat = torch.cat([x.reshape(-1) for x in g]).double()
        assert torch.allclose(grads[i], flat, rtol=1e-4, atol=1e-7)
        assert probe_loss[i] == pytest.approx(float(per[:, i].detach().double().mean()), rel=1e-5)
    assert grads.shape == (data.num_tasks, sum(p.numel() for p in params))


@pytest.mark.needs_data
def test_full_participation_reports_equal_the_population_objective(tmp_path: Path) -> None:
    """M = N and whole-dataset reports: FedHV's averaged report is f(theta^t) itself (A.7's error is
    only the client sampling and the report budget), and the stale-weight error is ||W(F^{t-1}) - W(F^t)||_1."""
    cfg = small_config(*DIAG, "train.clients_per_round=6")
    run_experiment(cfg, tmp_path / "run", progress=False)
    rounds, metrics = _lines(tmp_path / "run" / "rounds.jsonl"), _lines(tmp_path / "run" / "metrics.jsonl")
    ref = np.asarray(json.loads((tmp_path / "run" / "summary.json").read_text())["reference"])
    checked = 0
    for entry in metrics:
        nxt = next((r for r in rounds if r["round"] == entry["round"] + 1), None)
        if nxt is None:
            continue
        d = nxt["diagnostics"]
        assert d["at_round"] == entry["round"]
        assert d["report_error"] < 1e-5
        f = np.asarray(entry["diagnostics"]["objective"])
        assert np.asarray(nxt["report"]) == pytest.approx(f, abs=1e-5)
        ideal = hv_weights(f, ref).weights
        assert d["stale_weight_error"] == pytest.approx(np.abs(np.asarray(nxt["weights"]) - ideal).sum(), abs=1e-9)
        checked += 1
    assert checked >= 2
    assert all(r.get("diagnostics") is None for r in rounds if r["round"] - 1 not in {m["round"] for m in metrics})


@pytest.mark.needs_data
def test_partial_participation_has_a_report_error_and_uniform_uses_fedhvs_reference(tmp_path: Path) -> None:
    fedhv = run_experiment(small_config(*DIAG), tmp_path / "fedhv", progress=False)
    uniform = run_experiment(small_config(*DIAG, "method='uniform'"), tmp_path / "uniform", progress=False)
    assert uniform["diagnostics"]["reference"] == pytest.approx(fedhv["reference"])  # the same r for both
    assert "reference" not in uniform and (tmp_path / "uniform" / "calibration.json").exists()
    errors = [r["diagnostics"]["report_error"] for r in _lines(tmp_path / "fedhv" / "rounds.jsonl")
              if r.get("diagnostics")]
    assert errors and min(errors) > 1e-4  # 4 of 6 clients report
    uni = [r["diagnostics"] for r in _lines(tmp_path / "uniform" / "rounds.jsonl") if r.get("diagnostics")]
    assert uni and all(d["report_error"] is None and d["stale_weight_error"] >= 0 for d in uni)
    for entry in _lines(tmp_path / "uniform" / "metrics.jsonl"):
        d = entry["diagnostics"]
        assert d["pareto_residual"] <= d["pareto_bound"] + 1e-12
        assert d["slack_bound"] <= d["min_slack"]
        assert len(d["clients"]["score"]) == 2 and d["clients"]["score"][0]["worst"] <= entry["task_acc"][0] + 50


@pytest.mark.needs_data
def test_diagnostics_period_and_bad_values(tmp_path: Path) -> None:
    run_experiment(small_config(*DIAG, "diagnostics.period=2", "eval.test_period=1", "rounds=5"),
                   tmp_path / "run", progress=False)
    have = [("diagnostics" in m) for m in _lines(tmp_path / "run" / "metrics.jsonl")]
    assert have == [True, False, True, False, True]
    run_experiment(small_config(*DIAG, "diagnostics.period=2", "eval.test_period=1", "rounds=4"),
                   tmp_path / "even", progress=False)
    have = [("diagnostics" in m) for m in _lines(tmp_path / "even" / "metrics.jsonl")]
    assert have == [True, False, True, True]  # the last evaluation always has them
    for key, value in (("probe_samples", "0"), ("period", "0"), ("probe_seed", "-1")):
        with pytest.raises(ConfigError, match=f"diagnostics.{key} = "):
            load_config("multimnist", [f"diagnostics.{key}={value}"])


def test_flower_refuses_diagnostics(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="diagnostics.enabled = true needs every client's data"):
        run_experiment(small_config(*DIAG), tmp_path / "run", progress=False,
                       federation_factory=lambda *a: None)
    assert not any((tmp_path / "run").glob("*.json*"))


@pytest.mark.needs_data
def test_resume_after_an_evaluation_gives_the_uninterrupted_diagnostics(tmp_path: Path, monkeypatch) -> None:
    cfg = small_config(*DIAG, "rounds=5")
    run_experiment(cfg, tmp_path / "full", progress=False)

    class _Stop(Exception):
        pass

    original = loop.SimFederation.exchange

    def failing(self, theta, request):  # type: ignore[no-untyped-def]
        if self.round_idx == 2:  # round 3 starts from theta^2, evaluated with diagnostics
            raise _Stop
        return original(self, theta, request)

    monkeypatch.setattr(loop.SimFederation, "exchange", failing)
    with pytest.raises(_Stop):
        run_experiment(cfg, tmp_path / "part", progress=False)
    monkeypatch.setattr(loop.SimFederation, "exchange", original)
    resume_experiment(tmp_path / "part", progress=False)

    def diag(path: Path, name: str) -> list:
        out = []
        for rec in _lines(path / name):
            d = dict(rec.get("diagnostics") or {})
            d.pop("seconds", None)
            out.append((rec["round"], d))
        return out

    for name in ("rounds.jsonl", "metrics.jsonl"):
        assert diag(tmp_path / "part", name) == diag(tmp_path / "full", name)
    assert any(d for _, d in diag(tmp_path / "part", "rounds.jsonl"))


def test_simulate_diagnostics_on_a_users_mixed_problem_with_batchnorm_and_unequal_clients() -> None:
    """A problem that is none of the paper's: a BatchNorm MLP, a 3-class and a regression task, clients
    of 3 to 40 samples. The per-client fairness of the regression task (lower is better) and the
    objective are checked against a plain PyTorch loop over the clients with History.model."""
    import fedhv
    from unit.api.test_own_problem import BNNet

    g = torch.Generator().manual_seed(5)
    x = torch.randn(260, 6, generator=g) * torch.arange(1, 7) + torch.arange(6)
    label, value = (x[:, 0] > 0.5).long() + (x[:, 1] > 2).long(), (2 * x[:, 2] + x[:, 3]).unsqueeze(1)
    sizes = [3, 5, 8, 12, 20, 40, 40, 40, 32]
    starts = np.cumsum([0, *sizes])
    parts = [list(range(int(starts[k]), int(starts[k + 1]))) for k in range(len(sizes))]
    tasks = [fedhv.Task("cls", size=3), fedhv.Task("reg", "regression", 1)]
    data = fedhv.FederatedDataset.from_tensors(x[:200], [label[:200], value[:200]], tasks, partition=parts,
                                               test=(x[200:], [label[200:], value[200:]]))
    torch.manual_seed(0)
    hist = fedhv.simulate(BNNet(), data, fedhv.Uniform(), rounds=4, clients_per_round=4, local_steps=3, batch_size=8,
                          lr_local=0.05, progress=False, diagnostics={"probe_samples": 64})
    d = hist.evaluations[-1]["diagnostics"]
    model = hist.model.eval()
    with torch.no_grad():
        mse = [float(((model(data.x[torch.tensor(p)])[1] - data.y[torch.tensor(p), 1:2]) ** 2).mean()) for p in parts]
        out = [model(data.x[torch.tensor(p)])[0].argmax(1) for p in parts]
    acc = [100 * float((o == data.y[torch.tensor(p), 0]).double().mean()) for o, p in zip(out, parts)]
    assert d["clients"]["score"][1]["worst"] == pytest.approx(max(mse), rel=1e-4)  # an MSE: the largest is worst
    assert d["clients"]["score"][1]["best"] == pytest.approx(min(mse), rel=1e-4)
    assert d["clients"]["score"][0]["worst"] == pytest.approx(min(acc))
    assert d["objective"][1] == pytest.approx(np.mean(mse), rel=1e-4)  # equal client weights, not sample weights
    assert d["pareto_residual"] <= d["pareto_bound"] + 1e-12
    with pytest.raises(ConfigError, match="unknown option"):
        fedhv.simulate(BNNet(), data, fedhv.Uniform(), rounds=1, progress=False, diagnostics={"probes": 3})
