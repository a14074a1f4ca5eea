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
checkpoints. Jobs run in worker processes (``workers``) with ``threads`` torch threads
each; the parent shows overall progress from the run directories' ``rounds.jsonl``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhv.config import load_config, to_dict
from fedhv.config.schema import RunConfig
from fedhv.errors import ConfigError
from fedhv.results.rundir import write_json

#: Ablation sweeps of paper Appendix C.5 (Table 10): config key and its values.
ABLATIONS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "report-budget": ("fedhv.report_batches", (1, 2, 5, "all")),
    "participation": ("train.clients_per_round", (5, 10, 20, 30)),
    "local-steps": ("train.local_steps", (1, 5, 10, 20)),
}
PAPER_SEEDS: tuple[int, ...] = (0, 42, 2026)


@dataclass(frozen=True)
class Job:
    """One run of the grid."""

    setting: str
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
    """A shared calibration: computed once, written to ``path``."""

    setting: str
    overrides: tuple[str, ...]
    path: str
    rounds: int


def _value_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value)


def calibration_key(cfg: RunConfig) -> str:
    """A digest of everything that determines FedHV's calibration result."""
    relevant = {
        "data": to_dict(dataclasses.replace(cfg.data, root=None, max_test_samples=0)),
        "partition": to_dict(cfg.calibration.partition_for(cfg.partition)),
        "calibration": to_dict(cfg.calibration),
        "train": to_dict(cfg.train),
        "report_batches": cfg.fedhv.report_batches,
        "engine": cfg.engine,
        "dtype": cfg.dtype,
    }
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
    sweeps = list(ABLATIONS) if ablation == "all" else [ablation] if ablation else [None]
    jobs: list[Job] = []
    calibrations: dict[str, CalibrationJob] = {}
    for setting in settings:
        for sweep in sweeps:
            variants: list[tuple[str, Any] | None] = [None]
            if sweep is not None:
                key, values = ABLATIONS[sweep]
                variants = [(key, v) for v in values]
            for variant in variants:
                extra = [] if variant is None else [f"{variant[0]}={_value_text(variant[1])}"]
                for method in methods:
                    for seed in seeds:
                        job_over = (*overrides, *extra, f"method={json.dumps(method)}", f"seed={seed}")
                        cfg = load_config(setting, job_over)
                        name = cfg.setting
                        folder = out / name
                        if variant is not None:
                            folder = folder / f"{variant[0].split('.')[-1]}={variant[1]}"
                        cal_path = None
                        if method == "fedhv" and cfg.fedhv.reference == "calibrate":
                            # The variant does not change the reference (paper: one per family).
                            base = load_config(setting, (*overrides, 'method="fedhv"'))
                            key = calibration_key(base)
                            path = out / "calibration" / f"{base.data.benchmark}-{key}.json"
                            cal_path = str(path)
                            if cal_path not in calibrations:
                                c = base.calibration
                                calibrations[cal_path] = CalibrationJob(
                                    setting, (*overrides, 'method="fedhv"'), cal_path, c.rounds * len(c.seeds)
                                )
                        jobs.append(Job(name, method, seed, str(folder / method / f"s{seed}"), tuple(job_over),
                                        sweep, variant, cal_path, cfg.rounds))
    return jobs, list(calibrations.values())


def job_state(job: Job) -> str:
    """``done``, ``partial`` (resume) or ``new``."""
    path = Path(job.run_dir)
    if (path / "summary.json").exists():
        return "done"
    if (path / "config.toml").exists():
        return "partial"
    return "new"


def _rounds_done(job: Job, finished: set[str]) -> int:
    """Rounds written by ``job`` so far (finished jobs are remembered in ``finished``)."""
    path = Path(job.run_dir)
    if job.run_dir in finished or (path / "summary.json").exists():
        finished.add(job.run_dir)
        return job.rounds
    try:
        return min(job.rounds, (path / "rounds.jsonl").read_bytes().count(b"\n"))
    except OSError:
        return 0


# --------------------------------------------------------------------------- workers


def _init_worker(threads: int) -> None:
    """Worker set-up: thread count, allocator tuning (as ``fedhv run`` does), quiet logging."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    from fedhv._malloc import tune_allocator

    tune_allocator()

    torch.set_num_threads(threads)
    logging.getLogger("fedhv").setLevel(logging.ERROR)


def _run_calibration(job: CalibrationJob) -> str:
    from fedhv.experiment.methods import resolve_reference
    from fedhv.experiment.setup import federated_data

    cfg = load_config(job.setting, job.overrides)
    _, _, result = resolve_reference(cfg, federated_data(cfg))
    assert result is not None
    Path(job.path).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(job.path), result.as_dict())
    return job.path


def _run_job(job: Job) -> dict[str, Any]:
    from fedhv.experiment.calibration import CalibrationResult
    from fedhv.experiment.runner import resume_experiment, run_experiment

    path = Path(job.run_dir)
    handler = None
    try:
        path.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path / "run.log")
        logger = logging.getLogger("fedhv")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        if job_state(job) == "partial":
            return resume_experiment(path, progress=False)
        cfg = load_config(job.setting, job.overrides)
        calibration = None
        if job.calibration is not None:
            calibration = CalibrationResult.from_dict(json.loads(Path(job.calibration).read_text()))
        write_json(path / "grid-job.json", {"setting": job.setting, "method": job.method, "seed": job.seed,
                                            "ablation": job.ablation, "variant": job.variant})
        return run_experiment(cfg, path, progress=False, calibration=calibration)
    finally:
        if handler is not None:
            logging.getLogger("fedhv").removeHandler(handler)
            handler.close()


# --------------------------------------------------------------------------- driver


@dataclass
class GridReport:
    """Outcome of :func:`run_grid`."""

    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def run_grid(jobs: list[Job], calibrations: list[CalibrationJob], out: Path, workers: int = 1,
             threads: int | None = None, progress: bool = True) -> GridReport:
    """Run the calibrations, then the jobs, in ``workers`` processes."""
    from tqdm import tqdm  # type: ignore[import-untyped]

    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    threads = threads or max(1, (os.cpu_count() or 1) // workers)
    report = GridReport()
    todo_cal = [c for c in calibrations if not Path(c.path).exists()]
    report.skipped = [j.run_dir for j in jobs if job_state(j) == "done"]
    todo = [j for j in jobs if job_state(j) != "done"]
    write_json(out / "grid.json", {"jobs": [dataclasses.asdict(j) for j in jobs],
                                   "calibrations": [dataclasses.asdict(c) for c in calibrations]})
    total = sum(j.rounds for j in jobs) + sum(c.rounds for c in todo_cal)
    bar = tqdm(total=total, desc="grid", disable=not progress, dynamic_ncols=True, unit="round")
    cal_done = 0
    finished: set[str] = set()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker,
                             initargs=(threads,)) as pool:

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
                    time.sleep(1.0)

        def cal_finished(job: CalibrationJob, fut: Future[Any]) -> None:
            nonlocal cal_done
            if fut.exception() is not None:
                report.failed[job.path] = f"{type(fut.exception()).__name__}: {fut.exception()}"
            else:
                cal_done += job.rounds

        wait({pool.submit(_run_calibration, c): c for c in todo_cal}, cal_finished)
        runnable = [j for j in todo if j.calibration is None or Path(j.calibration).exists()]
        for j in todo:
            if j not in runnable:
                report.failed[j.run_dir] = f"its calibration {j.calibration} failed"

        def job_finished(job: Job, fut: Future[Any]) -> None:
            exc = fut.exception()
            if exc is not None:
                report.failed[job.run_dir] = f"{type(exc).__name__}: {exc}"
                tqdm.write(f"failed: {job.run_dir}: {type(exc).__name__}: {exc}")
            else:
                report.done.append(job.run_dir)
                summary = fut.result()
                tqdm.write(f"done: {job.run_dir}: MeanAcc {summary['mean_acc']:.2f} "
                           f"WorstAcc {summary['worst_acc']:.2f} ({summary['wall_clock_s']:.0f} s)")

        wait({pool.submit(_run_job, j): j for j in runnable}, job_finished)
    bar.close()
    report.seconds = time.perf_counter() - start
    return report
