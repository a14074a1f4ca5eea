"""``fedhv.simulate`` and ``fedhv.calibrate``: the simulator for a user's model and data.

Both drive the library's round loop (:func:`fedhv.experiment.loop.run_rounds`) over the
sequential or batched engine; the user's module runs through
:class:`fedhv.sim.module.ModuleAdapter` (``torch.func`` on the batched engine, with a
one-line warning and the sequential engine where ``vmap`` cannot run it). ``theta^0`` is
the module's own parameters (initialise or seed them before calling).
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedhv.algorithms.uniform import Uniform as _Uniform
from fedhv.api.dataset import FederatedDataset
from fedhv.api.methods import FedHV, Method
from fedhv.api.output import SimRunWriter, method_options, round_record
from fedhv.config.schema import PRECISIONS
from fedhv.data.federated import FederatedData
from fedhv.errors import ConfigError
from fedhv.experiment.calibration import CalibrationResult, calibration_from_records
from fedhv.experiment.divergence import check_calibration_round, lr_hint
from fedhv.experiment.loop import RoundRecord, run_rounds
from fedhv.metrics import aggregate_metrics, evaluate_tasks
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
        ``{"round", "acc", "loss", "mean_acc", "worst_acc", "mean_loss", "hv"}`` per test evaluation
        (``hv = prod_i max(3 - loss_i, 0)``, as in ``metrics.jsonl``).
    model : nn.Module
        A copy of the user's module holding the final parameters.
    reference : list of float or None
        FedHV's reference ``r``; ``calibration`` the calibration that produced it.
    engine : str
        The engine that ran (``"batched"`` or ``"sequential"``).
    out : Path or None
        The run directory written (``simulate(out=...)``), else None.
    seconds : float
        Wall-clock time of the whole call (calibration included).
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
    precision: str = "fp32"


def _prepare(model: nn.Module, data: FederatedDataset, engine: str, heads: str, precision: str = "fp32") -> _Sim:
    if not isinstance(data, FederatedDataset):
        raise ConfigError(f"data has type {type(data).__name__}; build it with fedhv.FederatedDataset.from_tensors or .from_datasets")
    if engine not in ("batched", "sequential"):
        raise ConfigError(f"engine = {engine!r} is unknown; use \"batched\" or \"sequential\"")
    first = next(model.parameters())
    if precision not in PRECISIONS:  # the config key's values (fedhv.config.schema)
        raise ConfigError(f"precision = {precision!r} is unknown; use " + " or ".join(f'"{p}"' for p in PRECISIONS))
    if precision == "bf16" and first.dtype != torch.float32:
        raise ConfigError(f"precision = \"bf16\" needs a float32 model (its parameters are {first.dtype}); "
                          "call model.float() or use precision = \"fp32\"")
    fd = data.federated(first.dtype, first.device)
    adapter = ModuleAdapter(model, fd.task_names, fd.train_x[:2], heads)
    if engine == "batched":
        problem = vmap_problem(adapter, fd.train_x[:2])
        if problem is not None:
            warnings.warn(f"torch.func.vmap cannot run this model ({problem}); using the sequential engine",
                          RuntimeWarning, stacklevel=3)
            engine = "sequential"
    return _Sim(adapter, fd, engine, precision)


def _engine(sim: _Sim, model: nn.Module, seed: int, stream: str, local_steps: int, batch_size: int,
            lr_local: float, momentum: float) -> Engine:
    cls = BatchedEngine if sim.engine_kind == "batched" else SequentialEngine
    return cls(model, sim.data, local_steps=local_steps, batch_size=batch_size, lr_local=lr_local,  # type: ignore[arg-type]
               momentum=momentum, seed=seed, stream=stream, precision=sim.precision)


def _check(data: FederatedData, clients_per_round: int, rounds: int) -> None:
    if not 1 <= clients_per_round <= data.num_clients:
        raise ConfigError(f"clients_per_round = {clients_per_round} must be in [1, {data.num_clients}] "
                          "(the number of clients); lower it")
    if rounds < 0:
        raise ConfigError(f"rounds = {rounds} must be >= 0")


def _calibrate(sim: _Sim, rounds: int, margin: float, seeds: tuple[int, ...], lr_global: float,
               clients_per_round: int, report_batches: int | str = "all", **train: Any) -> CalibrationResult:
    """Uniform-weight rounds per seed whose clients report as FedHV's do (same ``report_batches``)."""
    if rounds < 1 or not seeds or not 0 <= margin < math.inf:
        raise ConfigError(f"calibration rounds = {rounds}, seeds = {list(seeds)}, margin = {margin}: a calibration "
                          "needs rounds >= 1, at least one seed and a finite margin >= 0")
    start = time.perf_counter()
    records: dict[str, list[RoundRecord]] = {}
    theta0 = get_flat(sim.adapter).clone()
    hint = lr_hint(train["lr_local"], lr_global)
    for seed in seeds:
        rows: list[RoundRecord] = records.setdefault(str(seed), [])

        def on_round(rec: RoundRecord, theta: Any, state: Any, rows: list[RoundRecord] = rows) -> None:
            check_calibration_round(rec.round, rec.skipped, rec.rejected, hint)
            rows.append(rec)

        engine = _engine(sim, copy.deepcopy(sim.adapter), seed, "calibration", **train)
        algorithm = _Uniform(lr_global=lr_global, report=True, report_batches=report_batches)
        run_rounds(algorithm, engine, sim.data, theta0, rounds, clients_per_round, seed, "calibration", on_round)
    return calibration_from_records(records, margin, time.perf_counter() - start, seeds)


def calibrate(model: nn.Module, data: FederatedDataset, *, rounds: int = 20, margin: float = 0.15,
              seeds: tuple[int, ...] = (0,), lr_global: float = 1.0, clients_per_round: int | None = None,
              local_steps: int = 10, batch_size: int = 32, lr_local: float = 0.1, momentum: float = 0.0,
              engine: str = "batched", heads: str = "heads", report_batches: int | str = "all",
              precision: str = "fp32") -> CalibrationResult:
    """FedHV's reference from a uniform-weight run: ``r_i = max_{seed, t} F_i^t + margin``.

    Training settings (and ``precision``) as in :func:`simulate`; ``report_batches`` as ``FedHV(report_batches=)``
    (how clients compute their reports). The maths is
    :func:`fedhv.experiment.calibration.calibration_from_records`, shared with ``fedhv run``.
    Returns the calibration (``.reference``, ``.max_report``, ``.reports``, bytes, seconds).
    """
    sim = _prepare(model, data, engine, heads, precision)
    cpr = clients_per_round or min(10, sim.data.num_clients)
    _check(sim.data, cpr, rounds)
    if rounds < 1:
        raise ConfigError(f"rounds = {rounds} must be >= 1 for a calibration")
    return _calibrate(sim, rounds, margin, tuple(seeds), lr_global, cpr, report_batches, local_steps=local_steps,
                      batch_size=batch_size, lr_local=lr_local, momentum=momentum)


def simulate(model: nn.Module, data: FederatedDataset, method: Method | None = None, rounds: int = 10, *,
             clients_per_round: int | None = None, local_steps: int = 10, batch_size: int = 32,
             lr_local: float = 0.1, momentum: float = 0.0, seed: int = 0, engine: str = "batched",
             eval_every: int = 1, heads: str = "heads", out: str | Path | None = None, name: str = "custom",
             overwrite: bool = False, precision: str = "fp32") -> History:
    """Train ``model`` federatedly on ``data`` with ``method`` for ``rounds`` rounds.

    Each round samples ``clients_per_round`` of the ``N`` clients (keyed by ``seed``); each runs
    ``local_steps`` SGD steps (``lr_local``, ``momentum``) on ``sum_i w_i l_i`` over minibatches of
    ``batch_size``; the server applies the method's update. The test set (if any) is evaluated
    every ``eval_every`` rounds and after the last.

    ``precision = "bf16"`` runs every forward pass of the clients (reports, gradients, local
    training) under bfloat16 autocast with float32 parameters, updates and losses, as the
    config key ``precision`` does for ``fedhv run`` (:mod:`fedhv.sim.precision`); the test
    evaluation stays in the model's dtype.

    ``out`` writes the run directory of ``fedhv run`` (:mod:`fedhv.api.output`: ``config.toml``
    with ``setting = name``, ``environment.json``, ``calibration.json``, ``rounds.jsonl``,
    ``metrics.jsonl``, ``model.pt``, ``summary.json``), claimed and locked before any work;
    a directory holding a run is refused (``overwrite=True`` replaces a finished one), so
    ``fedhv table`` / ``fedhv plot`` read it.
    """
    method = method or FedHV()
    sim = _prepare(model, data, engine, heads, precision)
    cpr = clients_per_round or min(10, sim.data.num_clients)
    _check(sim.data, cpr, rounds)
    if eval_every < 1:
        raise ConfigError(f"eval_every = {eval_every} must be >= 1 (evaluate every n rounds)")
    train: dict[str, Any] = {"local_steps": local_steps, "batch_size": batch_size, "lr_local": lr_local, "momentum": momentum}
    config = {"setting": name, "method": method.name, "seed": seed, "rounds": rounds, "engine": sim.engine_kind,
              "precision": precision,
              "source": "fedhv.simulate", "model": type(model).__qualname__,
              "train": {"clients_per_round": cpr, "lr_global": method.lr_global, **train},
              "eval": {"test_period": eval_every, "final": True},
              "tasks": {"names": [t.name for t in data.tasks], "kinds": [t.kind for t in data.tasks],
                        "sizes": [t.size for t in data.tasks]},
              method.name: method_options(method)}
    writer = SimRunWriter(out, overwrite) if out is not None else None
    try:
        hist = _simulate(sim, model, data, method, rounds, cpr, seed, eval_every, train, config, writer)
    except BaseException:
        if writer is not None:
            writer.fail()
        raise
    if writer is not None:
        writer.close()
    return hist


def _simulate(sim: _Sim, model: nn.Module, data: FederatedDataset, method: Method, rounds: int, cpr: int, seed: int,
              eval_every: int, train: dict[str, Any], config: dict[str, Any], writer: SimRunWriter | None) -> History:
    """:func:`simulate` after the checks (``writer``: the claimed run directory or None)."""
    start = time.perf_counter()
    cal, reference = None, None
    if isinstance(method, FedHV):
        if method.reference is None:
            cal = _calibrate(sim, method.calibration_rounds, method.margin, tuple(method.calibration_seeds),
                             method.lr_global, cpr, method.report_batches, **train)
            reference = cal.reference
        else:
            reference = [float(v) for v in method.reference]
            if len(reference) != sim.data.num_tasks:
                raise ConfigError(f"FedHV(reference=...) has {len(reference)} values for {sim.data.num_tasks} tasks; "
                                  "give one value per task")
    slices = TaskSlices.of(ParamLayout.of(sim.adapter), sim.data.num_tasks, sim.adapter.head_prefix)
    algorithm = method.build(reference, slices.to(sim.data.train_x.device), seed)  # type: ignore[arg-type]
    if writer is not None:
        writer.start(config, data.provenance(), cal)
    evaluator = copy.deepcopy(sim.adapter)
    records: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    loop_start = time.perf_counter()

    def on_round(rec: RoundRecord, theta: torch.Tensor, state: Any) -> None:
        entry = None
        if "test" in sim.data.eval_sets and (rec.round % eval_every == 0 or rec.round == rounds):
            t0 = time.perf_counter()
            set_flat(evaluator, theta)
            acc, loss = evaluate_tasks(evaluator, *sim.data.eval_sets["test"], 4096, sim.data.objective)
            entry = {"round": rec.round, **aggregate_metrics(acc, loss), "task_acc": acc, "task_loss": loss,
                     "time_eval_s": time.perf_counter() - t0}
            evals.append({"round": rec.round, "acc": acc, "loss": loss,
                          **{k: entry[k] for k in ("mean_acc", "worst_acc", "mean_loss", "hv")}})
        wall = time.perf_counter() - loop_start
        records.append(writer.round(rec, wall, entry) if writer is not None else round_record(rec, wall, entry))

    engine_obj = _engine(sim, sim.adapter, seed, "train", **train)
    theta, _ = run_rounds(algorithm, engine_obj, sim.data, get_flat(sim.adapter).clone(), rounds, cpr, seed,
                          "train", on_round)
    loop_seconds = time.perf_counter() - loop_start
    final = copy.deepcopy(model)
    set_flat(final, theta.to(next(final.parameters()).device))
    hist = History(records, evals, final, reference, cal, sim.engine_kind, None, time.perf_counter() - start)
    if writer is not None:
        writer.finish(config, [t.name for t in data.tasks], final, reference, cal, loop_seconds, hist.seconds)
        hist.out = writer.path
    return hist
