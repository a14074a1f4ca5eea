"""The loss-only methods (issue 40, part 1): linear scalarisation, inverse loss, RLW, DWA, FAMO, STCH.

Each weight rule against its formula written out here in numpy; the shared one-stage round; the state
through the checkpoint's plain form; both engines in float64; an interrupted run resumed equals the
uninterrupted one bit for bit; configuration keys validated before round 1. Issue 50 (methods at their
authors' scale): STCH's weights are the authors' gradient, unnormalised, and vary with the reports at
``mu = 1``; RLW's clients draw new weights at every local step from the run's keyed streams.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedhv.algorithms import DWA, FAMO, RLW, STCH, InverseLoss, Linear, LossOnlyState, Replies, ScaledLossOnlyState
from fedhv.algorithms.dwa import DynamicWeightAverage
from fedhv.algorithms.inverse_loss import InverseLossRule
from fedhv.algorithms.linear import FixedWeights
from fedhv.algorithms.loss_only import LossOnlyAlgorithm
from fedhv.algorithms.plain import StateError
from fedhv.algorithms.rlw import RandomWeights, RLWConfig, StepRandomWeights
from fedhv.config import load_config
from fedhv.errors import ConfigError
from fedhv.rng import derive_seed

from helpers import ScriptedFederation, assert_resume_is_bit_identical, small_config

REPORTS = np.array([[2.3, 0.7, 1.1], [2.0, 0.72, 0.9], [1.5, 0.74, 0.95], [1.2, 0.5, 1.0], [1.1, 0.45, 0.4]])


def _run_rule(rule: Any, reports: np.ndarray = REPORTS) -> list[np.ndarray]:
    """``w^1 .. w^T`` the rule gives after each report (``w^0`` from ``first``)."""
    w, memory = rule.first(reports.shape[1])
    out = [w]
    for t, report in enumerate(reports):
        w, memory = rule.next(report, memory, t)
        out.append(w)
    return out


def test_linear_scalarisation_keeps_the_normalised_preference() -> None:
    for w in _run_rule(FixedWeights(np.array([2.0, 1.0, 1.0]) / 4.0)):
        np.testing.assert_array_equal(w, [0.5, 0.25, 0.25])


def test_inverse_loss_golden_values() -> None:
    got = _run_rule(InverseLossRule(0.5))
    np.testing.assert_array_equal(got[0], [1 / 3] * 3)
    for t, report in enumerate(REPORTS):
        inv = [1.0 / max(v, 0.5) for v in report]  # the floor acts on the last report's 0.4 and 0.45
        np.testing.assert_allclose(got[t + 1], [v / sum(inv) for v in inv], rtol=1e-15)
    assert got[-1][1] == got[-1][2]  # both floored


def test_rlw_per_round_option_draws_softmax_of_standard_normal_logits_per_round() -> None:
    got = _run_rule(RandomWeights(seed=7))
    for t, w in enumerate(got):
        eps = np.random.Generator(np.random.PCG64(derive_seed(7, "rlw", t))).standard_normal(3)
        e = np.exp(eps)
        np.testing.assert_allclose(w, e / e.sum(), rtol=1e-14)
    assert len({tuple(w) for w in got}) == len(got)  # a new draw every round
    again = _run_rule(RandomWeights(seed=7), REPORTS * 10)  # the reports are not read
    assert all(np.array_equal(a, b) for a, b in zip(got, again))
    assert not np.array_equal(_run_rule(RandomWeights(seed=8))[0], got[0])
    # the logits' law: over many rounds log(w_i / w_j) = eps_i - eps_j has mean 0 and variance 2
    diffs = np.array([np.log(w[0] / w[1]) for w in (RandomWeights(3).draw(2, t) for t in range(4000))])
    assert abs(diffs.mean()) < 0.1 and abs(diffs.var() - 2.0) < 0.2


@pytest.mark.parametrize(("temperature", "window"), [(2.0, 1), (0.5, 2)])
def test_dwa_golden_values(temperature: float, window: int) -> None:
    got = _run_rule(DynamicWeightAverage(temperature, window))
    for t in range(len(REPORTS)):
        if t + 1 < 2 * window:  # fewer than two windows of reports: uniform
            np.testing.assert_array_equal(got[t + 1], [1 / 3] * 3)
            continue
        recent = REPORTS[t + 1 - window: t + 1].mean(0)
        older = REPORTS[t + 1 - 2 * window: t + 1 - window].mean(0)
        e = np.exp((recent / older) / temperature)
        np.testing.assert_allclose(got[t + 1], e / e.sum(), rtol=1e-14)
    if window == 1:  # the last round: task 2's loss fell to 40 %, the others' to ~90 %: it gets the least weight
        assert got[-1][2] < min(got[-1][0], got[-1][1])


@pytest.mark.parametrize("weight_decay", [1e-3, 0.0])
def test_famo_golden_values_against_torch_adam(weight_decay: float) -> None:
    """The oracle: FAMO's logits as a torch parameter under ``torch.optim.Adam`` with the gradient
    ``autograd.grad(softmax(xi), xi, grad_outputs=delta)`` (as the authors' update), the weights from
    ``softmax(xi)`` and ``D`` as written in the paper."""
    from fedhv.algorithms.famo import FAMORule

    got = _run_rule(FAMORule(lr=0.025, weight_decay=weight_decay))
    xi = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([xi], lr=0.025, weight_decay=weight_decay)
    np.testing.assert_array_equal(got[0], [1 / 3] * 3)
    for t, report in enumerate(REPORTS):
        d = torch.as_tensor(report, dtype=torch.float64) + 1e-8
        if t > 0:
            delta = (torch.as_tensor(REPORTS[t - 1], dtype=torch.float64) + 1e-8).log() - d.log()
            (grad,) = torch.autograd.grad(torch.softmax(xi, -1), xi, grad_outputs=delta)
            opt.zero_grad()
            xi.grad = grad
            opt.step()
        z = torch.softmax(xi.detach(), -1)
        want = (z / d) / (z / d).sum()  # z_i / (c D_i), c = sum_j z_j / D_j
        np.testing.assert_allclose(got[t + 1], want.numpy(), rtol=1e-12)
        assert abs(got[t + 1].sum() - 1.0) < 1e-15
    # the task whose loss fell least gets more weight than under 1 / D alone (FAMO's balancing)
    inv = 1.0 / (REPORTS[-1] + 1e-8)
    assert got[-1][1] / got[-1][0] > inv[1] / inv[0]


def _rlw_oracle(seed: int, stream: str, t: int, client: int, steps: int, m: int, std: float = 1.0) -> np.ndarray:
    """The authors' per-step draw ``softmax(std * N(0, I))``, each step from its own keyed stream."""
    rows = []
    for s in range(steps):
        gen = np.random.Generator(np.random.PCG64(derive_seed(seed, stream, "rlw", t, client, s)))
        e = np.exp(std * gen.standard_normal(m))
        rows.append(e / e.sum())
    return np.array(rows)


@pytest.mark.parametrize("std", [1.0, 0.3])
def test_rlw_clients_draw_new_weights_at_every_local_step(std: float) -> None:
    """The default rule sends no weights of its own (``1/m``, the draws' mean) and asks the clients to draw
    ``softmax(std eps)`` at each step from ``(seed, stream, "rlw", round, client, step)``."""
    rule = RLW(config=RLWConfig(std=std)).rule(_Seeded(7))
    assert isinstance(rule, StepRandomWeights) and RLWConfig().draw == "step"
    assert all(np.array_equal(w, [1 / 3] * 3) for w in _run_rule(rule))
    draw = rule.client_draw
    for t, client in [(0, 0), (4, 9), (17, 3)]:
        got = draw.rows(7, "train", t, client, 10, 3)
        np.testing.assert_allclose(got, _rlw_oracle(7, "train", t, client, 10, 3, std), rtol=1e-13)
        assert len({tuple(row) for row in got}) == 10  # a new draw at every step, not one per round
    assert not np.array_equal(draw.rows(7, "train", 0, 0, 2, 3), draw.rows(7, "train", 0, 1, 2, 3))  # per client
    assert not np.array_equal(draw.rows(7, "train", 0, 0, 2, 3), draw.rows(7, "calibration", 0, 0, 2, 3))
    assert isinstance(RLW(config=RLWConfig(draw="round")).rule(_Seeded(7)), RandomWeights)


@dataclasses.dataclass
class _Seeded:
    """The one field of a build context that RLW's rule reads."""

    seed: int


def _stch_oracle(report: np.ndarray, z: np.ndarray, mu: float) -> np.ndarray:
    """The gradient, by autograd, of the authors' loss ``m mu log sum exp((log(l / z + 1e-20) - max) / mu)``
    (``Xi-L/STCH``, the factor ``m`` their ``task_num``) with respect to the losses."""
    losses = torch.tensor(report, dtype=torch.float64, requires_grad=True)
    logs = torch.log(losses / torch.as_tensor(z) + 1e-20)
    loss = mu * torch.log(torch.exp((logs - logs.max().detach()) / mu).sum()) * len(report)
    (grad,) = torch.autograd.grad(loss, losses)
    return grad.numpy()


@pytest.mark.parametrize("mu", [1.0, 0.1])
def test_stch_golden_values_are_the_gradient_of_the_authors_loss(mu: float) -> None:
    """The weights are the authors' gradient itself, not normalised to the simplex."""
    from fedhv.algorithms.stch import STCHRule

    z = np.array([2.0, 0.6, 1.2])
    got = _run_rule(STCHRule(z, mu))
    for t, report in enumerate(REPORTS):
        np.testing.assert_allclose(got[t + 1], _stch_oracle(report, z, mu), rtol=1e-12)
    if mu == 1.0:  # the direction is fixed (∝ 1 / z) but the length is m / sum_j (F_j / z_j + 1e-20)
        for t, report in enumerate(REPORTS):
            np.testing.assert_allclose(got[t + 1], 3 / (z * (report / z + 1e-20).sum()), rtol=1e-13)
    else:  # the task farthest above its nadir (ratio F / z largest) takes the most weight
        assert int(np.argmax(got[1])) == int(np.argmax(REPORTS[0] / z))


def test_stch_weights_at_mu_1_vary_with_the_reports() -> None:
    """At ``mu = 1`` the effective step ``sum_i w_i = m sum_i (1 / z_i) / sum_j F_j / z_j`` grows as the losses
    fall below the nadir: a rule normalised to the simplex (sum 1 in every round) fails here."""
    from fedhv.algorithms.stch import STCHRule

    z = np.array([2.3, 2.1])
    reports = np.array([[2.3, 2.1], [1.0, 0.9], [0.3, 0.4]])
    got = _run_rule(STCHRule(z, 1.0), reports)
    sums = [float(w.sum()) for w in got[1:]]
    for w, report in zip(got[1:], reports):
        np.testing.assert_allclose(w, _stch_oracle(report, z, 1.0), rtol=1e-12)
    np.testing.assert_allclose(sums[0], (1 / z).sum(), rtol=1e-12)  # at the nadir: sum_i 1 / z_i (~0.91)
    assert sums[0] < 1 < sums[1] < sums[2] and sums[2] > 5  # the losses fell: a longer step
    np.testing.assert_allclose(got[3] / got[3].sum(), (1 / z) / (1 / z).sum(), rtol=1e-12)  # direction ∝ 1 / z


def test_famo_refuses_a_report_below_its_bound() -> None:
    from fedhv.algorithms.famo import FAMOError, FAMORule

    rule = FAMORule(min_loss=1.0)
    _, memory = rule.first(2)
    with pytest.raises(FAMOError, match=r"task\(s\) \[1\] report \[0.5\]; lower famo.min_loss"):
        rule.next(np.array([2.0, 0.5]), memory, 0)


def test_the_shared_round_sends_w_takes_the_report_and_logs_the_next_weights() -> None:
    alg = LossOnlyAlgorithm(DynamicWeightAverage(), lr_global=2.0, name="dwa", report_batches=3)
    state = alg.init_state(2)
    theta = torch.zeros(3, dtype=torch.float64)
    replies = [Replies(np.array([0, 1]), reports=torch.tensor([[1.0, 2.0], [3.0, 2.0]], dtype=torch.float64),
                       deltas=torch.tensor([[[1.0, 0.0, 2.0]], [[3.0, 0.0, 0.0]]], dtype=torch.float64))
               for _ in range(2)]
    fed = ScriptedFederation(np.array([0, 1]), replies)
    res = alg.round(state, theta, fed)
    (req,) = fed.requests
    assert req.report == 3 and req.train.tolist() == [[0.5, 0.5]] and req.payload["weights"].dtype == np.float32
    assert req.train_draw is None and res.log["weight_sum"] == 1.0 and "client_draw" not in res.log
    np.testing.assert_array_equal(res.theta.numpy(), [4.0, 0.0, 2.0])  # eta_g mean_k Delta_k
    assert res.log["report"] == [2.0, 2.0] and res.state.rounds == 1 and len(res.state.memory) == 1


def test_a_rule_with_a_client_draw_asks_the_clients_to_draw_and_logs_it() -> None:
    alg = LossOnlyAlgorithm(StepRandomWeights(0.5), lr_global=1.0, name="rlw")
    replies = [Replies(np.array([0]), reports=torch.tensor([[1.0, 2.0]], dtype=torch.float64),
                       deltas=torch.zeros(1, 1, 3, dtype=torch.float64))]
    fed = ScriptedFederation(np.array([0]), replies)
    res = alg.round(alg.init_state(2), torch.zeros(3, dtype=torch.float64), fed)
    (req,) = fed.requests
    assert (req.train_draw.law, req.train_draw.key, req.train_draw.scale) == ("softmax-normal", "rlw", 0.5)
    assert req.train.tolist() == [[0.5, 0.5]] and res.log["client_draw"] == {"law": "softmax-normal", "key": "rlw",
                                                                             "scale": 0.5}


def test_a_step_draw_crosses_flowers_stage_message() -> None:
    """A Flower node decodes the draw the simulator's engines take (so it draws the same weights)."""
    pytest.importorskip("flwr")
    from fedhv.algorithms.base import Request
    from fedhv.flower.protocol import stage_content, stage_order

    theta = torch.zeros(4, dtype=torch.float64)
    for draw in (StepRandomWeights(0.3).client_draw, None):
        request = Request(report="all", train=np.array([[0.5, 0.5]]), train_draw=draw)
        order, _ = stage_order(stage_content(theta, request, 2, 7, "train", "sha", 1, 2))
        assert order.train_draw == draw and order.train.tolist() == [[0.5, 0.5]]


def test_stch_state_keeps_its_scale_and_logs_its_effective_step() -> None:
    from fedhv.algorithms.stch import STCHRule

    rule = STCHRule(np.array([2.0, 1.0]))
    algorithm = LossOnlyAlgorithm(rule, 1.0, "stch", state_class=ScaledLossOnlyState)
    replies = [Replies(np.array([0]), reports=torch.tensor([[0.5, 0.25]], dtype=torch.float64),
                       deltas=torch.zeros(1, 1, 3, dtype=torch.float64)) for _ in range(2)]
    fed = ScriptedFederation(np.array([0]), replies)
    state = algorithm.init_state(2)
    state = algorithm.round(state, torch.zeros(3, dtype=torch.float64), fed).state
    assert isinstance(state, ScaledLossOnlyState)
    np.testing.assert_allclose(state.weights, [2.0, 4.0], rtol=1e-12)  # 2 / (z_i (0.25 + 0.25)): sum 6
    res = algorithm.round(state, torch.zeros(3, dtype=torch.float64), fed)
    assert res.log["weight_sum"] == pytest.approx(6.0, rel=1e-12)
    assert STCH.state is ScaledLossOnlyState and ScaledLossOnlyState.kind != LossOnlyState.kind


def test_state_through_the_plain_form() -> None:
    state = LossOnlyState(np.array([0.25, 0.75]), 4, (np.array([1.0, 2.0]), np.array([0.5, 0.25])))
    back = LossOnlyState.from_plain(state.to_plain())
    assert back.rounds == 4 and np.array_equal(back.weights, state.weights)
    assert all(np.array_equal(a, b) for a, b in zip(back.memory, state.memory, strict=True))
    bad = state.to_plain()
    bad["weights"] = torch.tensor([0.5, 0.75], dtype=torch.float64)
    with pytest.raises(StateError, match="not on the simplex"):
        LossOnlyState.from_plain(bad)
    scaled = ScaledLossOnlyState.from_plain(bad)  # STCH's weights keep the authors' scale (sum 1.25 here)
    assert type(scaled) is ScaledLossOnlyState and scaled.weights.tolist() == [0.5, 0.75]
    bad["weights"] = torch.tensor([0.5, float("nan")], dtype=torch.float64)
    with pytest.raises(StateError, match="non-finite"):
        ScaledLossOnlyState.from_plain(bad)


def test_the_methods_take_fedhvs_rates_and_refuse_bad_values_naming_the_key() -> None:
    fedhv_rates = load_config("multimnist")  # [lr.fedhv] 1.2 / 0.3 (paper Table 5)
    for name in ("dwa", "rlw", "linear", "inverse-loss", "famo", "stch"):
        cfg = load_config("multimnist", [f"method='{name}'"])
        assert (cfg.lr_global, cfg.lr_local) == (fedhv_rates.lr_global, fedhv_rates.lr_local)
    assert load_config("multimnist", ["method='dwa'", "lr.dwa={global=2.0, local=0.1}"]).lr_global == 2.0
    cases = [("dwa.temperature=0", "dwa.temperature = 0.0 must be > 0"), ("dwa.window=0", "dwa.window = 0 must be >= 1"),
             ("rlw.std=-1", "rlw.std = -1.0 must be > 0"), ("inverse-loss.rho=0", "inverse-loss.rho = 0.0 must be > 0"),
             ("rlw.draw='epoch'", "rlw.draw = 'epoch' is not supported; choose one of step, round"),
             ("linear.weights=[1, -1]", "linear.weights = [1.0, -1.0] must be positive"),
             ("dwa.report_batches=0", "dwa.report_batches = 0 must be >= 1"),
             ("stch.mu=0", "stch.mu = 0.0 must be > 0"), ("famo.lr=0", "famo.lr = 0.0 must be > 0"), ("famo.weight_decay=-1", "famo.weight_decay = -1.0 must be >= 0"),
             ("dwa.temprature=1", "unknown config key 'dwa.temprature'; did you mean 'dwa.temperature'?")]
    for override, message in cases:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace("?", r"\?")):
            load_config("multimnist", [f"method='{override.split('.')[0]}'", override])


@pytest.mark.needs_data
def test_linear_weights_must_match_the_task_count(tmp_path: Path) -> None:
    from fedhv.experiment import run_experiment

    cfg = small_config("method='linear'", "linear.weights=[1.0, 2.0, 3.0]")
    with pytest.raises(ConfigError, match="linear.weights has 3 values but multimnist has 2 tasks"):
        run_experiment(cfg, tmp_path / "r", progress=False)


@pytest.mark.needs_data
@pytest.mark.parametrize("method", ["dwa", "rlw", "inverse-loss", "linear", "famo", "stch"])
def test_both_engines_agree_in_float64(method: str, tmp_path: Path) -> None:
    from fedhv.experiment import run_experiment
    from fedhv.results.rundir import read_jsonl

    runs = {}
    for engine in ("sequential", "batched"):
        cfg = small_config(f"method='{method}'", "dtype='float64'", f"engine='{engine}'", "rounds=3",
                           "linear.weights=[2.0, 1.0]" if method == "linear" else "dwa.window=1")
        run_experiment(cfg, tmp_path / engine, progress=False)
        runs[engine] = read_jsonl(tmp_path / engine / "rounds.jsonl")
    for a, b in zip(runs["sequential"], runs["batched"], strict=True):
        np.testing.assert_allclose(a["report"], b["report"], rtol=1e-12)
        np.testing.assert_allclose(a["next_weights"], b["next_weights"], rtol=1e-12)
    run_experiment(small_config("method='fedhv'", "dtype='float64'", "rounds=1"), tmp_path / "fedhv", progress=False)
    fedhv_round = read_jsonl(tmp_path / "fedhv" / "rounds.jsonl")[0]
    for key in ("bytes_down_per_client", "bytes_up_per_client", "sync_stages"):  # FedHV's protocol, FedHV's cost
        assert runs["batched"][0][key] == fedhv_round[key], key


@pytest.mark.needs_data
def test_both_engines_train_on_the_weights_each_client_draws_at_each_step() -> None:
    """Spied on the engines' loss: local step ``s`` of client ``k`` in round ``t`` weighs the task losses by the
    oracle's draw from ``(seed, "train", "rlw", t, k, s)`` -- a new vector every step, per client -- in the
    sequential and the batched engine alike, and the two engines' updates agree in float64."""
    from fedhv.experiment.setup import make_engine, new_model
    from fedhv.models import get_flat

    from helpers import small_data

    draw = StepRandomWeights().client_draw
    clients, t = np.array([1, 4]), 3
    deltas, seen = {}, {}
    for engine in ("sequential", "batched"):
        cfg = small_config("dtype='float64'", f"engine='{engine}'")
        data = small_data(cfg)
        model = new_model(cfg, data, cfg.seed)
        e = make_engine(cfg, model, data, cfg.seed, "train")
        calls: list[torch.Tensor] = []
        # the task weights' argument: _loss(plan, step, w), _losses(params, plan, step, w, buffers)
        name, at = ("_loss", 2) if engine == "sequential" else ("_losses", 3)
        real = getattr(e, name)

        def spy(*args: Any, real: Any = real, calls: list[torch.Tensor] = calls, at: int = at) -> torch.Tensor:
            calls.append(args[at].detach().clone())
            return real(*args)

        setattr(e, name, spy)
        theta = get_flat(model).clone()
        deltas[engine] = e.train(theta, clients, np.array([[0.5, 0.5]]), t, draw=draw)
        seen[engine] = calls
        steps = cfg.train.local_steps
    oracle = [_rlw_oracle(0, "train", t, int(c), steps, 2) for c in clients]
    seq = torch.stack(seen["sequential"]).numpy().reshape(len(clients), steps, 2)  # client after client
    bat = torch.stack(seen["batched"]).numpy().transpose(1, 0, 2)  # step after step, all clients at once
    for k in range(len(clients)):
        np.testing.assert_allclose(seq[k], oracle[k], rtol=1e-13)
        np.testing.assert_allclose(bat[k], oracle[k], rtol=1e-13)
    assert (deltas["sequential"] - deltas["batched"]).abs().max().item() < 1e-12


@pytest.mark.needs_data
@pytest.mark.parametrize("method", ["dwa", "rlw", "famo", "stch", "inverse-loss", "linear"])
def test_resume_equals_the_uninterrupted_run(method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DWA's memory (two reports), RLW's round counter and FAMO's logits and Adam moments go through the
    checkpoint; inverse loss and linear scalarisation (no state beyond the weights) resume as well."""
    cfg = small_config(f"method='{method}'", "rounds=4", "checkpoint.period=1", "dtype='float64'",
                       "linear.weights=[2.0, 1.0]" if method == "linear" else "dwa.window=1")
    assert_resume_is_bit_identical(cfg, tmp_path, monkeypatch)
    assert dataclasses.asdict(cfg.section(method)) == dataclasses.asdict(load_config("multimnist", [
        f"method='{method}'", "linear.weights=[2.0, 1.0]" if method == "linear" else "dwa.window=1"]).section(method))


def test_the_method_objects_configure_their_sections() -> None:
    cfg = load_config("multimnist")
    for method in (DWA(lr_global=0.5), RLW(), InverseLoss(), Linear(), FAMO(), STCH()):
        configured = method.configure(cfg)
        assert configured.method == method.name and configured.train.lr_global == method.lr_global
        assert configured.section(method.name) == method.config
        assert type(method).from_config(dataclasses.replace(
            configured, train=dataclasses.replace(configured.train, lr_local=0.1))) == method
