"""``fedhv.simulate`` and ``fedhv.calibrate``: the simulator for a user's model and data.

Both drive the library's round loop (:func:`fedhv.experiment.loop.run_rounds`) over the
sequential or batched engine; the user's module runs through
:class:`fedhv.sim.module.ModuleAdapter` (``torch.func`` on the batched engine, with a
one-line warning and the sequential engine where ``vmap`` cannot run it). ``theta^0`` is
the module's own parameters (initialise or seed them before calling); its buffers
(BatchNorm statistics) are federated as :mod:`fedhv.sim.engine` describes.

Everything about the data, the tasks and the model is checked before round 1
(:mod:`fedhv.api.checks`).
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from fedhv.algorithms.uniform import Uniform as _Uniform
from fedhv.api.checks import check_heads, check_model
from fedhv.api.dataset import FederatedDataset
from fedhv.api.history import History
from fedhv.api.methods import FedHV, Method
from fedhv.api.output import SimRunWriter, method_options, round_record
from fedhv.config.schema import AGGREGATIONS, PRECISIONS
from fedhv.data.federated import FederatedData
from fedhv.errors import ConfigError
from fedhv.experiment.calibration import CalibrationResult, calibration_from_records
from fedhv.experiment.divergence import check_calibration_round, lr_hint
from fedhv.experiment.loop import RoundRecord, run_rounds
from fedhv.metrics.evaluate import describe_metrics, evaluate_record
from fedhv.metrics.summary import PAPER_HV_REFERENCE
from fedhv.metrics.summary import hv_reference as hv_reference_list
from fedhv.models.params import ParamLayout, TaskSlices, copy_buffers, get_flat, set_flat
from fedhv.sim.batched import BatchedEngine
from fedhv.sim.engine import Engine, SequentialEngine
from fedhv.sim.local_opt import LocalTraining
from fedhv.sim.module import ModuleAdapter, vmap_problem

__all__ = ["History", "calibrate", "simulate"]

#: ``callback(round, record) -> bool | None``: ``record`` is the round's ``rounds.jsonl``
#: record with its evaluation (``"evaluation"``, the ``metrics.jsonl`` fields) on evaluated
#: rounds; returning ``True`` stops the run after that round.
Callback = Callable[[int, dict[str, Any]], Any]


@dataclass(frozen=True)
class _Sim:
    adapter: ModuleAdapter
    data: FederatedData
    engine_kind: str
    precision: str = "fp32"
    local: LocalTraining = LocalTraining()
    aggregation: str = "mean"


class _Stop(Exception):
    """Raised from the round hook when the user's callback asks to stop."""


def _on_device(model: nn.Module, device: str | torch.device | None) -> nn.Module:
    """``model`` itself, or a copy on ``device`` (the user's module is never moved)."""
    if device is None:
        return model
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device = {device!r} is not a torch device; use \"cpu\", \"cuda\", \"cuda:N\" or \"mps\"") \
            from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device = {device!r}: CUDA is not available on this machine; use device=\"cpu\"")
    first = next(model.parameters())
    return model if first.device == dev else copy.deepcopy(model).to(dev)


def _prepare(model: nn.Module, data: FederatedDataset, engine: str, heads: str, precision: str = "fp32",
             needs_heads: bool = False, local: LocalTraining | None = None, aggregation: str = "mean") -> _Sim:
    if not isinstance(data, FederatedDataset):
        raise ConfigError(f"data has type {type(data).__name__}; build it with fedhv.FederatedDataset.from_tensors or .from_datasets")
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model has type {type(model).__name__}; pass a torch.nn.Module")
    if engine not in ("batched", "sequential"):
        raise ConfigError(f"engine = {engine!r} is unknown; use \"batched\" or \"sequential\"")
    first = next(model.parameters(), None)
    if first is None:
        raise ConfigError("the model has no parameters; pass an nn.Module with trainable parameters")
    if precision not in PRECISIONS:  # the config key's values (fedhv.config.schema)
        raise ConfigError(f"precision = {precision!r} is unknown; use " + " or ".join(f'"{p}"' for p in PRECISIONS))
    if precision == "bf16" and first.dtype != torch.float32:
        raise ConfigError(f"precision = \"bf16\" needs a float32 model (its parameters are {first.dtype}); "
                          "call model.float() or use precision = \"fp32\"")
    check_heads(model, heads, len(data.tasks), needs_heads, explicit=heads != "heads")
    fd = data.federated(first.dtype, first.device)
    adapter = ModuleAdapter(model, fd.task_names, fd.train_x[:2], heads)
    check_model(adapter, fd.train_x, fd.train_y, data.tasks, fd.objective)
    if engine == "batched":
        problem = vmap_problem(adapter, fd.train_x[:2])
        if problem is not None:
            warnings.warn(f"torch.func.vmap cannot run this model ({problem}); using the sequential engine",
                          RuntimeWarning, stacklevel=3)
            engine = "sequential"
    return _Sim(adapter, fd, engine, precision, local or LocalTraining(), aggregation)


def _engine(sim: _Sim, model: nn.Module, seed: int, stream: str, local_steps: int, batch_size: int,
            lr_local: float, momentum: float) -> Engine:
    cls = BatchedEngine if sim.engine_kind == "batched" else SequentialEngine
    return cls(model, sim.data, local_steps=local_steps, batch_size=batch_size, lr_local=lr_local,  # type: ignore[arg-type]
               momentum=momentum, seed=seed, stream=stream, precision=sim.precision, local=sim.local)


def _local(optimizer: str | type, optimizer_options: dict[str, Any] | None, local_epochs: int | None,
           clip_grad_norm: float | None, aggregation: str, momentum: float) -> tuple[LocalTraining, str]:
    if aggregation not in AGGREGATIONS:
        raise ConfigError(f"aggregation = {aggregation!r} is unknown; use \"mean\" (the paper) or \"samples\" "
                          "(weighted by the clients' sample counts)")
    return LocalTraining.of(optimizer, optimizer_options, local_epochs, clip_grad_norm, momentum), aggregation


def _sampleable(data: FederatedData) -> int:
    pool = data.sampleable()
    return data.num_clients if pool is None else len(pool)


def _check(data: FederatedData, clients_per_round: int, rounds: int, train: dict[str, Any]) -> None:
    usable = _sampleable(data)
    if not 1 <= clients_per_round <= usable:
        empty = data.num_clients - usable
        note = f" ({empty} of the {data.num_clients} clients are empty and never sampled)" if empty else ""
        raise ConfigError(f"clients_per_round = {clients_per_round} must be in [1, {usable}] (the clients with "
                          f"samples{note}); lower it")
    if rounds < 0:
        raise ConfigError(f"rounds = {rounds} must be >= 0")
    for key in ("local_steps", "batch_size"):
        value = train[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key} = {value!r} must be an integer >= 1")
    for key in ("lr_local", "momentum"):
        value = train[key]
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{key} = {value!r} must be a finite number >= 0")


def _calibrate(sim: _Sim, rounds: int, margin: float, seeds: tuple[int, ...], lr_global: float,
               clients_per_round: int, report_batches: int | str = "all", progress: bool = False,
               **train: Any) -> CalibrationResult:
    """Uniform-weight rounds per seed whose clients report as FedHV's do (same ``report_batches``)."""
    if rounds < 1 or not seeds or not 0 <= margin < math.inf:
        raise ConfigError(f"calibration rounds = {rounds}, seeds = {list(seeds)}, margin = {margin}: a calibration "
                          "needs rounds >= 1, at least one seed and a finite margin >= 0")
    start = time.perf_counter()
    records: dict[str, list[RoundRecord]] = {}
    theta0 = get_flat(sim.adapter).clone()
    hint = lr_hint(train["lr_local"], lr_global)
    bar = tqdm(total=rounds * len(seeds), desc="calibration", disable=not progress, dynamic_ncols=True,
               mininterval=1.0)
    for seed in seeds:
        rows: list[RoundRecord] = records.setdefault(str(seed), [])

        def on_round(rec: RoundRecord, theta: Any, state: Any, rows: list[RoundRecord] = rows) -> None:
            check_calibration_round(rec.round, rec.skipped, rec.rejected, hint)
            rows.append(rec)
            bar.update(1)

        engine = _engine(sim, copy.deepcopy(sim.adapter), seed, "calibration", **train)
        algorithm = _Uniform(lr_global=lr_global, report=True, report_batches=report_batches)
        run_rounds(algorithm, engine, sim.data, theta0, rounds, clients_per_round, seed, "calibration", on_round,
                   aggregation=sim.aggregation)
    bar.close()
    return calibration_from_records(records, margin, time.perf_counter() - start, seeds)


def calibrate(model: nn.Module, data: FederatedDataset, *, rounds: int = 20, margin: float = 0.15,
              seeds: tuple[int, ...] = (0,), lr_global: float = 1.0, clients_per_round: int | None = None,
              local_steps: int = 10, batch_size: int = 32, lr_local: float = 0.1, momentum: float = 0.0,
              engine: str = "batched", heads: str = "heads", report_batches: int | str = "all",
              precision: str = "fp32", device: str | torch.device | None = None,
              progress: bool = False, optimizer: str | type = "sgd", optimizer_options: dict[str, Any] | None = None,
              local_epochs: int | None = None, clip_grad_norm: float | None = None,
              aggregation: str = "mean") -> CalibrationResult:
    """FedHV's reference from a uniform-weight run: ``r_i = max_{seed, t} F_i^t + margin``.

    Training settings (and ``precision``, ``device``) as in :func:`simulate`; ``report_batches``
    as ``FedHV(report_batches=)`` (how clients compute their reports). The maths is
    :func:`fedhv.experiment.calibration.calibration_from_records`, shared with ``fedhv run``.
    Returns the calibration (``.reference``, ``.max_report``, ``.reports``, bytes, seconds).
    """
    local, agg = _local(optimizer, optimizer_options, local_epochs, clip_grad_norm, aggregation, momentum)
    sim = _prepare(_on_device(model, device), data, engine, heads, precision, False, local, agg)
    cpr = clients_per_round or min(10, _sampleable(sim.data))
    train = {"local_steps": local_steps, "batch_size": batch_size, "lr_local": lr_local, "momentum": momentum}
    _check(sim.data, cpr, rounds, train)
    if rounds < 1:
        raise ConfigError(f"rounds = {rounds} must be >= 1 for a calibration")
    return _calibrate(sim, rounds, margin, tuple(seeds), lr_global, cpr, report_batches, progress, **train)


def simulate(model: nn.Module, data: FederatedDataset, method: Method | None = None, rounds: int = 10, *,
             clients_per_round: int | None = None, local_steps: int = 10, batch_size: int = 32,
             lr_local: float = 0.1, momentum: float = 0.0, seed: int = 0, engine: str = "batched",
             eval_every: int = 1, heads: str = "heads", out: str | Path | None = None, name: str = "custom",
             overwrite: bool = False, precision: str = "fp32", device: str | torch.device | None = None,
             hv_reference: float | Sequence[float] = PAPER_HV_REFERENCE, progress: bool = True,
             callback: Callback | None = None, optimizer: str | type = "sgd",
             optimizer_options: dict[str, Any] | None = None, local_epochs: int | None = None,
             clip_grad_norm: float | None = None, aggregation: str = "mean") -> History:
    """Train ``model`` federatedly on ``data`` with ``method`` for ``rounds`` rounds.

    Each round samples ``clients_per_round`` of the clients with samples (keyed by ``seed``;
    empty clients are never sampled); each runs ``local_steps`` SGD steps (``lr_local``,
    ``momentum``) on ``sum_i w_i l_i`` over minibatches of ``batch_size`` (a client with fewer
    samples repeats them within a batch: :mod:`fedhv.sim.plan`); the server applies the
    method's update ``theta^{t+1} = theta^t + eta_g mean_k Delta_k`` (``eta_g`` = the method's
    ``lr_global``, default 1.0). The test set (if any) is evaluated every ``eval_every``
    rounds and after the last.

    Parameters
    ----------
    model : nn.Module
        ``model(x)`` returns one output ``[B, Task.size]`` per task (list, tuple or dict by
        task name). Not modified; ``History.model`` is a trained copy.
    data : FederatedDataset
    method : FedHV, Uniform, FSMGDA or FedCMOO, default ``FedHV()``
    rounds : int, default 10
    clients_per_round : int, default ``min(10, clients with samples)``
    local_steps, batch_size, lr_local, momentum : default 10, 32, 0.1, 0.0
    seed : int, default 0
        Keys client sampling, minibatches and dropout masks (not the model's initialisation).
    engine : {"batched", "sequential"}, default "batched"
    eval_every : int, default 1
    heads : str, default "heads"
        The submodule holding one head per task (FSMGDA / FedCMOO split encoder and heads
        there; refused when missing for them or when named explicitly).
    out : path, optional
        Writes the run directory of ``fedhv run`` (:mod:`fedhv.api.output`), claimed and
        locked before any work; a directory holding a run is refused (``overwrite=True``
        replaces a finished run, or an unfinished ``simulate`` run no process holds).
    name : str, default "custom"
        The run's ``setting`` in ``config.toml`` and tables.
    precision : {"fp32", "bf16"}, default "fp32"
        ``"bf16"`` runs every forward pass of the clients under bfloat16 autocast with
        float32 parameters (:mod:`fedhv.sim.precision`); evaluation stays in the model's dtype.
    device : str or torch.device, optional
        Where to compute (``"cuda"``, ``"cuda:1"``, ``"cpu"``, ...; default: the model's
        device); the model is copied there and the data moved with it.
    hv_reference : float or sequence of float, default 3.0
        The HV offsets ``r^eval`` of ``HV = prod_i max(r^eval_i - loss_i, 0)`` (paper C.1: 3);
        one for every task or one per task (losses on another scale need their own).
    progress : bool, default True
        A progress bar (stderr) over the calibration and the rounds.
    optimizer : str or torch.optim class, default "sgd"
        The clients' optimizer (``"adam"``, ``torch.optim.AdamW``, ...: :mod:`fedhv.sim.local_opt`);
        ``lr_local`` is its ``lr``, ``momentum`` applies to SGD only.
    optimizer_options : dict, optional
        Its keyword options (``{"weight_decay": 1e-4}``, ``{"betas": (0.9, 0.99)}``, ...).
    local_epochs : int, optional
        Passes over each client's data per round instead of ``local_steps`` steps
        (``K_c = local_epochs * max(1, floor(S_c / batch_size))``).
    clip_grad_norm : float, optional
        Clip each client's gradient to this norm before every step.
    aggregation : {"mean", "samples"}, default "mean"
        The paper's unweighted mean of the updates, or FedAvg's mean weighted by the clients'
        sample counts ``n_k / sum_j n_j`` (reports stay unweighted).
    callback : callable, optional
        ``callback(round, record)`` after every round (``record``: the round's ``rounds.jsonl``
        fields, plus ``"evaluation"`` on evaluated rounds); returning ``True`` stops the run
        after that round (``History.stopped_early``; the run directory is finished with the
        rounds done).
    """
    method = method or FedHV()
    model = _on_device(model, device)
    local, agg = _local(optimizer, optimizer_options, local_epochs, clip_grad_norm, aggregation, momentum)
    sim = _prepare(model, data, engine, heads, precision, bool(getattr(method, "needs_heads", False)), local, agg)
    cpr = clients_per_round or min(10, _sampleable(sim.data))
    train: dict[str, Any] = {"local_steps": local_steps, "batch_size": batch_size, "lr_local": lr_local, "momentum": momentum}
    _check(sim.data, cpr, rounds, train)
    if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 1:
        raise ConfigError(f"eval_every = {eval_every!r} must be an integer >= 1 (evaluate every n rounds)")
    try:
        hv_ref = hv_reference_list(hv_reference, len(data.tasks))
    except ValueError as exc:
        raise ConfigError(f"{exc}; e.g. hv_reference = 3.0") from None
    config = {"setting": name, "method": method.name, "seed": seed, "rounds": rounds, "engine": sim.engine_kind,
              "precision": precision,
              "source": "fedhv.simulate", "model": type(model).__qualname__,
              "train": {"clients_per_round": cpr, "lr_global": method.lr_global, **train, **local.as_dict(),
                        "aggregation": agg},
              "eval": {"test_period": eval_every, "final": True, "hv_reference": hv_ref},
              "tasks": {"names": [t.name for t in data.tasks], "kinds": [t.kind for t in data.tasks],
                        "sizes": [t.size for t in data.tasks],
                        "metrics": [t.metric_info().name for t in data.tasks]},
              method.name: method_options(method)}
    writer = SimRunWriter(out, overwrite) if out is not None else None
    try:
        hist = _simulate(sim, model, data, method, rounds, cpr, seed, eval_every, train, config, writer, hv_ref,
                         progress, callback)
    except BaseException:
        if writer is not None:
            writer.fail()
        raise
    if writer is not None:
        writer.close()
    return hist



def _simulate(sim: _Sim, model: nn.Module, data: FederatedDataset, method: Method, rounds: int, cpr: int, seed: int,
              eval_every: int, train: dict[str, Any], config: dict[str, Any], writer: SimRunWriter | None,
              hv_ref: list[float], progress: bool, callback: Callback | None) -> History:
    """:func:`simulate` after the checks (``writer``: the claimed run directory or None)."""
    start = time.perf_counter()
    cal, reference = None, None
    if isinstance(method, FedHV):
        if method.reference is None:
            cal = _calibrate(sim, method.calibration_rounds, method.margin, tuple(method.calibration_seeds),
                             method.lr_global, cpr, method.report_batches, progress, **train)
            reference = cal.reference
        else:
            reference = [float(v) for v in method.reference]
            if len(reference) != sim.data.num_tasks:
                raise ConfigError(f"FedHV(reference=...) has {len(reference)} values for {sim.data.num_tasks} tasks; "
                                  "give one value per task")
    slices = TaskSlices.of(ParamLayout.of(sim.adapter), sim.data.num_tasks, sim.adapter.head_prefix)
    algorithm = method.build(reference, slices.to(sim.data.train_x.device), seed, cal)  # type: ignore[arg-type]
    metrics = describe_metrics(sim.data.task_names, sim.data.objective)
    if writer is not None:
        writer.start(config, data.provenance(), cal)
    evaluator = copy.deepcopy(sim.adapter)
    records: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    loop_start = time.perf_counter()
    engine_obj = _engine(sim, sim.adapter, seed, "train", **train)
    bar = tqdm(total=rounds, desc=f"{config['setting']} {method.name} s{seed}", disable=not progress,
               dynamic_ncols=True, mininterval=1.0)
    last = {"round": 0, "theta": get_flat(sim.adapter).clone()}

    def on_round(rec: RoundRecord, theta: torch.Tensor, state: Any) -> None:
        entry = None
        if "test" in sim.data.eval_sets and (rec.round % eval_every == 0 or rec.round == rounds):
            t0 = time.perf_counter()
            set_flat(evaluator, theta)
            copy_buffers(evaluator, sim.adapter)
            values = evaluate_record(evaluator, *sim.data.eval_sets["test"], 4096, sim.data.objective, hv_ref)
            entry = {"round": rec.round, **values, "time_eval_s": time.perf_counter() - t0}
            evals.append({"round": rec.round, **values})
            if values["mean_acc"] is not None:
                bar.set_postfix_str(f"MeanAcc {values['mean_acc']:.2f} WorstAcc {values['worst_acc']:.2f}",
                                    refresh=False)
        wall = time.perf_counter() - loop_start
        record = writer.round(rec, wall, entry) if writer is not None else round_record(rec, wall, entry)
        records.append(record)
        last.update(round=rec.round, theta=theta)
        bar.update(1)
        if callback is not None and callback(rec.round, {**record, **({"evaluation": entry} if entry else {})}) is True:
            raise _Stop

    stopped = False
    try:
        theta, _ = run_rounds(algorithm, engine_obj, sim.data, last["theta"], rounds, cpr, seed, "train", on_round,
                              aggregation=sim.aggregation)
    except _Stop:
        theta, stopped = last["theta"], True
    finally:
        bar.close()
    loop_seconds = time.perf_counter() - loop_start
    set_flat(evaluator, theta)
    copy_buffers(evaluator, sim.adapter)
    final = copy.deepcopy(model)
    final.load_state_dict(evaluator.user_state_dict())
    final.eval()
    hist = History(records, evals, final, reference, cal, sim.engine_kind, None, time.perf_counter() - start,
                   tasks=list(sim.data.task_names), task_metrics=metrics, hv_reference=hv_ref, stopped_early=stopped)
    if writer is not None:
        done = int(last["round"])
        writer.finish({**config, "rounds": done}, [t.name for t in data.tasks], final, reference, cal, loop_seconds,
                      hist.seconds, metrics, hv_ref, stopped)
        hist.out = writer.path
    return hist
