"""``fedhv tune … --backend ray``: the trials as Ray tasks on fedhv's Ray back-end, sharing the Optuna storage.

The driver (:class:`fedhv.experiment.tune.Tuner`) asks and tells, as on the local back-end; each trial runs
as a Ray task (:func:`task_trial`, ``num_cpus = --cpus-per-run``) that opens the same storage, reports
its objective at every evaluation and asks the pruner itself. Up to ``--parallel`` trials run at once (the
cluster's CPUs / ``--cpus-per-run`` by default), the methods taking turns, so every method gets the same
number of trials of the same length. Ray is started or joined as the Ray grid does
(:func:`fedhv.experiment.grid_ray._connect`): without ``--address`` a local instance on 127.0.0.1 only,
whose workers checkpoint and exit when the driver is killed (:mod:`fedhv.experiment.grid_watch`).

The tasks write their run directories in place and (by default) the SQLite storage in the tune folder, so
every node must see the tune folder at the same path (checked with the Ray grid's probe file: a task that
does not see it fails, naming the node); across machines give ``--storage`` a database server.
A task whose worker dies is retried (``--retries``) and resumes from its run's last checkpoint; a killed
driver is continued by the same command (:mod:`fedhv.experiment.tune`).
"""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedhv.experiment.grid import CalibrationJob
from fedhv.experiment.grid_lock import driver_lock
from fedhv.experiment.grid_ray import RayOptions, _connect, _ray, _reason, _stop
from fedhv.experiment.grid_ship import PROBE, task_calibration, write_probe
from fedhv.experiment.tune import Tuner, TuneReport, conclude
from fedhv.experiment.tune_space import TuneError, TunePlan
from fedhv.experiment.tune_trial import storage_url, task_trial
from fedhv.results.runfiles import write_json


def run_tune_ray(plan: TunePlan, out: Path, storage: str | None, opts: RayOptions, execution: Sequence[str] = (),
                 parallel: int | None = None) -> TuneReport:
    """Tune every method of ``plan`` with its trials as Ray tasks (see the module docstring).

    Raises
    ------
    TuneError, ConfigError
        Bad input (before any run), or a trial that failed (the other running trials are stopped and
        checkpointed; the same command continues).
    KeyboardInterrupt
        Ctrl-C / ``SIGTERM``: queued trials never start, running ones are checkpointed.
    """
    opts.check()
    ray = _ray()
    out = out.resolve()
    with driver_lock(out, "fedhv tune"):
        tuner = Tuner(plan, out, storage_url(storage, out), execution)
        tuner.prepare()
        token = uuid.uuid4().hex
        write_probe(out, token)
        joined = ray.is_initialized()
        with warnings.catch_warnings():  # Ray's start leaves /dev/null handles to the garbage collector
            warnings.simplefilter("ignore", ResourceWarning)
            _connect(ray, opts)
        try:
            slots = parallel or max(1, int(ray.cluster_resources().get("CPU", 1) // opts.cpus_per_run))
            res = {"num_cpus": opts.cpus_per_run, "max_retries": opts.retries}
            calibration = _calibrations(ray, tuner.calibrations.values(), res, opts.cpus_per_run)
            _trials(ray, tuner, res, calibration, str(out), token, opts.cpus_per_run, slots)
        finally:
            (out / PROBE).unlink(missing_ok=True)
            if not joined:  # stops a local instance; only disconnects from a cluster
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ResourceWarning)
                    ray.shutdown()
        return conclude(tuner)


def _calibrations(ray: Any, jobs: Any, res: dict[str, Any], cpus: float) -> dict[str, Any] | None:
    """Compute the missing shared calibrations as Ray tasks, write them; the calibration the trials take."""
    from fedhv.experiment.calibration import load_calibration

    jobs = list(jobs)
    todo: list[CalibrationJob] = [c for c in jobs if not Path(c.path).exists()]
    task = ray.remote(task_calibration).options(**res)
    for cal, value in zip(todo, ray.get([task.remote(c, cpus) for c in todo])):
        print(f"calibration: {cal.rounds} rounds -> {cal.path}", flush=True)
        Path(cal.path).parent.mkdir(parents=True, exist_ok=True)
        write_json(Path(cal.path), value)
    return {c.path: load_calibration(c.path).as_dict() for c in jobs} or None


def _trials(ray: Any, tuner: Tuner, res: dict[str, Any], calibrations: dict[str, Any] | None, root: str,
            token: str, cpus: float, slots: int) -> None:
    """Keep ``slots`` trials running, the methods taking turns, until every method has its trials."""
    task = ray.remote(task_trial).options(**res)
    pending: dict[Any, tuple[str, Any, Any]] = {}
    turn = 0
    try:
        while True:
            methods = [m for m in tuner.plan.methods if tuner.remaining(m) > 0]
            while methods and len(pending) < slots:
                method = methods[turn % len(methods)]
                turn += 1
                trial, spec = tuner.ask(method)
                cal = None if spec.job.calibration is None or calibrations is None else calibrations[spec.job.calibration]
                ref = task.remote(spec, cal, root, token, cpus)
                pending[ref] = (method, trial, spec)
                methods = [m for m in tuner.plan.methods if tuner.remaining(m) > 0]
            if not pending:
                return
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            for ref in ready:
                method, trial, spec = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except (ray.exceptions.TaskCancelledError, KeyboardInterrupt):
                    raise KeyboardInterrupt(f"{spec.job.run_dir}: cancelled") from None
                except ray.exceptions.RayError as exc:
                    why = _reason(exc)
                    tuner.fail(method, trial, why)
                    raise TuneError(f"{method} trial {trial.number} failed ({why}); see {spec.job.run_dir}/run.log, "
                                    "fix it and rerun the same command (finished trials are kept)") from None
                print(tuner.finish(method, trial, result), flush=True)
                tuner.write_record()
            time.sleep(0.05)
    except BaseException:
        _stop(ray, {ref: ("job", item) for ref, item in pending.items()})
        raise
