"""``fedhv.simulate`` and ``fedhv.calibrate``: a user's model and data on fedhv's one run path.

``simulate`` turns its arguments into a :class:`~fedhv.config.schema.RunConfig` (the method
object contributes its own keys: :meth:`fedhv.methods.FedHV.configure`, ...) and the model
and data into a :class:`~fedhv.data.user.UserBenchmark` registered for the duration of the
call, then runs :func:`fedhv.experiment.runner.run_experiment`, the function ``fedhv run``,
``fedhv grid`` and the Flower ServerApp run. So a run from Python writes the same run
directory, is checked by the same code before round 1 (:mod:`fedhv.checks`), evaluates,
checkpoints and resumes the same way (``resume=RUN_DIR``), and ``fedhv table`` / ``plot``
read it. ``theta^0`` is the module's own parameters (initialise or seed them before
calling); its buffers (BatchNorm statistics) are federated as :mod:`fedhv.sim.engine`
describes. Without ``out`` the run directory is a temporary one, removed at the end.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import tomllib
import torch
from torch import nn

from fedhv.api.arguments import as_device, as_method, as_seed, plain_int, plain_numbers, real, shared_parameters
from fedhv.api.arguments import clients_per_round as check_clients_per_round
from fedhv.api.arguments import hv_reference as check_hv_reference
from fedhv.api.dataset import FederatedDataset
from fedhv.api.history import History
from fedhv.config.schema import (
    AGGREGATIONS,
    PRECISIONS,
    CalibrationConfig,
    DataConfig,
    DiagnosticsConfig,
    EvalConfig,
    PartitionConfig,
    RunConfig,
    TrainConfig,
)
from fedhv.config.validation import validate
from fedhv.data.user import UserBenchmark
from fedhv.errors import ConfigError
from fedhv.experiment.calibration import CalibrationResult, load_calibration
from fedhv.experiment.problem import OBJECTS_SOURCE, Problem
from fedhv.experiment.runner import RunHooks, resume_experiment, run_experiment
from fedhv.methods import FedHV, Method
from fedhv.metrics.summary import PAPER_HV_REFERENCE
from fedhv.registry import METHODS
from fedhv.safe_io import read_regular
from fedhv.sim.local_opt import LocalTraining

__all__ = ["History", "calibrate", "simulate"]

#: ``callback(round, record) -> bool | None``: ``record`` is the round's ``rounds.jsonl``
#: record with its evaluation (``"evaluation"``, the ``metrics.jsonl`` fields) on evaluated
#: rounds; returning ``True`` stops the run after that round.
Callback = Callable[[int, dict[str, Any]], Any]

#: ``config.toml``'s ``source`` of a run started here.
SOURCE = OBJECTS_SOURCE
_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


def _base_config(model: nn.Module, data: FederatedDataset, name: str, rounds: int, clients_per_round: int | None,
                 train: dict[str, Any], seed: int, engine: str, precision: str, device: str | torch.device | None,
                 eval_every: int, hv_reference: float | Sequence[float]) -> RunConfig:
    """The run's configuration before the method's keys (:meth:`Method.configure`)."""
    if not isinstance(data, FederatedDataset):
        raise ConfigError(f"data has type {type(data).__name__}; build it with fedhv.FederatedDataset.from_tensors "
                          "or .from_datasets")
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model has type {type(model).__name__}; pass a torch.nn.Module")
    dev = as_device(model, device)
    dtype = next(model.parameters()).dtype
    if dtype not in _DTYPES:
        raise ConfigError(f"the model's parameters are {dtype}; use a float32 or float64 model (precision=\"bf16\" "
                          "runs the forward passes in bfloat16)")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision = {precision!r} is unknown; use " + " or ".join(f'"{p}"' for p in PRECISIONS))
    if precision == "bf16" and dtype != torch.float32:
        raise ConfigError(f"precision = \"bf16\" needs a float32 model (its parameters are {dtype}); call "
                          "model.float() or use precision = \"fp32\"")
    if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 1:
        raise ConfigError(f"eval_every = {eval_every!r} must be an integer >= 1 (evaluate every n rounds)")
    for key in ("local_steps", "batch_size"):
        if isinstance(train[key], bool) or not isinstance(train[key], int) or train[key] < 1:
            raise ConfigError(f"{key} = {train[key]!r} must be an integer >= 1")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"rounds = {rounds!r} must be an integer >= 1")
    sizes = data.client_sizes
    cpr = check_clients_per_round(clients_per_round, sizes)
    ref = check_hv_reference(hv_reference, len(data.tasks))
    seed = as_seed("seed", seed)
    test = data.test is not None
    return RunConfig(
        setting=name, seed=seed, rounds=rounds, engine=engine, precision=precision, device=dev, dtype=_DTYPES[dtype],
        data=DataConfig(benchmark=f"{SOURCE}/{name}"),
        # the dataset's own partition is used; these two keys describe it for the checks
        partition=PartitionConfig(clients=len(sizes), samples_per_client=max([*sizes, train["batch_size"]])),
        train=TrainConfig(clients_per_round=cpr, **train),
        eval=EvalConfig(test_period=eval_every if test else 0, final=test, batch_size=4096, hv_reference=ref),
        calibration=CalibrationConfig(), source=SOURCE,
    )


def _check_shared(model: nn.Module, cfg: RunConfig) -> None:
    """Refuse parameters registered under two names (one head for two tasks) where they cannot run.

    They run on the sequential engine with FedHV / Uniform only: the batched engine stacks
    every name's copy, and FSMGDA / FedCMOO need each task's own head parameters.
    """
    pairs = shared_parameters(model)
    if not pairs:
        return
    first, other = pairs[0]
    names = f"{first!r} and {other!r}" + (f" (and {len(pairs) - 1} more)" if len(pairs) > 1 else "")
    if METHODS.get(cfg.method).needs_heads:
        raise ConfigError(f"method = {cfg.method}: the model shares one parameter as {names}; the method splits "
                          "the model into encoder and task heads and needs each task's own head: give every task its "
                          "own head module")
    if cfg.engine == "batched":
        raise ConfigError(f"engine = \"batched\" cannot train a model that shares one parameter as {names} (e.g. one "
                          "head for two tasks); pass engine=\"sequential\", or give every task its own head module")


def _train_keys(local_steps: int, batch_size: int, lr_local: float, momentum: float, optimizer: str | type,
                optimizer_options: dict[str, Any] | None, local_epochs: int | None, clip_grad_norm: float | None,
                aggregation: str) -> dict[str, Any]:
    """``[train]`` keys of the API's local-training arguments (checked by :meth:`LocalTraining.of`)."""
    if aggregation not in AGGREGATIONS:
        raise ConfigError(f"aggregation = {aggregation!r} is unknown; use \"mean\" (the paper) or \"samples\" "
                          "(weighted by the clients' sample counts)")
    lr_local, momentum = real("lr_local", lr_local, "0.1"), real("momentum", momentum, "0.9")
    local = LocalTraining.of(optimizer, optimizer_options, local_epochs, clip_grad_norm, momentum)
    return {"local_steps": local_steps, "batch_size": batch_size, "lr_local": lr_local, "momentum": momentum,
            "optimizer": local.optimizer, "optimizer_options": dict(local.options),
            "local_epochs": local.local_epochs, "clip_grad_norm": local.clip_grad_norm, "aggregation": aggregation}


def _benchmark(model: nn.Module, data: FederatedDataset, heads: str, device: str) -> UserBenchmark:
    first = next(model.parameters())
    module = model if first.device == torch.device(device) else copy.deepcopy(model).to(device)
    return UserBenchmark(tasks=data.tasks, train=None, test=None, model=module, heads=heads, dataset=data,
                         initialise=False)


def _history(path: Path, summary: dict[str, Any], model: nn.Module, device: str, seconds: float) -> History:
    """The run directory ``path`` as a :class:`History`."""
    def lines(name: str) -> list[dict[str, Any]]:
        file = path / name
        return [json.loads(line) for line in file.read_text().splitlines() if line.strip()] if file.exists() else []

    final = copy.deepcopy(model).to(device)
    state = torch.load(path / "model.pt", map_location=device, weights_only=True)["state_dict"]
    final.load_state_dict(state)
    final.eval()
    cal = load_calibration(path / "calibration.json") if (path / "calibration.json").exists() else None
    return History(lines("rounds.jsonl"), lines("metrics.jsonl"), final, summary.get("reference"), cal,
                   str(summary.get("engine")), path, seconds, tasks=list(summary.get("tasks") or []),
                   task_metrics=list(summary.get("task_metrics") or []),
                   hv_reference=list(summary.get("hv_reference") or []),
                   stopped_early=bool(summary.get("stopped_early", False)))


def _resume_check(path: Path, cfg: RunConfig, digest: str) -> None:
    """A resume must be given the run's own configuration (device aside) and data."""
    try:
        # Regular files only, no links, bounded (fedhv.safe_io): a FIFO planted in a received run never hangs.
        stored = tomllib.loads(read_regular(path / "config.toml").decode("utf-8"))
        env = json.loads(read_regular(path / "environment.json"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"resume = {str(path)!r} is not a run directory of fedhv.simulate ({exc})") from None
    if stored.get("source") != SOURCE:
        raise ConfigError(f"resume = {str(path)!r} was not started by fedhv.simulate; continue it with "
                          f"`fedhv run --resume {path}`")
    from fedhv.config import to_dict

    mine = to_dict(dataclasses.replace(cfg, device=stored.get("device", cfg.device)))
    differ = sorted(k for k in set(mine) | set(stored) if mine.get(k) != stored.get(k))
    if differ:
        raise ConfigError(f"resume = {str(path)!r}: the arguments differ from the run's config.toml in {differ}; "
                          "pass the ones the run was started with")
    if (env.get("data") or {}).get("digest") != digest:
        raise ConfigError(f"resume = {str(path)!r}: the data differs from the run's (SHA-256 of x, targets, partition "
                          "and test set); pass the FederatedDataset the run was started with")


def _with_diagnostics(cfg: RunConfig, diagnostics: bool | dict[str, Any]) -> RunConfig:
    """``cfg`` with ``[diagnostics]`` from :func:`simulate`'s ``diagnostics`` argument."""
    if diagnostics is False:
        return cfg
    options = {} if diagnostics is True else diagnostics
    if not isinstance(options, dict):
        raise ConfigError(f"diagnostics = {diagnostics!r} must be True, False or a dict of [diagnostics] options, "
                          "e.g. {\"probe_samples\": 512}")
    known = {f.name for f in dataclasses.fields(DiagnosticsConfig)} - {"enabled"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"diagnostics = {diagnostics!r}: unknown option(s) {', '.join(unknown)}; "
                          f"choose from {', '.join(sorted(known))}")
    return dataclasses.replace(cfg, diagnostics=DiagnosticsConfig(enabled=True, **options))


def simulate(model: nn.Module, data: FederatedDataset, method: Method | None = None, rounds: int = 10, *,
             clients_per_round: int | None = None, local_steps: int = 10, batch_size: int = 32,
             lr_local: float = 0.1, momentum: float = 0.0, seed: int = 0, engine: str = "batched",
             eval_every: int = 1, heads: str = "heads", out: str | Path | None = None, name: str = "custom",
             overwrite: bool = False, precision: str = "fp32", device: str | torch.device | None = None,
             hv_reference: float | Sequence[float] = PAPER_HV_REFERENCE, progress: bool = True,
             callback: Callback | None = None, optimizer: str | type = "sgd",
             optimizer_options: dict[str, Any] | None = None, local_epochs: int | None = None,
             clip_grad_norm: float | None = None, aggregation: str = "mean",
             resume: str | Path | None = None, diagnostics: bool | dict[str, Any] = False,
             engine_chunk: int | str = "auto") -> History:
    """Train ``model`` federatedly on ``data`` with ``method`` for ``rounds`` rounds.

    Each round samples ``clients_per_round`` of the clients with samples (keyed by ``seed``;
    empty clients are never sampled); each runs ``local_steps`` steps of the local optimizer on
    ``sum_i w_i l_i`` over minibatches of ``batch_size`` (a client with fewer samples repeats
    them within a batch: :mod:`fedhv.sim.plan`); the server applies the method's update
    ``theta^{t+1} = theta^t + eta_g mean_k Delta_k`` (``eta_g`` = the method's ``lr_global``,
    default 1.0). The test set (if any) is evaluated every ``eval_every`` rounds and after the
    last.

    Parameters
    ----------
    model : nn.Module
        ``model(x)`` returns one output ``[B, Task.size]`` per task (list, tuple or dict by
        task name); float32 or float64. Not modified; ``History.model`` is a trained copy.
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
        The run directory (that of ``fedhv run``), claimed and locked before any work; a
        directory holding a run is refused (``overwrite=True`` replaces a finished run, or an
        unfinished ``simulate`` run no process holds). Default: a temporary directory.
    name : str, default "custom"
        The run's ``setting`` in ``config.toml`` and tables.
    precision : {"fp32", "bf16"}, default "fp32"
        ``"bf16"`` runs the clients' forward passes under bfloat16 autocast (float32 model).
    device : str or torch.device, optional
        Where to compute (``"cuda"``, ``"cuda:1"``, ``"cpu"``, ...; default: the model's device).
    hv_reference : float or sequence of float, default 3.0
        HV offsets ``r^eval`` (paper C.1: 3); one for every task or one per task.
    progress : bool, default True
        Progress bars (stderr) over the calibration and the rounds.
    callback : callable, optional
        ``callback(round, record)`` after every round (``record``: the ``rounds.jsonl`` fields,
        plus ``"evaluation"`` on evaluated rounds); returning ``True`` stops the run there.
    optimizer, optimizer_options, local_epochs, clip_grad_norm
        The clients' local optimisation (:mod:`fedhv.sim.local_opt`): a ``torch.optim`` class
        or name with its options (``lr`` is ``lr_local``; ``momentum`` is SGD's), passes over
        the client's data instead of steps, per-client gradient clipping by norm.
    aggregation : {"mean", "samples"}, default "mean"
        The paper's unweighted mean of the updates, or FedAvg's mean weighted by sample counts.
    resume : path, optional
        Continue the unfinished ``simulate`` run in this directory from its last checkpoint,
        given the same model class, data and arguments (refused otherwise).
    diagnostics : bool or dict, default False
        Measure the paper's theory quantities and per-client fairness at each evaluation
        (``docs/diagnostics.md``; they land in ``History.evaluations[k]["diagnostics"]``): ``True``,
        or the ``[diagnostics]`` options, e.g. ``{"probe_samples": 512, "period": 5}``.
    engine_chunk : int or "auto", default "auto"
        Model copies the batched engine trains at once (``0`` = all; ``"auto"``: as many as fit
        half the available memory), the configuration's ``engine_chunk``.

    Every argument is checked before round 1 (one-line :class:`~fedhv.errors.ConfigError`
    naming it, its value and the fix): unknown or unavailable devices, method names or
    classes instead of method objects, seeds, ``clients_per_round`` out of range (``0``
    included; ``None`` is the default), ``hv_reference`` of another length, a test set the
    model cannot take, integer model outputs, a train-mode batch the model cannot take
    (BatchNorm with ``batch_size = 1``), parameters shared between heads (see ``docs/api.md``).
    """
    start = time.perf_counter()
    method = as_method(method)
    # numpy integers (a loop over np.arange, a config read by pandas) are the integers they hold
    rounds, local_steps, batch_size, eval_every = map(plain_int, (rounds, local_steps, batch_size, eval_every))
    train = _train_keys(local_steps, batch_size, lr_local, momentum, optimizer, optimizer_options, local_epochs,
                        clip_grad_norm, aggregation)
    cfg = method.configure(_base_config(model, data, name, rounds, clients_per_round, train, seed, engine, precision,
                                        device, eval_every, hv_reference))
    cfg = plain_numbers(dataclasses.replace(_with_diagnostics(cfg, diagnostics), engine_chunk=engine_chunk))
    _check_shared(model, cfg)
    digest = data.digest()
    ub = _benchmark(model, data, heads, cfg.device)
    temp = None
    if resume is not None:
        path = Path(resume)
        _resume_check(path, cfg, digest)
    elif out is None:
        temp = Path(tempfile.mkdtemp(prefix="fedhv-simulate-"))
        path = temp / "run"
    else:
        path = Path(out)
    hint = ("the checkpoint goes with the temporary run directory: pass out=DIR to fedhv.simulate to be able to "
            "resume an interrupted run" if temp is not None else
            f"continue with fedhv.simulate(..., resume={str(path)!r}) and the same model, data and arguments")
    hooks = RunHooks(on_round=callback, resume_hint=hint)
    try:
        validate(cfg)
        problem = Problem.given(cfg.data.benchmark, ub)  # the user's objects, passed through as they are
        if resume is not None:
            summary = resume_experiment(path, progress, cfg.device, hooks=hooks, problem=problem, method=method)
        else:
            summary = run_experiment(cfg, path, progress, overwrite=overwrite, hooks=hooks, problem=problem,
                                     method=method)
        hist = _history(path, summary, model, cfg.device, time.perf_counter() - start)
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    if temp is not None:
        hist.out = None
    hist.client_ids = list(data.client_ids)
    return hist


def calibrate(model: nn.Module, data: FederatedDataset, *, rounds: int = 20, margin: float = 0.15,
              seeds: tuple[int, ...] = (0,), lr_global: float = 1.0, clients_per_round: int | None = None,
              local_steps: int = 10, batch_size: int = 32, lr_local: float = 0.1, momentum: float = 0.0,
              engine: str = "batched", heads: str = "heads", report_batches: int | str = "all",
              precision: str = "fp32", device: str | torch.device | None = None,
              progress: bool = False, optimizer: str | type = "sgd", optimizer_options: dict[str, Any] | None = None,
              local_epochs: int | None = None, clip_grad_norm: float | None = None,
              aggregation: str = "mean") -> CalibrationResult:
    """FedHV's reference from a uniform-weight run: ``r_i = max_{seed, t} F_i^t + margin``.

    Training settings as in :func:`simulate`; ``report_batches`` as ``FedHV(report_batches=)``.
    The calibration ``fedhv run`` runs (:func:`fedhv.experiment.calibration.calibrate`).
    Returns the calibration (``.reference``, ``.max_report``, ``.reports``, bytes, seconds).
    """
    from fedhv.experiment.calibration import calibrate as run_calibration
    from fedhv.experiment.runner import _bar_factory

    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"rounds = {rounds!r} must be >= 1 for a calibration")
    train = _train_keys(local_steps, batch_size, lr_local, momentum, optimizer, optimizer_options, local_epochs,
                        clip_grad_norm, aggregation)
    method = FedHV(lr_global, None, report_batches=report_batches, calibration_rounds=rounds, margin=margin,
                   calibration_seeds=tuple(seeds))
    cfg = plain_numbers(method.configure(_base_config(model, data, "calibration", 1, clients_per_round, train, 0,
                                                      engine, precision, device, 1, PAPER_HV_REFERENCE)))
    if not 0 <= margin < float("inf") or not seeds:
        raise ConfigError(f"margin = {margin}, seeds = {list(seeds)}: a calibration needs a finite margin >= 0 and "
                          "at least one seed")
    validate(cfg)
    problem = Problem.given(cfg.data.benchmark, _benchmark(model, data, heads, cfg.device))
    return run_calibration(cfg, problem.data(cfg), _bar_factory(progress), problem=problem)

