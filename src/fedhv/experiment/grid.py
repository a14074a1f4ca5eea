"""Experiment grids: every setting x method x seed (x ablation variant), resumable.

Layout of a grid directory ``OUT``::

    OUT/grid.json                               the jobs and their state
    OUT/calibration/<family>-<key>.json         shared FedHV calibrations
    OUT/<setting>/<method>/s<seed>/             one run directory per job
    OUT/<setting>/<variant>/<method>/s<seed>/   ablation runs (variant e.g. local_steps=5)

FedHV's reference is calibrated once per benchmark family and reused for every seed,
setting and ablation variant of that family, as the paper does (B.8: one 20-round
calibration per two-task family, the CIFAR10-MNIST alpha = 0.30 reference reused for
both settings, one CelebA5 reference for both settings and all seeds). Calibrations
are keyed by everything that determines them (data, calibration partition and
options, local training, FedHV's learning rates and report budget), so two settings
share one exactly when their calibrations would be identical.

Finished runs (``summary.json``) are skipped; interrupted ones are resumed from their
checkpoints. An existing run counts only when it was made with the configuration the
grid asks for now (:func:`check_existing_runs`): otherwise the grid refuses to start.
Jobs run in worker processes (``workers``) with ``threads`` torch threads each; the
parent shows overall progress from the run directories' ``rounds.jsonl``. Workers die
with the parent, and Ctrl-C or ``SIGTERM`` cancels the queue and checkpoints the running
runs (:mod:`fedhv.experiment.grid_worker`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhv.config import load_config, preset_names, to_dict
from fedhv.config.flower import refuse_in_simulator
from fedhv.config.schema import CALIBRATION_METHOD, CalibrationConfig, RunConfig
from fedhv.errors import ConfigError
from fedhv.experiment.grid_check import (  # noqa: F401 - re-exported
    IGNORED_KEYS,
    GridError,
    check_existing_runs,
    config_differences,
    job_state,
)
from fedhv.experiment.grid_worker import JobCancelled, guarded, init_worker, spawning_workers, stop_workers
from fedhv.registry import METHODS
from fedhv.results.rundir import open_nofollow, write_json
from fedhv.results.runfiles import read_bytes_nofollow
from fedhv.safe_path import safe_child_path

#: Ablation sweeps of paper Appendix C.5 (Table 10): config key and its values.
ABLATIONS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "report-budget": ("fedhv.report_batches", (1, 2, 5, "all")),
    "participation": ("train.clients_per_round", (5, 10, 20, 30)),
    "local-steps": ("train.local_steps", (1, 5, 10, 20)),
    # Not a paper sweep: each method's own server rate eta_g times 0.5 and 2 (the x1 runs are the grid's own).
    "server-lr": ("train.lr_global", (0.5, 2.0)),
}
#: Sweeps whose values *multiply* the method's own resolved setting: sweep -> the variant's name (its folder
#: ``lr_global_factor=0.5``); ``--ablation all`` runs the paper's three sweeps only.
RELATIVE_SWEEPS: dict[str, str] = {"server-lr": "lr_global_factor"}
PAPER_SWEEPS: tuple[str, ...] = ("report-budget", "participation", "local-steps")


@dataclass(frozen=True)
class Job:
    """One run of the grid.

    ``setting`` is the setting's name (the run folder's name); ``source`` is what the
    worker loads: a preset name, or the absolute path of a TOML file (so that it resolves
    whatever the worker's working directory).
    """

    setting: str
    source: str
    method: str
    seed: int
    run_dir: str
    overrides: tuple[str, ...] = ()
    ablation: str | None = None
    variant: tuple[str, Any] | None = None
    calibration: str | None = None  # path of the shared calibration file (FedHV)
    rounds: int = 0


@dataclass(frozen=True)
class CalibrationJob:
    """A shared calibration: computed once, written to ``path`` (``source`` as in :class:`Job`)."""

    source: str
    overrides: tuple[str, ...]
    path: str
    rounds: int


def _value_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value)


def setting_source(setting: str) -> str:
    """What workers load for SETTING: a preset name as given, a TOML file by absolute path."""
    return setting if setting in preset_names() else str(Path(setting).resolve())


def calibration_key(cfg: RunConfig) -> str:
    """A digest of everything that determines FedHV's calibration result."""
    relevant = {
        "data": to_dict(dataclasses.replace(cfg.data, root=None, max_test_samples=0)),
        "partition": to_dict(cfg.calibration.partition_for(cfg.partition)),
        # the margin only shifts r = max F + margin (each run applies its own: calibrated_reference), so runs of
        # any margin share one calibration; written as the default so the keys of earlier grids hold
        "calibration": to_dict(dataclasses.replace(cfg.calibration, margin=CalibrationConfig.margin)),
        "train": to_dict(cfg.train),
        "report_batches": cfg.section(CALIBRATION_METHOD).report_batches,
        "engine": cfg.engine,
        "dtype": cfg.dtype,
    }
    if cfg.precision != "fp32":  # bf16 forwards change the calibration reports (absent for fp32: old keys hold)
        relevant["precision"] = cfg.precision
    v = cfg.validation
    if v.max_update_norm or v.max_update_norm_ratio:  # reply norm bounds also filter calibration replies
        relevant["update_norm_bounds"] = [v.max_update_norm, v.max_update_norm_ratio]
    text = json.dumps(relevant, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def plan_grid(settings: Sequence[str], methods: Sequence[str], seeds: Sequence[int], out: Path,
              overrides: Sequence[str] = (), ablation: str | None = None
              ) -> tuple[list[Job], list[CalibrationJob]]:
    """Expand the grid into jobs; every configuration is built (and validated) here.

    Raises
    ------
    ConfigError
        For any bad setting, method, override or ablation, before anything runs.
    """
    if ablation is not None and ablation not in ABLATIONS and ablation != "all":
        raise ConfigError(f"--ablation {ablation!r}: choose one of {', '.join(ABLATIONS)} or all")
    sweeps = list(PAPER_SWEEPS) if ablation == "all" else [ablation] if ablation else [None]
    jobs: list[Job] = []
    calibrations: dict[str, CalibrationJob] = {}
    named: dict[str, str] = {}  # folder name -> the source planned into it
    for setting in dict.fromkeys(setting_source(s) for s in settings):  # a setting given twice runs once
        source = setting
        for sweep in sweeps:
            variants: list[tuple[str, Any] | None] = [None]
            if sweep is not None:
                key, values = ABLATIONS[sweep]
                variants = [(key, v) for v in values]
            for variant in variants:
                extra = [] if variant is None else [f"{variant[0]}={_value_text(variant[1])}"]
                for method in methods:
                    for seed in seeds:
                        shown = variant
                        if sweep in RELATIVE_SWEEPS and variant is not None:  # the method's own value, scaled
                            own = load_config(source, (*overrides, f"method={json.dumps(method)}", f"seed={seed}"))
                            extra = [f"{variant[0]}={own.lr_global * variant[1]!r}"]
                            shown = (RELATIVE_SWEEPS[sweep], variant[1])
                        folder = () if shown is None else (f"{shown[0].split('.')[-1]}={shown[1]}",)
                        jobs.append(plan_job(source, overrides, extra, method, seed, out, folder, sweep, shown,
                                             named, calibrations))
    return jobs, list(calibrations.values())


def plan_job(source: str, overrides: Sequence[str], extra: Sequence[str], method: str, seed: int, out: Path,
             folder: Sequence[str], sweep: str | None, shown: tuple[str, Any] | None, named: dict[str, str],
             calibrations: dict[str, CalibrationJob]) -> Job:
    """One job of a grid: its configuration built and validated, its run directory
    ``out/<setting>/<folder...>/<method>/s<seed>``, and -- for a calibrated method -- the shared
    calibration of its family added to ``calibrations`` (``named``: setting name -> source, so two
    sources never write one folder)."""
    job_over = (*overrides, *extra, f"method={json.dumps(method)}", f"seed={seed}")
    cfg = load_config(source, job_over)
    refuse_in_simulator(cfg)  # before its calibration runs in the simulator
    name = cfg.setting
    if named.setdefault(name, source) != source:
        raise ConfigError(
            f"settings {named[name]} and {source} are both named {name!r}, so both would write "
            f"{out / name}: give one another name (setting = \"{name}-2\" in its file) or run "
            "them as separate grids")
    where = out / name
    for part in folder:
        where = where / part
    cal_path = None
    if METHODS.get(cfg.method).from_config(cfg).uses_calibration():
        # The variant does not change the reference (paper: one per family).
        base = load_config(source, (*overrides, f"method={json.dumps(CALIBRATION_METHOD)}"))
        key = calibration_key(base)
        path = out / "calibration" / f"{base.data.benchmark}-{key}.json"
        cal_path = str(path)
        if cal_path not in calibrations:
            c = base.calibration
            calibrations[cal_path] = CalibrationJob(
                source, (*overrides, f"method={json.dumps(CALIBRATION_METHOD)}"), cal_path,
                c.rounds * len(c.seeds))
    return Job(name, source, method, seed, str(where / method / f"s{seed}"), tuple(job_over), sweep, shown,
               cal_path, cfg.rounds)


def _rounds_done(job: Job, finished: set[str]) -> int:
    """Rounds written by ``job`` so far (finished jobs are remembered in ``finished``)."""
    path = Path(job.run_dir)
    if job.run_dir in finished or (path / "summary.json").exists():
        finished.add(job.run_dir)
        return job.rounds
    try:
        return min(job.rounds, read_bytes_nofollow(path / "rounds.jsonl").count(b"\n"))
    except OSError:
        return 0


# --------------------------------------------------------------------------- workers


def _run_calibration(job: CalibrationJob) -> str:
    from fedhv.experiment.method_setup import resolve_reference
    from fedhv.experiment.problem import Problem

    cfg = load_config(job.source, job.overrides)
    problem = Problem.of(cfg)
    _, _, result = resolve_reference(cfg, problem.data(cfg), problem=problem)
    assert result is not None
    Path(job.path).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(job.path), result.as_dict())
    return job.path


def _run_job(job: Job) -> dict[str, Any]:
    return run_job(job)


def run_job(job: Job, calibration: Any = None, on_round: Any = None) -> dict[str, Any]:
    """Run (or resume) ``job`` in ``job.run_dir``, logging to its ``run.log``; its summary.

    ``calibration``: the shared calibration as a :class:`CalibrationResult` (else read from
    ``job.calibration``); ``on_round(round, record)``: called after every round (the Ray
    grid ships checkpoints from it).
    """
    from fedhv.experiment.calibration import load_calibration
    from fedhv.experiment.runner import RunHooks, resume_experiment, run_experiment

    path = Path(job.run_dir)
    handler = None
    try:
        path.mkdir(parents=True, exist_ok=True)
        log_fd = open_nofollow(path / "run.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # never through a link
        handler = logging.StreamHandler(os.fdopen(log_fd, "a", encoding="utf-8"))
        logger = logging.getLogger("fedhv")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        hooks = RunHooks(on_round=on_round) if on_round is not None else None
        if job_state(job) == "partial":
            return resume_experiment(path, progress=False, hooks=hooks)
        cfg = load_config(job.source, job.overrides)
        if calibration is None and job.calibration is not None:
            calibration = load_calibration(job.calibration)  # verified, never through a link
        write_json(path / "grid-job.json", {"setting": job.setting, "method": job.method, "seed": job.seed,
                                            "ablation": job.ablation, "variant": job.variant})
        return run_experiment(cfg, path, progress=False, calibration=calibration, hooks=hooks)
    finally:
        if handler is not None:
            logging.getLogger("fedhv").removeHandler(handler)
            handler.close()
            handler.stream.close()  # a StreamHandler leaves its stream open


# --------------------------------------------------------------------------- driver


@dataclass
class GridReport:
    """Outcome of :func:`run_grid`."""

    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def _summary_line(run_dir: str, summary: dict[str, Any]) -> str:
    """``done: DIR: MeanAcc .. WorstAcc .. (.. s)``; metrics a run did not evaluate read ``n/a``."""

    def num(key: str, digits: int) -> str:
        value = summary.get(key)
        return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "n/a"

    return f"done: {run_dir}: MeanAcc {num('mean_acc', 2)} WorstAcc {num('worst_acc', 2)} ({num('wall_clock_s', 0)} s)"


class GridTerminated(KeyboardInterrupt):
    """SIGTERM reached the grid process: stopped like Ctrl-C; the CLI exits with ``128 + signum`` (143)."""

    signum = int(signal.SIGTERM)


def _terminate(signum: int, frame: Any) -> None:
    raise GridTerminated(f"terminated by signal {signum} (SIGTERM)")


def prepare_grid(jobs: list[Job], calibrations: list[CalibrationJob], out: Path
                 ) -> tuple[GridReport, list[CalibrationJob], list[Job], int]:
    """What every back-end does first: refuse runs of another configuration, write ``grid.json``;
    the report with the finished runs skipped, the calibrations and jobs to do, and the rounds
    of the whole grid (the progress bar's total)."""
    check_existing_runs(jobs, out)
    out.mkdir(parents=True, exist_ok=True)
    report = GridReport()
    todo_cal = [c for c in calibrations if not Path(c.path).exists()]
    report.skipped = [j.run_dir for j in jobs if job_state(j) == "done"]
    todo = [j for j in jobs if job_state(j) != "done"]
    write_json(out / "grid.json", {"jobs": [dataclasses.asdict(j) for j in jobs],
                                   "calibrations": [dataclasses.asdict(c) for c in calibrations]})
    return report, todo_cal, todo, sum(j.rounds for j in jobs) + sum(c.rounds for c in todo_cal)


def run_grid(jobs: list[Job], calibrations: list[CalibrationJob], out: Path, workers: int = 1,
             threads: int | None = None, progress: bool = True) -> GridReport:
    """Run the calibrations, then the jobs, in ``workers`` processes, holding ``out``'s driver lock
    (:func:`fedhv.experiment.grid_lock.driver_lock`: a second driver on ``out`` is refused). See
    :func:`_run_grid`."""
    from fedhv.experiment.grid_lock import driver_lock

    with driver_lock(Path(out)):
        return _run_grid(jobs, calibrations, out, workers, threads, progress)


def _run_grid(jobs: list[Job], calibrations: list[CalibrationJob], out: Path, workers: int = 1,
              threads: int | None = None, progress: bool = True) -> GridReport:
    """Run the calibrations, then the jobs, in ``workers`` processes.

    Existing runs are checked first (:func:`check_existing_runs`). Ctrl-C or ``SIGTERM``
    stops the grid: queued jobs are cancelled (never started), running runs write a
    checkpoint, and :class:`KeyboardInterrupt` (:class:`GridTerminated` for ``SIGTERM``)
    is raised once the workers are gone. A job that a worker ended by a stop request
    (``KeyboardInterrupt`` or :class:`JobCancelled`) stops the grid the same way, even before
    this process has handled a Ctrl-C of its own.

    Raises
    ------
    GridError
        When ``out`` holds runs of another configuration, or another driver runs a grid in
        ``out`` (nothing is run or written).
    """
    from tqdm import tqdm  # type: ignore[import-untyped]

    start = time.perf_counter()
    threads = threads or max(1, (os.cpu_count() or 1) // workers)
    report, todo_cal, todo, total = prepare_grid(jobs, calibrations, out)
    bar = tqdm(total=total, desc="grid", disable=not progress, dynamic_ncols=True, unit="round")
    cal_done = 0
    finished: set[str] = set()

    def new_pool() -> ProcessPoolExecutor:
        with safe_child_path():  # its resource tracker starts here; the workers in spawning_workers()
            return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=init_worker, initargs=(threads, os.getpid()))

    pool = new_pool()
    broken: list[Any] = []  # items whose worker pool broke (a worker killed: OOM killer, kill -9)

    def wait(futures: dict[Future[Any], Any], on_done: Any) -> None:
        pending = dict(futures)
        while pending:
            for fut in [f for f in pending if f.done()]:
                item = pending.pop(fut)
                on_done(item, fut)
            done_rounds = sum(_rounds_done(j, finished) for j in jobs) + cal_done
            bar.n = min(total, done_rounds)
            running = min(workers, sum(1 for f in pending if f.running()))
            bar.set_postfix_str(f"runs {len(report.done) + len(report.skipped)}/{len(jobs)} done, "
                                f"{running} running, {len(report.failed)} failed", refresh=False)
            bar.refresh()
            if pending:
                time.sleep(0.5)

    def cal_finished(job: CalibrationJob, fut: Future[Any]) -> None:
        nonlocal cal_done
        if isinstance(fut.exception(), BrokenProcessPool):
            broken.append(job)
        elif fut.exception() is not None:
            report.failed[job.path] = f"{type(fut.exception()).__name__}: {fut.exception()}"
        else:
            cal_done += job.rounds

    def job_finished(job: Job, fut: Future[Any]) -> None:
        exc = fut.exception()
        if isinstance(exc, (KeyboardInterrupt, JobCancelled)):
            # A worker stopped by a signal (a terminal's Ctrl-C reaches the whole process group):
            # the grid is stopping, whether or not this process has handled its own signal yet
            # (a process-directed signal may wait for the main thread's next bytecode).
            raise KeyboardInterrupt(f"{job.run_dir}: {type(exc).__name__}")
        if isinstance(exc, BrokenProcessPool):
            broken.append(job)
        elif exc is not None:
            report.failed[job.run_dir] = f"{type(exc).__name__}: {exc}"
            tqdm.write(f"failed: {job.run_dir}: {type(exc).__name__}: {exc}")
        else:
            report.done.append(job.run_dir)
            tqdm.write(_summary_line(job.run_dir, fut.result()))

    def stage(items: list[Any], fn: Any, on_done: Any, where: Any) -> None:
        """Run ``items``. When a worker dies (the pool breaks: the out-of-memory killer, ``kill -9``) the
        unfinished items run again in a new pool, resuming from their checkpoints: first together,
        after a second break one at a time; an item that breaks a pool on its own fails."""
        nonlocal pool
        queue, breaks = list(items), 0
        while queue:
            alone = breaks >= 2
            batch, queue = (queue[:1], queue[1:]) if alone else (queue, [])
            broken.clear()
            with spawning_workers():  # submit() starts the worker processes
                futures = {pool.submit(guarded, fn, item): item for item in batch}
            wait(futures, on_done)
            if not broken:
                continue
            pool.shutdown(wait=True)  # the broken pool's other workers have checkpointed and exited
            pool = new_pool()
            if alone:
                report.failed[where(broken[0])] = (
                    "its worker process was killed (a signal, e.g. the out-of-memory killer) while it ran alone; "
                    "the same command resumes it (with fewer --workers if memory ran out)")
                tqdm.write(f"failed: {where(broken[0])}: {report.failed[where(broken[0])]}")
                continue
            breaks += 1
            tqdm.write(f"warning: a grid worker process was killed (a signal, e.g. the out-of-memory killer); "
                       f"{len(broken)} unfinished item(s) run again" + (", one at a time" if breaks >= 2 else ""))
            queue = list(broken) + queue

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        stage(todo_cal, _run_calibration, cal_finished, lambda c: c.path)
        runnable = [j for j in todo if j.calibration is None or Path(j.calibration).exists()]
        for j in todo:
            if j not in runnable:
                report.failed[j.run_dir] = f"its calibration {j.calibration} failed"
        stage(runnable, _run_job, job_finished, lambda j: j.run_dir)
    except BaseException:
        # Ctrl-C, SIGTERM or a failure of the driver itself: no job may outlive it.
        stop_workers(pool)
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        bar.close()
        if main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    report.seconds = time.perf_counter() - start
    return report
