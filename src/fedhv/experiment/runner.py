"""Run one configured experiment into a run directory."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm  # type: ignore[import-untyped]

from fedhv.algorithms.method import Method
from fedhv.code_digest import code_record
from fedhv.config import dumps, to_dict
from fedhv.config.flower import refuse_in_simulator, refuse_on_flower
from fedhv.config.loader import config_from_toml_text
from fedhv.config.schema import RunConfig
from fedhv.data.federated import FederatedData
from fedhv.diagnostics import Diagnostics
from fedhv.errors import ConfigError
from fedhv.experiment.accounting import RunTotals
from fedhv.experiment.calibration import CalibrationResult, load_calibration
from fedhv.experiment.checkpoint import (
    CHECKPOINT_FILE,
    Checkpoint,
    ResumeError,
    check_checkpoint,
    config_digest,
    global_rng_state,
    load_checkpoint,
    restore_global_rng,
    save_checkpoint,
    truncate_jsonl,
)
from fedhv.experiment.code_check import check_resume_code
from fedhv.experiment.divergence import DivergenceError
from fedhv.experiment.environment import (
    chunk_record,
    environment,
    kernel_fingerprint,
    recorded_kernels,
    recorded_threads,
)
from fedhv.experiment.kill_point import pause_for_tests
from fedhv.experiment.loop import FederationFactory, RoundRecord, run_rounds
from fedhv.experiment.method_setup import MethodSetup, add_diagnostics_reference, build_method
from fedhv.experiment.problem import Problem
from fedhv.experiment.records import (  # noqa: F401 - evaluate, summarize re-exported
    evaluate,
    evaluated_splits,
    evaluation_entry,
    restore_buffers,
    summarize,
    write_model,
)
from fedhv.experiment.setup import make_engine
from fedhv.experiment.signals import Terminated, signals_deferred, sigterm_as_interrupt  # noqa: F401 - re-exported
from fedhv.metrics.evaluate import describe_metrics
from fedhv.models import get_flat, set_flat
from fedhv.models.params import copy_buffers
from fedhv.results.rundir import RUN_FILES, JsonlWriter, RunDir
from fedhv.results.runfiles import read_bytes_nofollow
from fedhv.sim.faults import FaultInjector

log = logging.getLogger("fedhv")


def claim_run_dir(cfg: RunConfig, out: str | Path | None = None, overwrite: bool = False) -> RunDir:
    """Create and lock the run directory of a new run of ``cfg``.

    ``out=None`` gives a new ``runs/<setting>-<method>-s<seed>-<time>[-k]``; otherwise
    see :meth:`RunDir.create` (refuses an empty name, a file, a directory holding a run
    unless ``overwrite`` and it is finished, and a directory in use).
    """
    if out is None:
        return RunDir.create_default(cfg.setting, cfg.method, cfg.seed)
    # a run started from Python (cfg.source) may replace an unfinished run of the same source
    return RunDir.create(out, overwrite=overwrite, replace_unfinished=cfg.source)


def eval_due(round_done: int, cfg: RunConfig) -> bool:
    """Whether the test set is evaluated after ``round_done`` rounds (1-based)."""
    period = cfg.eval.test_period
    return (period > 0 and round_done % period == 0) or (cfg.eval.final and round_done == cfg.rounds)


def _bar_factory(enabled: bool) -> Callable[[int, str], tqdm]:
    """Progress bars for sub-tasks such as calibration (disabled when quiet)."""
    return lambda total, desc: tqdm(total=total, desc=desc, disable=not enabled, dynamic_ncols=True, mininterval=1.0)


def _fmt(values: list[float], digits: int = 3) -> str:
    return "/".join(f"{v:.{digits}f}" for v in values)


@dataclasses.dataclass
class RunHooks:
    """In-process callbacks of a run (:func:`fedhv.simulate`).

    ``on_round(round, record)`` runs after each round is written (and checkpointed when
    due), with the ``rounds.jsonl`` record plus ``"evaluation"`` (the ``metrics.jsonl``
    entry) on evaluated rounds; returning ``True`` ends the run there: ``model.pt`` and
    ``summary.json`` are written for the rounds done (``summary.json``: ``stopped_early``).
    """

    on_round: Callable[[int, dict[str, Any]], Any] | None = None
    #: Progress of sub-tasks (the calibration): ``(total, description) -> bar`` with ``update()`` and
    #: ``close()``, used instead of a tqdm bar (a Flower ServerApp logs its progress this way).
    progress: Callable[[int, str], Any] | None = None
    #: How to continue an interrupted run, after "checkpoint written at round N; " (default: the CLI's
    #: ``fedhv run --resume DIR``; :func:`fedhv.simulate` names its own ``resume=`` argument).
    resume_hint: str | None = None


class _StopRun(Exception):
    """An ``on_round`` hook asked to end the run after the round it saw."""


def checkpoint_due(round_done: int, cfg: RunConfig) -> bool:
    """Whether a checkpoint is written after ``round_done`` rounds."""
    c = cfg.checkpoint
    if not c.enabled:
        return False
    return eval_due(round_done, cfg) or round_done == cfg.rounds or (c.period > 0 and round_done % c.period == 0)


def _prepare(cfg: RunConfig, progress: bool, calibration: CalibrationResult | None,
             federation_factory: FederationFactory | None = None, resume: Path | None = None,
             hooks: RunHooks | None = None, problem: Problem | None = None, method: Method | None = None,
             ) -> tuple[FederatedData, MethodSetup, Problem]:
    """Threads, the problem (``cfg``'s unless given), its data and the built method (``method`` passed
    through when given; calibrating unless ``calibration`` is given).

    Every run and resume starts here, so this is where the simulator (no ``federation_factory``)
    refuses ``flower.secure_aggregation = true`` (:func:`fedhv.config.flower.refuse_in_simulator`).
    """
    if federation_factory is None:
        refuse_in_simulator(cfg, None if resume is None else str(resume))
    else:  # what only the simulator runs (the ServerApp refused it before its handshake already)
        refuse_on_flower(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    problem = problem.for_config(cfg) if problem is not None else Problem.of(cfg)
    data = problem.data(cfg)
    evaluated_splits(cfg, data)  # a named set the data lacks is refused before the calibration
    bars = hooks.progress if hooks is not None and hooks.progress is not None else _bar_factory(progress)
    setup = build_method(cfg, data, bars, calibration, federation_factory, method, problem)
    if cfg.diagnostics.enabled:
        add_diagnostics_reference(cfg, data, setup, bars, calibration, problem)
    return data, setup, problem


def run_experiment(cfg: RunConfig, out: str | Path | RunDir | None = None, progress: bool = True,
                   calibration: CalibrationResult | None = None, overwrite: bool = False,
                   federation_factory: FederationFactory | None = None,
                   hooks: RunHooks | None = None, *, problem: Problem | None = None,
                   method: Method | None = None) -> dict[str, Any]:
    """Train ``cfg.method`` on ``cfg``'s setting and write the run directory.

    Parameters
    ----------
    out : str, Path or RunDir, optional
        The run directory: a path (created; refused when it holds any of
        :data:`~fedhv.results.rundir.RUN_FILES` or another process holds its lock), a
        :class:`RunDir` already claimed with :func:`claim_run_dir`, or ``None`` for a
        new default name. The directory stays locked until the run ends.
    calibration : CalibrationResult, optional
        Reuse this calibration instead of running one (FedHV with
        ``fedhv.reference = "calibrate"``).
    overwrite : bool
        Replace a *finished* run in ``out`` (never an unfinished one).
    federation_factory : FederationFactory, optional
        Serve the rounds (and a FedHV calibration) from another back-end, e.g. Flower
        (:mod:`fedhv.flower.server`); default: the simulator.
    problem : Problem, optional
        The data and model factory (:mod:`fedhv.experiment.problem`); default: the one
        ``data.benchmark`` names. :func:`fedhv.simulate` passes the user's objects.
    method : Method, optional
        The method object (of ``cfg.method``'s class) to build; default: the one ``cfg`` describes.

    Returns
    -------
    dict
        The run summary (also written to ``summary.json``).
    """
    start = time.perf_counter()
    # The directory is claimed and locked first, so a bad --out fails before any data is
    # loaded; everything that can fail on bad input (data files, reference checks,
    # calibration) happens before any run file is written, and a failed start removes
    # what it created, so it leaves nothing behind.
    run = out if isinstance(out, RunDir) else claim_run_dir(cfg, out, overwrite)
    with sigterm_as_interrupt():
        try:
            data, setup, problem = _prepare(cfg, progress, calibration, federation_factory, hooks=hooks,
                                            problem=problem, method=method)
            run.write_text("config.toml", dumps(to_dict(cfg)))
            # a federation factory may say what its clients serve (Flower: each node's data)
            env = environment(data.provenance, getattr(federation_factory, "provenance", None))
            code = code_record(cfg.data.benchmark)  # the module data.benchmark names: its source digest
            run.write_json("environment.json", env if code is None else {**env, "code": code})
            calibration_done = setup.calibration or setup.diagnostics_calibration
            if calibration_done is not None:
                run.write_json("calibration.json", calibration_done.as_dict())
        except BaseException:
            for name in ("calibration.json", "environment.json", "config.toml"):
                with contextlib.suppress(OSError):
                    (run.path / name).unlink(missing_ok=True)
            run.abandon()
            raise
        return _train(cfg, run, data, setup, None, start, progress, federation_factory, hooks=hooks,
                      problem=problem)


def resume_experiment(run_dir: str | Path | RunDir, progress: bool = True, device: str | None = None,
                      federation_factory: FederationFactory | None = None,
                      hooks: RunHooks | None = None, accept_changed_code: bool = False, *,
                      problem: Problem | None = None, method: Method | None = None) -> dict[str, Any]:
    """Continue an interrupted run to its configured number of rounds.

    The run restarts from its last checkpoint (round 0 when it has none, reusing its
    calibration); records written after the checkpoint, and a torn last line, are
    removed from ``rounds.jsonl`` and ``metrics.jsonl`` first. The result equals that
    of an uninterrupted run, timing fields aside. ``device`` (e.g. ``"cpu"`` for a run
    started on a GPU) overrides the configured device; the checkpoint is device-free.

    The run directory is locked (``.lock``) before anything in it is read or truncated:
    a directory another process is writing fails at once with
    :class:`~fedhv.results.rundir.RunDirBusy`. Unless ``threads`` is configured, torch
    uses the thread count recorded in ``environment.json`` (results are bit-exact only
    with the same count), with one line saying so when that changes it.

    A run naming ``data.benchmark = "module:attr"`` first logs the module and file it imports, and is
    refused when that module's source changed since the run began (:mod:`fedhv.experiment.code_check`)
    unless ``accept_changed_code``. ``run_dir`` may be a :class:`RunDir` this process already holds.
    ``problem`` and ``method``: as for :func:`run_experiment` (the run's own objects).
    """
    run = run_dir if isinstance(run_dir, RunDir) else None
    path = run.path if run is not None else Path(run_dir)  # type: ignore[arg-type]
    if not (path / "config.toml").is_file():  # a link is refused by RunDir, naming it
        raise ResumeError(f"{path} is not a fedhv run directory (no config.toml); give the directory of a run")
    run = run if run is not None else RunDir(path)
    try:
        with sigterm_as_interrupt():
            return _resume(path, run, progress, device, federation_factory, hooks, accept_changed_code, problem,
                           method)
    finally:
        run.close()


def _resume(path: Path, run: RunDir, progress: bool, device: str | None = None,
            federation_factory: FederationFactory | None = None, hooks: RunHooks | None = None,
            accept_changed_code: bool = False, problem: Problem | None = None,
            method: Method | None = None) -> dict[str, Any]:
    """:func:`resume_experiment` with ``path`` locked by ``run``."""
    config_path = path / "config.toml"
    if (path / "summary.json").exists():
        summary = json.loads(read_bytes_nofollow(path / "summary.json"))
        log.info("%s is already complete (summary.json exists); nothing to resume", path)
        return summary
    text = read_bytes_nofollow(config_path).decode("utf-8", errors="replace")
    check_resume_code(path, text, accept_changed_code)  # before the configuration's check imports it
    cfg = config_from_toml_text(text, device)
    threads = None if cfg.threads else recorded_threads(path)
    cores = os.cpu_count() or 1
    if threads is not None and threads > cores:  # an edited or foreign environment.json: never oversubscribe
        log.warning("resume: environment.json records %d torch threads but this machine has %d cores; using %d "
                    "(the resume will not be bit-exact)", threads, cores, cores)
        threads = cores
    if threads is not None and threads != torch.get_num_threads():
        log.warning("resume: using %d torch threads as recorded in environment.json (not %d): a resume is "
                    "exact only with the run's thread count", threads, torch.get_num_threads())
        torch.set_num_threads(threads)
    recorded = recorded_kernels(path)
    if recorded is not None and recorded != (now := kernel_fingerprint()):
        log.warning("resume: this machine's float kernels %s differ from the run's %s (environment.json): the "
                    "resumed rounds will not equal an uninterrupted run bit for bit", now, recorded)
    ckpt = load_checkpoint(path)
    if ckpt is not None and ckpt.config_sha256 != config_digest(text):
        raise ResumeError(
            f"{config_path} changed after the checkpoint was written; restore it or start a new run"
        )
    start = time.perf_counter()
    calibration = None
    if (path / "calibration.json").exists():
        calibration = load_calibration(path / "calibration.json")  # verifies its digest
    data, setup, problem = _prepare(cfg, progress, calibration, federation_factory, path, hooks=hooks,
                                    problem=problem, method=method)
    if ckpt is not None:  # round range, model size, state kind and task count
        check_checkpoint(ckpt, path / CHECKPOINT_FILE, cfg.rounds, get_flat(problem.model(cfg, data, cfg.seed)).numel(),
                         setup.algorithm.init_state(data.num_tasks), getattr(setup.algorithm, "check_state", None))
    for stale in path.glob(".*.*"):  # temporary files of writes cut short by a kill
        if stale.name.startswith(tuple(f".{name}." for name in RUN_FILES)):
            stale.unlink(missing_ok=True)
    offsets = ckpt.offsets if ckpt is not None else {"rounds.jsonl": 0, "metrics.jsonl": 0}
    for name, offset in offsets.items():
        note = truncate_jsonl(path / name, offset).describe(name)
        if note:
            log.warning("resume: %s", note)
    done = 0 if ckpt is None else ckpt.round
    log.warning("resuming %s at round %d of %d", path, done, cfg.rounds)
    resumed = {"round": done, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "device": cfg.device,
               "torch_threads": torch.get_num_threads(), "kernels": kernel_fingerprint()}
    return _train(cfg, run, data, setup, ckpt, start, progress, federation_factory, resumed, hooks, problem)


def _diagnostics(cfg: RunConfig, data: FederatedData, setup: MethodSetup, path: Path, ckpt: Checkpoint | None,
                 evaluator: torch.nn.Module, engine: Any, theta: torch.Tensor) -> Diagnostics | None:
    """The run's :class:`~fedhv.diagnostics.Diagnostics` (``None`` unless ``diagnostics.enabled``),
    restored from the kept ``metrics.jsonl`` entries when resuming from ``ckpt``."""
    if not cfg.diagnostics.enabled:
        return None
    assert setup.diagnostics_reference is not None
    diagnostics = Diagnostics(cfg.diagnostics, data, setup.diagnostics_reference, cfg.section("fedhv").rho_clip,
                              cfg.eval.batch_size)
    if ckpt is not None:
        from fedhv.results.collect import read_records

        set_flat(evaluator, theta)
        copy_buffers(evaluator, engine.model)
        diagnostics.restore(read_records(path / "metrics.jsonl"), ckpt.round, evaluator)
    return diagnostics


def _train(cfg: RunConfig, run: RunDir, data: FederatedData, setup: MethodSetup, ckpt: Checkpoint | None,
           start: float, progress: bool, federation_factory: FederationFactory | None = None,
           resumed: dict[str, Any] | None = None, hooks: RunHooks | None = None,
           problem: Problem | None = None) -> dict[str, Any]:
    """The round loop with evaluation, logging and checkpoints, then the final files.

    The engine's chunking (:func:`chunk_record`, machine-dependent) goes to ``environment.json``
    (a fresh run) or to the run's ``resumes.jsonl`` record ``resumed`` (a resume).
    """
    try:
        run.open_logs()
        problem = problem if problem is not None else Problem.of(cfg)
        model = problem.model(cfg, data, cfg.seed)
        evaluator = problem.model(cfg, data, cfg.seed).eval()
        engine = make_engine(cfg, model, data, cfg.seed, stream="train")
        if federation_factory is not None and engine.buffers and cfg.flower.secure_aggregation:
            raise ConfigError(f"the model has buffers ({', '.join(engine.buffer_names[:3])}, ...): secure aggregation "
                              "returns only the mean of the masked updates, not the clients' buffers; set "
                              "flower.secure_aggregation = false or use a buffer-free normalisation (GroupNorm)")
        chunking = {} if federation_factory is not None else {"engine_chunk": chunk_record(cfg, engine)}
        if resumed is None:  # (a federation's clients train elsewhere: nothing to record)
            if chunking:
                env = json.loads(read_bytes_nofollow(run.path / "environment.json"))
                run.write_json("environment.json", {**env, **chunking})
        else:
            resumes = JsonlWriter(run.path / "resumes.jsonl")
            resumes.append({**resumed, **chunking})
            resumes.close()
        faults = FaultInjector(**dataclasses.asdict(cfg.faults), seed=cfg.seed, stream="train")
        sha = config_digest(read_bytes_nofollow(run.path / "config.toml").decode("utf-8", errors="replace"))
        if ckpt is None:
            theta, state, totals, last_eval = get_flat(model).clone(), None, RunTotals(), {}
            done, elapsed = 0, 0.0
        else:
            theta = ckpt.theta.to(device=cfg.device, dtype=get_flat(model).dtype)
            state, totals, last_eval = ckpt.state, RunTotals(**ckpt.totals), dict(ckpt.last_eval)
            done, elapsed = ckpt.round, ckpt.elapsed_s
            restore_global_rng(ckpt.rng)
            restore_buffers(engine, ckpt.buffers, run.path)
        diagnostics = _diagnostics(cfg, data, setup, run.path, ckpt, evaluator, engine, theta)
        bar = tqdm(total=cfg.rounds, initial=done, desc=f"{cfg.setting} {cfg.method} s{cfg.seed}",
                   disable=not progress, dynamic_ncols=True, mininterval=1.0)
        loop_start = time.perf_counter() - elapsed
        saved = {"round": done}
        latest: dict[str, Any] = {}

        def checkpoint(round_done: int, theta_now: torch.Tensor, state_now: Any, offsets: dict[str, int]) -> None:
            save_checkpoint(run.path, Checkpoint(
                round_done, theta_now, state_now, dataclasses.asdict(totals), dict(last_eval), offsets,
                time.perf_counter() - loop_start, sha, global_rng_state(), latest.get("buffers") or [],
            ))
            saved["round"] = round_done

        def on_round(rec: RoundRecord, theta_new: torch.Tensor, state_new: Any) -> None:
            with signals_deferred():
                record_round(rec, theta_new, state_new)
            bar.update()
            pause_for_tests(run.path, rec.round)

        postfix = {"eval": ""}  # the progress line: the last evaluation, then the skipped rounds (if any)

        def show(eval_part: str | None = None) -> None:
            if eval_part is not None:
                postfix["eval"] = eval_part
            skipped = f"skipped {totals.skipped_rounds}/{totals.rounds} rounds" if totals.skipped_rounds else ""
            # a skipped round shows at once (refresh), not at the next redraw
            bar.set_postfix_str(" ".join(p for p in (postfix["eval"], skipped) if p), refresh=eval_part is None)

        def record_round(rec: RoundRecord, theta_new: torch.Tensor, state_new: Any) -> None:
            totals.add_round(rec)
            if rec.skipped:
                show()
            record = rec.as_dict()
            if diagnostics is not None and (after := diagnostics.after_round(rec.round, rec.log)) is not None:
                record["diagnostics"] = after
            record["wall_clock_s"] = time.perf_counter() - loop_start
            if eval_due(rec.round, cfg):
                copy_buffers(evaluator, engine.model)
                entry = evaluation_entry(cfg, evaluator, theta_new, data, rec, totals, loop_start)
                if diagnostics is not None and (diag := diagnostics.evaluate(rec.round, evaluator,
                                                                             rec.round == cfg.rounds)) is not None:
                    entry["diagnostics"] = diag
                record["time_eval_s"] = entry["time_eval_s"]
                run.metrics.append(entry)
                last_eval.clear()
                last_eval.update(entry)
                if "task_score" in entry:
                    mean = entry.get("mean_acc")
                    show(f"score {_fmt(entry['task_score'], 2)}" + ("" if mean is None else f" mean {mean:.2f}")
                         + f" w {_fmt(rec.log.get('weights') or [], 3)}")
            run.rounds.append(record)
            offsets = {name: (run.path / name).stat().st_size for name in ("rounds.jsonl", "metrics.jsonl")}
            latest.update(round=rec.round, theta=theta_new, state=state_new, offsets=offsets)
            if engine.buffers:
                latest["buffers"] = engine.buffer_snapshot()
            if checkpoint_due(rec.round, cfg):
                checkpoint(rec.round, theta_new, state_new, offsets)
            if hooks is not None and hooks.on_round is not None:
                seen = {**record, **({"evaluation": dict(last_eval)} if eval_due(rec.round, cfg) else {})}
                if hooks.on_round(rec.round, seen) is True and rec.round < cfg.rounds:
                    raise _StopRun

        rounds_done = cfg.rounds
        try:
            theta, _ = run_rounds(
                setup.algorithm, engine, data, theta, cfg.rounds - done, cfg.train.clients_per_round,
                cfg.seed, "train", on_round, start_round=done, state=state, faults=faults, validation=cfg.validation,
                federation_factory=federation_factory, aggregation=cfg.train.aggregation,
            )
        except _StopRun:
            theta, rounds_done = latest["theta"], latest["round"]
        except BaseException as failure:
            if isinstance(failure, DivergenceError):  # recorded: fedhv table names it apart from an interrupted run
                run.record_failure(latest.get("round", done), failure)
            if cfg.checkpoint.enabled and latest and latest["round"] > saved["round"]:
                try:
                    checkpoint(latest["round"], latest["theta"], latest["state"], latest["offsets"])
                except Exception as exc:  # noqa: BLE001 - e.g. a full disk: report the first error, not this one
                    log.warning("no checkpoint at round %d (%s); the one of round %d is kept",
                                latest["round"], exc, saved["round"])
                else:
                    hint = hooks.resume_hint if hooks is not None and hooks.resume_hint else \
                        f"continue with `fedhv run --resume {run.path}`"
                    log.warning("checkpoint written at round %d; %s", latest["round"], hint)
            raise
        bar.close()
        loop_seconds = time.perf_counter() - loop_start
        set_flat(evaluator, theta)
        copy_buffers(evaluator, engine.model)
        write_model(run.path / "model.pt", evaluator, rounds_done)
        summary = summarize(cfg, setup, data.task_names, last_eval, totals, loop_seconds, time.perf_counter() - start,
                            describe_metrics(data.task_names, data.objective), rounds_done)
        if diagnostics is not None:
            summary["diagnostics"] = {"reference": setup.diagnostics_reference, "seconds": diagnostics.seconds,
                                      "probe_samples": cfg.diagnostics.probe_samples}
        if federation_factory is None:  # the engine that ran (a model vmap cannot run falls back to sequential)
            summary["engine"] = "batched" if hasattr(engine, "chunk") else "sequential"
        else:  # another back-end's clients computed (Flower nodes run the sequential engine)
            summary["engine"] = getattr(federation_factory, "engine", summary["engine"])
        run.write_json("summary.json", summary)
        (run.path / CHECKPOINT_FILE).unlink(missing_ok=True)  # complete: model.pt and summary.json replace it
        run.clear_failure()
        return summary
    finally:
        run.close()
