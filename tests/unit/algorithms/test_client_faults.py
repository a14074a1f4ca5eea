"""Client faults: reply validation, aggregation over valid clients, empty rounds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedhv.algorithms import FedHVAlgorithm
from fedhv.algorithms.fedcmoo import FedCMOOAlgorithm, FedCMOOConfig
from fedhv.algorithms.validation import ClientReply, NoValidReplies, ReplySpec, reply_problem
from fedhv.experiment import run_experiment
from fedhv.experiment.loop import run_rounds
from fedhv.experiment.setup import make_engine, new_model
from fedhv.models import get_flat
from fedhv.models.params import ParamLayout, TaskSlices
from fedhv.results.rundir import read_jsonl
from fedhv.sim.faults import REPORT_GARBAGE, UPDATE_GARBAGE, FaultInjector, garbage_report, garbage_update
from fedhv.sim.federation import SimFederation

from helpers import small_config, small_data

SPEC = ReplySpec(num_tasks=2, dim=5, report=True, train_rows=1)


def _good() -> ClientReply:
    return ClientReply(3, torch.tensor([0.5, 2.0]), None, torch.zeros(1, 5))


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("report", torch.tensor([float("nan"), 1.0]), "non-finite"),
        ("report", torch.tensor([1.0, float("inf")]), "non-finite"),
        ("report", torch.tensor([-0.1, 1.0]), "negative"),
        ("report", torch.tensor([1.0]), "shape (1,)"),
        ("report", torch.tensor([1.0, 1.0, 1.0]), "shape (3,)"),
        ("report", torch.ones(2, 1), "shape (2, 1)"),
        ("report", None, "report missing"),
        ("report", "2.0,1.0", "not numeric"),
        ("report", [[1.0], [1.0, 2.0]], "not numeric"),
        ("deltas", torch.zeros(1, 4), "shape (1, 4)"),
        ("deltas", torch.full((1, 5), float("nan")), "non-finite"),
        ("deltas", None, "update missing"),
        ("deltas", torch.zeros(1, 5, dtype=torch.bool), "dtype"),
    ],
)
def test_invalid_replies_are_rejected_with_a_reason(field: str, value: object, reason: str) -> None:
    reply = _good()
    setattr(reply, field, value)
    problem = reply_problem(reply, SPEC)
    assert problem is not None and reason in problem


def test_valid_reply_and_every_garbage_kind() -> None:
    assert reply_problem(_good(), SPEC) is None
    assert reply_problem(ClientReply(0, [0.0, 0.0], None, np.zeros((1, 5))), SPEC) is None  # non-tensor input
    for kind in REPORT_GARBAGE:
        bad = ClientReply(0, garbage_report(torch.tensor([0.5, 2.0]), kind), None, torch.zeros(1, 5))
        assert reply_problem(bad, SPEC) is not None, kind
    for kind in UPDATE_GARBAGE:
        bad = ClientReply(0, torch.tensor([0.5, 2.0]), None, garbage_update(torch.zeros(1, 5), kind))
        assert reply_problem(bad, SPEC) is not None, kind


_numbers = st.floats(allow_nan=True, allow_infinity=True, width=64)
_reports = st.one_of(
    st.lists(_numbers, min_size=0, max_size=4),
    st.lists(st.lists(_numbers, min_size=1, max_size=3), min_size=1, max_size=3),
    st.text(max_size=5),
    st.none(),
    st.integers(-5, 5),
    st.dictionaries(st.text(max_size=2), _numbers, max_size=2),
)


@settings(max_examples=400, deadline=None)
@given(report=_reports)
def test_report_validator_fuzz(report: object) -> None:
    """Any value: no exception, and accepted exactly when it is m finite non-negative losses."""
    problem = reply_problem(ClientReply(0, report, None, torch.zeros(1, 5)), SPEC)
    ok = (
        isinstance(report, list)
        and len(report) == 2
        and all(isinstance(v, float) and math.isfinite(v) and v >= 0 for v in report)
    )
    assert (problem is None) == ok, (report, problem)


@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(0, 6), min_size=0, max_size=3), fill=_numbers)
def test_update_validator_fuzz(shape: list[int], fill: float) -> None:
    update = torch.full(tuple(shape), fill, dtype=torch.float64)
    problem = reply_problem(ClientReply(0, [1.0, 1.0], None, update), SPEC)
    assert (problem is None) == (tuple(shape) == (1, 5) and math.isfinite(fill)), (shape, fill, problem)


def _setup(*overrides: str):  # type: ignore[no-untyped-def]
    cfg = small_config(*overrides)
    data = small_data(cfg)
    model = new_model(cfg, data, 0)
    engine = make_engine(cfg, model, data, 0, "train")
    return cfg, data, model, engine


@pytest.mark.needs_data
@pytest.mark.parametrize("engine_name", ["sequential", "batched"])
def test_aggregation_uses_only_the_valid_clients(engine_name: str) -> None:
    """A FedHV round with faults equals a clean round over the clients that stayed valid.

    Sequential: bit for bit. Batched: each client's computation is the same maths, but
    the batched kernels' blocking depends on how many clients run together (float32
    round-off only).
    """
    _, _data, model, engine = _setup("train.clients_per_round=6", f"engine=\"{engine_name}\"")
    theta = get_flat(model).clone()
    alg = FedHVAlgorithm(np.array([3.0, 3.0]), lr_global=1.0)
    state = alg.init_state(2)
    faults = FaultInjector(client_dropout=0.3, corrupt_reports=0.3, corrupt_updates=0.2, seed=0)
    clients = np.arange(6)
    for t in range(20):  # find a round with some, but not all, clients lost
        fed = SimFederation(engine, clients, t, faults)
        try:
            faulty = alg.round(state, theta, fed)
        except NoValidReplies:
            continue
        lost = set(fed.dropped) | {c for c, _ in fed.rejected}
        if lost and fed.dropped and fed.rejected:
            break
    else:
        pytest.fail("no round with both dropped and rejected clients")
    assert all(isinstance(reason, str) and reason for _, reason in fed.rejected)
    survivors = np.array(sorted(set(clients.tolist()) - lost))
    clean = alg.round(state, theta, SimFederation(engine, survivors, t))
    if engine_name == "sequential":
        assert torch.equal(faulty.theta, clean.theta)
        assert np.array_equal(faulty.state.weights, clean.state.weights)
    else:
        assert torch.allclose(faulty.theta, clean.theta, atol=1e-6, rtol=0)
        assert np.allclose(faulty.state.weights, clean.state.weights, atol=1e-6, rtol=0)
    assert np.isfinite(faulty.state.weights).all()


@pytest.mark.needs_data
def test_round_without_valid_clients_keeps_model_and_weights() -> None:
    _, data, model, engine = _setup()
    theta = get_flat(model).clone()
    alg = FedHVAlgorithm(np.array([3.0, 3.0]), lr_global=1.0)
    records = []
    faults = FaultInjector(corrupt_reports=0.999, seed=0)
    out, state = run_rounds(alg, engine, data, theta, 2, 4, 0, "train",
                            lambda rec, th, st: records.append(rec), faults=faults)
    assert torch.equal(out, theta)
    assert np.array_equal(state.weights, alg.init_state(2).weights)
    assert [r.skipped for r in records] == [True, True]
    assert all(len(r.rejected) == 4 and "report" in r.rejected[0][1] for r in records)


@pytest.mark.needs_data
def test_fedcmoo_survives_faults_between_its_stages() -> None:
    """Clients rejected in the gradient stage are not asked to train; the model stays finite."""
    _, data, model, engine = _setup("train.clients_per_round=6")
    slices = TaskSlices.of(ParamLayout.of(model), 2, model.head_prefix)
    alg = FedCMOOAlgorithm(slices, lr_global=1.0, config=FedCMOOConfig(weight_steps=20))
    faults = FaultInjector(client_dropout=0.2, corrupt_updates=0.3, seed=1)
    records = []
    theta, state = run_rounds(alg, engine, data, get_flat(model).clone(), 4, 6, 0, "train",
                              lambda rec, th, st: records.append(rec), faults=faults)
    assert torch.isfinite(theta).all() and np.isfinite(state.weights).all()
    assert sum(len(r.rejected) for r in records) > 0
    assert any(r.rejected and not r.skipped for r in records)


@pytest.mark.needs_data
def test_faulty_run_records_counts_and_reasons(tmp_path: Path) -> None:
    cfg = small_config("rounds=6", "faults.client_dropout=0.25", "faults.corrupt_reports=0.2",
                       "faults.corrupt_updates=0.1")
    summary = run_experiment(cfg, tmp_path / "run", progress=False)
    rounds = read_jsonl(tmp_path / "run" / "rounds.jsonl")
    dropped = sum(r["dropped_clients"] for r in rounds)
    rejected = sum(r["rejected_clients"] for r in rounds)
    assert dropped > 0 and rejected > 0
    assert summary["dropped_clients"] == dropped and summary["rejected_clients"] == rejected
    reasons = [x["reason"] for r in rounds for x in r.get("rejected", [])]
    assert len(reasons) == rejected and all(reasons)
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert metrics[-1]["rejected_clients"] == rejected
    for r in rounds:
        if not r.get("skipped"):
            assert all(math.isfinite(w) for w in r["next_weights"])
    json.dumps(summary)
