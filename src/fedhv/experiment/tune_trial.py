"""One trial of a tuning, and the Optuna plumbing both back-ends share (:mod:`fedhv.experiment.tune`).

A trial is a fedhv run (:func:`fedhv.experiment.grid.run_job`, through the runner like every run) whose
``on_round`` hook reports the objective -- read from the validation evaluations of its ``metrics.jsonl``,
never the test metrics (:func:`fedhv.experiment.tune_space.objective_value`) -- to its Optuna trial at every
evaluation and ends the run when the pruner says so (``summary.json`` then says ``stopped_early``). It
runs in the driver's process (:func:`run_trial`) or as a Ray task (:func:`task_trial`), opening the
study from the shared storage either way. Optuna is imported only when a tuning runs (the ``tune`` extra).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhv.errors import ConfigError
from fedhv.experiment.grid import Job
from fedhv.experiment.grid_check import job_state
from fedhv.experiment.tune_space import Param, Pruning, TuneError, objective_value
from fedhv.results.received import read_records
from fedhv.results.runfiles import read_bytes_nofollow


def optuna_module() -> Any:
    """``optuna``, or a one-line :class:`ConfigError` naming the extra to install."""
    try:
        import optuna
    except ImportError:
        raise ConfigError("fedhv tune needs Optuna: pip install 'fedhv[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def storage_url(storage: str | None, out: Path) -> str:
    """``--storage``, or the SQLite file ``OUT/optuna.db``."""
    return storage or f"sqlite:///{(out / 'optuna.db').resolve()}"


def shown_url(url: str) -> str:
    """``url`` without its password (for records and messages)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL: show its scheme only
        return url.split(":", 1)[0] + ":..."


_STORAGES: dict[str, Any] = {}


def open_storage(url: str) -> Any:
    """Optuna's RDB storage at ``url`` (one per process and URL; SQLite waits up to 60 s for a lock)."""
    if url not in _STORAGES:
        optuna = optuna_module()
        kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
        try:
            _STORAGES[url] = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy's and Optuna's errors: one line
            raise TuneError(f"--storage {shown_url(url)}: cannot open it ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}); give a reachable database URL, e.g. "
                            "sqlite:///tune.db or postgresql://user@host/db") from None
    return _STORAGES[url]


def make_pruner(p: Pruning) -> Any:
    """Optuna's pruner for ``p`` (steps are rounds)."""
    optuna = optuna_module()
    if p.kind == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=p.first_rung, reduction_factor=p.reduction,
                                                      min_early_stopping_rate=0)
    if p.kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.startup, n_warmup_steps=p.first_rung)
    return optuna.pruners.NopPruner()


def distribution(param: Param) -> Any:
    """The Optuna distribution of ``param``."""
    d = optuna_module().distributions
    if param.kind == "choice":
        return d.CategoricalDistribution(list(param.choices))
    if param.kind == "int":
        return d.IntDistribution(int(param.low), int(param.high), log=param.log)
    return d.FloatDistribution(param.low, param.high, log=param.log)


@dataclass(frozen=True)
class TrialSpec:
    """What runs one trial (in this process or in a Ray task)."""

    method: str
    study: str
    storage: str
    trial_id: int
    number: int
    job: Job
    objective: str
    window: int
    pruning: Pruning
    rounds: int


@contextlib.contextmanager
def quiet_console() -> Iterator[None]:
    """A run in this process logs to its ``run.log``; the console's handlers show warnings only meanwhile."""
    logger = logging.getLogger("fedhv")
    saved = [(h, h.level) for h in logger.handlers]
    level = logger.level
    for h, old in saved:
        h.setLevel(max(old, logging.WARNING))
    try:
        yield
    finally:
        for h, old in saved:
            h.setLevel(old)
        logger.setLevel(level)


def run_trial(spec: TrialSpec, calibration: Any = None) -> dict[str, Any]:
    """Run (or resume) one trial's run, reporting its objective to its Optuna trial at every evaluation.

    Returns ``{"state": "complete" | "pruned" | "diverged", "value", "rounds", "pruned_at", "cpu_s",
    "wall_s"}``. A trial whose run directory is already finished (its driver died before telling) is
    read, not run again.
    """
    from fedhv.experiment.divergence import DivergenceError
    from fedhv.experiment.grid import run_job

    optuna = optuna_module()
    study = optuna.load_study(study_name=spec.study, storage=open_storage(spec.storage),
                              pruner=make_pruner(spec.pruning))
    trial = optuna.trial.Trial(study, spec.trial_id)
    reported = set(open_storage(spec.storage).get_trial(spec.trial_id).intermediate_values)
    path = Path(spec.job.run_dir)
    outcome: dict[str, Any] = {"pruned_at": None}

    def report() -> None:
        entries = read_records(path / "metrics.jsonl")
        for i, entry in enumerate(entries):
            value = None if entry["round"] in reported else objective_value(entries[: i + 1], spec.objective,
                                                                             spec.window)
            if value is not None:
                trial.report(value, entry["round"])
                reported.add(entry["round"])

    def on_round(t: int, record: dict[str, Any]) -> bool:
        if "evaluation" not in record:
            return False
        report()
        if t < spec.rounds and trial.should_prune():
            outcome["pruned_at"] = t
            return True
        return False

    wall, cpu = time.perf_counter(), time.process_time()
    state = "complete"
    with quiet_console():
        try:
            if job_state(spec.job) == "done":
                summary = json.loads(read_bytes_nofollow(path / "summary.json"))
            else:
                summary = run_job(spec.job, calibration, on_round)
        except DivergenceError:
            summary, state = {}, "diverged"
    report()
    entries = read_records(path / "metrics.jsonl")
    rounds = int(summary.get("rounds") or (entries[-1]["round"] if entries else 0))
    if state == "complete" and summary.get("stopped_early"):
        state, outcome["pruned_at"] = "pruned", outcome["pruned_at"] or rounds
    value = objective_value(entries, spec.objective, spec.window)
    if state == "complete" and value is None:
        raise TuneError(f"trial {spec.number} of {spec.method} ({path}) has no validation evaluation; set "
                        "eval.final = true or an eval.test_period that evaluates within --rounds")
    return {"state": state, "value": value, "rounds": rounds, "pruned_at": outcome["pruned_at"],
            "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall}


def task_trial(spec: TrialSpec, calibration: dict[str, Any] | None, root: str, token: str, cpus: float
               ) -> dict[str, Any]:
    """One trial as a Ray task (:mod:`fedhv.experiment.tune_ray`): in place in the tune folder ``root``,
    which the task must see (the driver's probe file holds ``token``), with ``cpus`` torch threads; a
    retry waits for a dead attempt's lock on the run directory, then resumes its checkpoint."""
    import torch

    from fedhv.experiment.calibration import CalibrationResult
    from fedhv.experiment.grid_ship import PROBE, _wait_unlocked
    from fedhv.experiment.grid_watch import task_scope

    with task_scope():
        try:
            seen = (Path(root) / PROBE).read_text().strip() == token
        except OSError:
            seen = False
        if not seen:
            raise TuneError(f"this node ({socket.gethostname()}) does not see the tune folder {root}: a tuning on Ray "
                            "writes its trials (and its SQLite storage) in place; mount it at the same path on every "
                            "node, and give --storage a database server across machines")
        torch.set_num_threads(max(1, int(cpus)))
        _wait_unlocked(Path(spec.job.run_dir))
        cal = None if calibration is None else CalibrationResult.from_dict(calibration, source=spec.job.calibration or "")
        return run_trial(spec, cal)
