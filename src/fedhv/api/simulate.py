"""``fedhv.simulate`` and ``fedhv.calibrate``: the simulator for a user's model and data.

Both drive the library's round loop (:func:`fedhv.experiment.loop.run_rounds`) over the
sequential or batched engine; the user's module runs through
:class:`fedhv.sim.module.ModuleAdapter` (``torch.func`` on the batched engine, with a
one-line warning and the sequential engine where ``vmap`` cannot run it). ``theta^0`` is
the module's own parameters (initialise or seed them before calling).
"""

from __future__ import annotations

import copy
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedhv.algorithms.uniform import Uniform as _Uniform
from fedhv.api.dataset import FederatedDataset
from fedhv.api.methods import FedHV, Method
from fedhv.data.federated import FederatedData
from fedhv.errors import ConfigError
from fedhv.experiment.calibration import CalibrationResult
from fedhv.experiment.divergence import check_calibration_round, lr_hint
from fedhv.experiment.loop import RoundRecord, run_rounds
from fedhv.metrics.evaluate import evaluate_tasks
from fedhv.models.params import ParamLayout, TaskSlices, get_flat, set_flat
from fedhv.sim.batched import BatchedEngine
from fedhv.sim.engine import Engine, SequentialEngine
from fedhv.sim.module import ModuleAdapter, vmap_problem


@dataclass
class History:
    """What a simulation produced.

    Attributes
    ----------
    rounds : list of dict
        One record per round (clients, weights ``w^t``, report ``F^t``, bytes, times), as ``rounds.jsonl``.
    evaluations : list of dict
        ``{"round", "acc", "loss", "mean_acc", "worst_acc", "mean_loss"}`` per test evaluation.
    model : nn.Module
        A copy of the user's module holding the final parameters.
    reference : list of float or None
        FedHV's reference ``r``; ``calibration`` the calibration that produced it.
    engine : str
        The engine that ran (``"batched"`` or ``"sequential"``).
    out : Path or None
    """

    rounds: list[dict[str, Any]]
    evaluations: list[dict[str, Any]]
    model: nn.Module
    reference: list[float] | None = None
    calibration: CalibrationResult | None = None
    engine: str = "batched"
    out: Path | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Sim:
    adapter: ModuleAdapter
    data: FederatedData
    engine_kind: str


def _prepare(model: nn.Module, data: FederatedDataset, engine: str, heads: str) -> _Sim:
    if not isinstance(data, FederatedDataset):
        raise ConfigError(f"data has type {type(data).__name__}; build it with fedhv.FederatedDataset.from_tensors")
    if engine not in ("batched", "sequential"):
        raise ConfigError(f"engine = {engine!r} is unknown; use \"batched\" or \"sequential\"")
    first = next(model.parameters())
    fd = data.federated(first.dtype, first.device)
    adapter = ModuleAdapter(model, fd.task_names, fd.train_x[:2], heads)
    if engine == "batched":
        problem = vmap_problem(adapter, fd.train_x[:2])
        if problem is not None:
            warnings.warn(f"torch.func.vmap cannot run this model ({problem}); using the sequential engine",
                          RuntimeWarning, stacklevel=3)
            engine = "sequential"
    return _Sim(adapter, fd, engine)


def _engine(sim: _Sim, model: nn.Module, seed: int, stream: str, local_steps: int, batch_size: int,
            lr_local: float, momentum: float) -> Engine:
    cls = BatchedEngine if sim.engine_kind == "batched" else SequentialEngine
    return cls(model, sim.data, local_steps=local_steps, batch_size=batch_size, lr_local=lr_local,  # type: ignore[arg-type]
               momentum=momentum, seed=seed, stream=stream)


def _check(data: FederatedData, clients_per_round: int, rounds: int) -> None:
    if not 1 <= clients_per_round <= data.num_clients:
        raise ConfigError(f"clients_per_round = {clients_per_round} must be in [1, {data.num_clients}] "
                          "(the number of clients); lower it")
    if rounds < 0:
        raise ConfigError(f"rounds = {rounds} must be >= 0")


def _calibrate(sim: _Sim, rounds: int, margin: float, seeds: tuple[int, ...], lr_global: float,
               clients_per_round: int, **train: Any) -> CalibrationResult:
    start = time.perf_counter()
    reports: dict[str, list[list[float]]] = {}
    theta0 = get_flat(sim.adapter).clone()
    hint = lr_hint(train["lr_local"], lr_global)
    for seed in seeds:
        rows: list[list[float]] = reports.setdefault(str(seed), [])

        def on_round(rec: RoundRecord, theta: Any, state: Any, rows: list[list[float]] = rows) -> None:
            check_calibration_round(rec.round, rec.skipped, rec.rejected, hint)
            rows.append(rec.log["report"])

        engine = _engine(sim, copy.deepcopy(sim.adapter), seed, "calibration", **train)
        algorithm = _Uniform(lr_global=lr_global, report=True)
        run_rounds(algorithm, engine, sim.data, theta0, rounds, clients_per_round, seed, "calibration", on_round)
    top = np.array([r for rs in reports.values() for r in rs]).max(0)
    return CalibrationResult(reference=(top + margin).tolist(), max_report=top.tolist(), margin=margin,
                             seeds=list(seeds), reports=reports, rounds=rounds * len(seeds),
                             seconds=time.perf_counter() - start)


def calibrate(model: nn.Module, data: FederatedDataset, *, rounds: int = 20, margin: float = 0.15,
              seeds: tuple[int, ...] = (0,), lr_global: float = 1.0, clients_per_round: int | None = None,
              local_steps: int = 10, batch_size: int = 32, lr_local: float = 0.1, momentum: float = 0.0,
              engine: str = "batched", heads: str = "heads") -> CalibrationResult:
    """FedHV's reference from a uniform-weight run: ``r_i = max_{seed, t} F_i^t + margin``.

    Training settings as in :func:`simulate`; returns the calibration (``.reference``).
    """
    sim = _prepare(model, data, engine, heads)
    cpr = clients_per_round or min(10, sim.data.num_clients)
    _check(sim.data, cpr, rounds)
    if rounds < 1:
        raise ConfigError(f"rounds = {rounds} must be >= 1 for a calibration")
    return _calibrate(sim, rounds, margin, tuple(seeds), lr_global, cpr, local_steps=local_steps,
                      batch_size=batch_size, lr_local=lr_local, momentum=momentum)


def simulate(model: nn.Module, data: FederatedDataset, method: Method | None = None, rounds: int = 10, *,
             clients_per_round: int | None = None, local_steps: int = 10, batch_size: int = 32,
             lr_local: float = 0.1, momentum: float = 0.0, seed: int = 0, engine: str = "batched",
             eval_every: int = 1, heads: str = "heads", out: str | Path | None = None) -> History:
    """Train ``model`` federatedly on ``data`` with ``method`` for ``rounds`` rounds.

    Each round samples ``clients_per_round`` of the ``N`` clients (keyed by ``seed``); each runs
    ``local_steps`` SGD steps (``lr_local``, ``momentum``) on ``sum_i w_i l_i`` over minibatches of
    ``batch_size``; the server applies the method's update. The test set (if any) is evaluated
    every ``eval_every`` rounds and after the last. ``out`` writes ``rounds.jsonl``,
    ``metrics.jsonl``, ``calibration.json``, ``summary.json`` and ``model.pt`` there.
    """
    method = method or FedHV()
    sim = _prepare(model, data, engine, heads)
    cpr = clients_per_round or min(10, sim.data.num_clients)
    _check(sim.data, cpr, rounds)
    train: dict[str, Any] = {"local_steps": local_steps, "batch_size": batch_size, "lr_local": lr_local, "momentum": momentum}
    out_dir = _claim(out)
    start = time.perf_counter()
    cal, reference = None, None
    if isinstance(method, FedHV):
        if method.reference is None:
            cal = _calibrate(sim, method.calibration_rounds, method.margin, tuple(method.calibration_seeds),
                             method.lr_global, cpr, **train)
            reference = cal.reference
        else:
            reference = [float(v) for v in method.reference]
            if len(reference) != sim.data.num_tasks:
                raise ConfigError(f"FedHV(reference=...) has {len(reference)} values for {sim.data.num_tasks} tasks; "
                                  "give one value per task")
    slices = TaskSlices.of(ParamLayout.of(sim.adapter), sim.data.num_tasks, sim.adapter.head_prefix)
    algorithm = method.build(reference, slices.to(sim.data.train_x.device), seed)  # type: ignore[arg-type]
    evaluator = copy.deepcopy(sim.adapter)
    records: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []

    def on_round(rec: RoundRecord, theta: torch.Tensor, state: Any) -> None:
        records.append(rec.as_dict())
        if "test" in sim.data.eval_sets and (rec.round % eval_every == 0 or rec.round == rounds):
            set_flat(evaluator, theta)
            x, y = sim.data.eval_sets["test"]
            acc, loss = evaluate_tasks(evaluator, x, y, 4096, sim.data.objective)
            evals.append({"round": rec.round, "acc": acc, "loss": loss, "mean_acc": float(np.mean(acc)),
                          "worst_acc": float(np.min(acc)), "mean_loss": float(np.mean(loss))})

    engine_obj = _engine(sim, sim.adapter, seed, "train", **train)
    theta, _ = run_rounds(algorithm, engine_obj, sim.data, get_flat(sim.adapter).clone(), rounds, cpr, seed,
                          "train", on_round)
    final = copy.deepcopy(model)
    set_flat(final, theta.to(next(final.parameters()).device))
    hist = History(records, evals, final, reference, cal, sim.engine_kind, out_dir, time.perf_counter() - start)
    if out_dir is not None:
        _write(out_dir, hist, method.name)
    return hist


def _claim(out: str | Path | None) -> Path | None:
    if out is None:
        return None
    path = Path(out)
    if path.exists() and any(path.iterdir()):
        raise ConfigError(f"out = {str(path)!r} is not empty; choose a new directory")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _write(path: Path, hist: History, method: str) -> None:
    def lines(name: str, rows: list[dict[str, Any]]) -> None:
        (path / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    lines("rounds.jsonl", hist.rounds)
    lines("metrics.jsonl", hist.evaluations)
    if hist.calibration is not None:
        (path / "calibration.json").write_text(json.dumps(hist.calibration.as_dict()), encoding="utf-8")
    last = hist.evaluations[-1] if hist.evaluations else {}
    summary = {"method": method, "rounds": len(hist.rounds), "engine": hist.engine, "reference": hist.reference,
               "seconds": hist.seconds, **{k: v for k, v in last.items() if k != "round"}}
    (path / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    torch.save(hist.model.state_dict(), path / "model.pt")
