"""Tuning every method under one budget with Optuna: ``fedhv tune`` (docs/methods.md, "Tuning every
method under one budget").

One Optuna study per method, in one RDB storage (SQLite in the tune folder by default, ``--storage URL``
for a database server), each with the same number of trials of the same number of rounds, a seeded TPE
sampler (re-seeded from the trial's number before every ask, so the sequence of trials does not depend
on where a tuning was killed), and one pruner. A trial is a fedhv run (:func:`fedhv.experiment.grid.run_job`,
through the runner like every run) whose ``on_round`` hook reports the objective, read from the
validation evaluations of its ``metrics.jsonl`` only, at every evaluation and stops the run when the
pruner says so (the run then ends with ``summary.json`` marked ``stopped_early``). The first trial of
each method is the setting's (the preset's rates, the authors' values).

Layout of a tune folder ``OUT``::

    OUT/tune.json                         the plan (another plan in the same folder is refused)
    OUT/optuna.db                         the Optuna storage, unless --storage
    OUT/calibration/<benchmark>-<key>.json  the calibration the calibrated methods' trials share
    OUT/trials/<method>/t<NNN>/           each trial's run directory, kept as the record
    OUT/record.json                       every trial (parameters, state, objective, rounds, CPU seconds), the budget
    OUT/chosen.toml                       the chosen configuration: fedhv grid OUT/chosen.toml --methods ...

Killed (``kill -9``, a lost node) and rerun with the same command, a tuning loses at most its trials in
flight: finished trials are in the storage; a trial left ``RUNNING`` by a dead driver of this machine is
marked failed and queued again with its parameters and its run directory, which resumes from its last
checkpoint. A ``RUNNING`` trial of a driver on another machine (a shared ``--storage``) is left to it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhv.config import load_config
from fedhv.errors import ConfigError
from fedhv.experiment.grid import CalibrationJob, Job, plan_job
from fedhv.experiment.grid_check import config_differences
from fedhv.experiment.tune_space import (
    OBJECTIVES,
    TRIAL_SPLITS,
    TuneError,
    TunePlan,
    chosen_toml,
    method_space,
    param_overrides,
    trial_configs,
)
from fedhv.experiment.tune_trial import (
    TrialSpec,
    distribution,
    make_pruner,
    open_storage,
    optuna_module,
    quiet_console,
    run_trial,
    shown_url,
    storage_url,
)
from fedhv.procfs import alive, start_ticks
from fedhv.registry import METHODS
from fedhv.results.runfiles import read_bytes_nofollow, write_atomic, write_json
from fedhv.rng import derive_seed

log = logging.getLogger("fedhv")

#: The trial attributes fedhv keeps in the storage.
OWNER, RUN_DIR, OUTCOME, REQUEUED = "fedhv_driver", "fedhv_run_dir", "fedhv_outcome", "fedhv_requeued_from"
CPU_S, WALL_S, ROUNDS, PRUNED_AT = "fedhv_cpu_s", "fedhv_wall_s", "fedhv_rounds", "fedhv_pruned_at"


def _owner() -> str:
    return f"{socket.gethostname()} {os.getpid()} {start_ticks(os.getpid())}"


def _stale(owner: Any) -> bool | None:
    """Whether the driver ``owner`` ("host pid ticks") is gone: ``None`` when it ran on another host."""
    try:
        host, pid, ticks = str(owner).split(" ")
    except ValueError:
        return True  # a trial without a readable owner: no driver of fedhv's holds it
    if host != socket.gethostname():
        return None
    return not alive(int(pid), None if ticks == "None" else int(ticks))


class Tuner:
    """The studies of one plan in one storage: asking, telling, re-queueing, the record and the choice."""

    def __init__(self, plan: TunePlan, out: Path, storage: str, execution: Sequence[str] = ()) -> None:
        self.plan, self.out, self.storage, self.execution = plan, out, storage, tuple(execution)
        self.optuna = optuna_module()
        self.configs = trial_configs(plan, execution)
        self.params = {m: method_space(cfg, plan.ranges) for m, cfg in self.configs.items()}
        self.studies: dict[str, Any] = {}
        self.calibrations: dict[str, CalibrationJob] = {}
        self.owner = _owner()
        self.started = time.perf_counter()

    def study_name(self, method: str) -> str:
        """``fedhv-tune/<setting>/<method>/<plan digest>``: a shared storage holds many tunings."""
        return f"fedhv-tune/{self.plan.name}/{method}/{self.plan.digest()}"

    def prepare(self) -> None:
        """Refuse a folder of another plan, write ``tune.json``, open (or create) the studies, queue each new
        study's first trial (the setting's values) and re-queue the trials a dead driver left running."""
        plan_file = self.out / "tune.json"
        record: dict[str, Any] = {"plan": self.plan.as_dict(), "digest": self.plan.digest(),
                                  "storage": shown_url(self.storage),
                  "objective": f"mean over the last {self.plan.window} validation evaluations of "
                               f"{OBJECTIVES[self.plan.objective][0]}"}
        if plan_file.exists():
            old = json.loads(read_bytes_nofollow(plan_file))
            if old.get("digest") != record["digest"]:
                was, now = old.get("plan", {}), record["plan"]
                diff = "; ".join(f"{k} {json.dumps(was.get(k))} -> {json.dumps(now[k])}" for k in now
                                 if was.get(k) != now[k])
                raise TuneError(f"--out {self.out} holds a tuning of another plan ({diff}); rerun it with its own "
                                "options, or give another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        write_json(plan_file, record)
        optuna = self.optuna
        for method in self.plan.methods:
            study = optuna.create_study(storage=open_storage(self.storage), study_name=self.study_name(method),
                                        direction="maximize", load_if_exists=True,
                                        pruner=make_pruner(self.plan.pruning))
            if not study.get_trials(deepcopy=False) and "fedhv_plan" not in study.user_attrs:
                study.set_user_attr("fedhv_plan", self.plan.as_dict())
                first = {p.name: p.default for p in self.params[method] if p.contains(p.default)}
                study.enqueue_trial(first, user_attrs={"fedhv_first": "the setting's values"})
            self.studies[method] = study
            self._requeue(method, study)
            self.job(method, {p.name: p.default for p in self.params[method]}, "probe")  # its calibration

    def _requeue(self, method: str, study: Any) -> None:
        running = self.optuna.trial.TrialState.RUNNING
        for t in study.get_trials(deepcopy=False, states=(running,)):
            stale = _stale(t.user_attrs.get(OWNER))
            if stale is None:
                log.warning("%s trial %d runs under another driver (%s); left to it", method, t.number,
                            t.user_attrs.get(OWNER))
                continue
            if not stale:  # pragma: no cover - a live driver holding the folder lock is refused before this
                continue
            open_storage(self.storage).set_trial_user_attr(t._trial_id, OUTCOME, "killed")
            study.tell(t.number, state=self.optuna.trial.TrialState.FAIL)
            attrs = {REQUEUED: t.number, **({RUN_DIR: t.user_attrs[RUN_DIR]} if RUN_DIR in t.user_attrs else {})}
            study.enqueue_trial(t.params, user_attrs=attrs)
            print(f"{method}: trial {t.number} was running when its driver died; queued again from its run "
                  f"directory's last checkpoint", flush=True)

    def job(self, method: str, params: dict[str, Any], run_dir: str) -> Job:
        """The trial's grid job: the setting, the plan's overrides, the parameters; its calibration planned."""
        job = plan_job(self.plan.setting, self.plan.base_overrides(self.execution), param_overrides(params), method,
                       self.plan.seed, self.out, (), None, None, {}, self.calibrations)
        return dataclasses.replace(job, run_dir=run_dir)

    def counted(self, t: Any) -> bool:
        """Whether trial ``t`` spent its share of the budget: finished, stopped early or diverged."""
        s = self.optuna.trial.TrialState
        return t.state in (s.COMPLETE, s.PRUNED) or (t.state == s.FAIL and t.user_attrs.get(OUTCOME) == "diverged")

    def remaining(self, method: str) -> int:
        """Trials still to start: the budget less the counted and the running ones (this driver's included)."""
        trials = self.studies[method].get_trials(deepcopy=False)
        running = sum(1 for t in trials if t.state == self.optuna.trial.TrialState.RUNNING)
        return self.plan.trials - sum(1 for t in trials if self.counted(t)) - running

    def ask(self, method: str) -> tuple[Any, TrialSpec]:
        """A new trial of ``method`` (a queued one first) and what runs it."""
        study = self.studies[method]
        # the sampler's seed: the trial's index among the trials not killed, so a killed and resumed tuning
        # samples what an uninterrupted one would (TPE ignores failed trials)
        number = sum(1 for t in study.get_trials(deepcopy=False) if t.user_attrs.get(OUTCOME) != "killed")
        startup = min(10, max(2, self.plan.trials // 3))
        study.sampler = self.optuna.samplers.TPESampler(
            seed=derive_seed(self.plan.seed, "tune", method, number) % 2 ** 32, n_startup_trials=startup)
        trial = study.ask({p.name: distribution(p) for p in self.params[method]})
        run_dir = trial.user_attrs.get(RUN_DIR) or str(self.out / "trials" / method / f"t{trial.number:03d}")
        trial.set_user_attr(RUN_DIR, run_dir)
        trial.set_user_attr(OWNER, self.owner)
        try:
            job = self.job(method, dict(trial.params), run_dir)
        except ConfigError as exc:
            trial.set_user_attr(OUTCOME, f"refused: {exc}")
            study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
            raise
        spec = TrialSpec(method, self.study_name(method), self.storage, trial._trial_id, trial.number, job,
                         self.plan.objective, self.plan.window, self.plan.pruning, self.plan.rounds)
        return trial, spec

    def finish(self, method: str, trial: Any, result: dict[str, Any]) -> str:
        """Tell the study ``result``; the line that says so."""
        s = self.optuna.trial.TrialState
        for key, name in ((CPU_S, "cpu_s"), (WALL_S, "wall_s"), (ROUNDS, "rounds"), (PRUNED_AT, "pruned_at")):
            trial.set_user_attr(key, result[name])
        study, state = self.studies[method], result["state"]
        if state == "complete":
            study.tell(trial, result["value"])
        else:
            if state == "diverged":
                trial.set_user_attr(OUTCOME, "diverged")
            # a diverged trial with values is ranked at its last one, like a stopped one (TPE learns from both)
            has_values = bool(open_storage(self.storage).get_trial(trial._trial_id).intermediate_values)
            study.tell(trial, state=s.PRUNED if state == "pruned" or has_values else s.FAIL)
        value = "n/a" if result["value"] is None else f"{result['value']:.3f}"
        params = ", ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
        where = f" at round {result['pruned_at']}" if state == "pruned" else ""
        return (f"{method} trial {trial.number}: {state}{where}, objective {value} ({result['rounds']} rounds, "
                f"{result['wall_s']:.0f} s) [{params}]")

    def fail(self, method: str, trial: Any, why: str) -> None:
        """A trial that raised: recorded as failed (not counted; the tuning stops, the rerun asks anew)."""
        with contextlib.suppress(Exception):
            trial.set_user_attr(OUTCOME, f"error: {why}"[:500])
            self.studies[method].tell(trial, state=self.optuna.trial.TrialState.FAIL)

    # --- the record and the choice ----------------------------------------------------------------
    def best(self, method: str) -> Any:
        """The study's best finished trial, or ``None``."""
        complete = self.studies[method].get_trials(deepcopy=False,
                                                   states=(self.optuna.trial.TrialState.COMPLETE,))
        return max(complete, key=lambda t: (t.value, -t.number)) if complete else None

    def record(self) -> dict[str, Any]:
        """``record.json``: the plan, the budget and every trial of every method."""
        methods: dict[str, Any] = {}
        cpu_total = 0.0
        for method, study in self.studies.items():
            trials = []
            for t in study.get_trials(deepcopy=False):
                a = t.user_attrs
                trials.append({"number": t.number, "state": t.state.name.lower(), "value": t.value,
                               "params": t.params, "last_step": t.last_step, "rounds": a.get(ROUNDS),
                               "pruned_at": a.get(PRUNED_AT), "outcome": a.get(OUTCOME), "run_dir": a.get(RUN_DIR),
                               "cpu_s": a.get(CPU_S), "wall_s": a.get(WALL_S), "requeued_from": a.get(REQUEUED),
                               "driver": a.get(OWNER)})
            cpu = sum(t["cpu_s"] or 0.0 for t in trials)
            cpu_total += cpu
            best = self.best(method)
            methods[method] = {
                "study": study.study_name, "trials": trials,
                "counted": sum(1 for t in study.get_trials(deepcopy=False) if self.counted(t)),
                "rounds_run": sum(t["rounds"] or 0 for t in trials), "cpu_s": cpu,
                "best": None if best is None else {"number": best.number, "value": best.value, "params": best.params,
                                                   "run_dir": best.user_attrs.get(RUN_DIR)}}
        cal_s = 0.0
        for cal in self.calibrations.values():
            with contextlib.suppress(OSError, ValueError):
                cal_s += float(json.loads(read_bytes_nofollow(Path(cal.path))).get("seconds") or 0.0)
        p = self.plan
        return {"plan": p.as_dict(), "storage": shown_url(self.storage),
                "objective": f"mean over the last {p.window} validation evaluations of {OBJECTIVES[p.objective][0]}",
                "budget": {"trials_per_method": p.trials, "rounds_per_trial": p.rounds,
                           "rounds_per_method": p.trials * p.rounds, "trial_cpu_hours": cpu_total / 3600,
                           "calibration_seconds": cal_s, "calibrations": [c.path for c in self.calibrations.values()]},
                "methods": methods}

    def write_record(self) -> dict[str, Any]:
        """Write ``record.json`` (after every trial); the record."""
        record = self.record()
        write_json(self.out / "record.json", record)
        return record

    def choose(self) -> tuple[Path, list[str]]:
        """Write ``chosen.toml`` (each method's best finished trial, else its setting's values) and check that
        it gives every method its best trial's configuration; the file and the lines that report it."""
        chosen: dict[str, dict[str, Any]] = {}
        lines, notes = [], [
            f"fedhv tune: the chosen configuration of {self.plan.name} for {', '.join(self.plan.methods)}.",
            (f"Objective: the mean over the last {self.plan.window} validation evaluations of "
             f"{OBJECTIVES[self.plan.objective][0]}; {self.plan.trials} trials x {self.plan.rounds} rounds per method."),
            f"Tuned at {self.plan.rounds} rounds: `fedhv grid FILE --rounds {self.plan.rounds}` reruns that length."]
        for method in self.plan.methods:
            best = self.best(method)
            if best is None:
                chosen[method] = {p.name: p.default for p in self.params[method]}
                notes.append(f"{method}: no trial finished; the setting's values")
                lines.append(f"{method}: no trial finished (all stopped early or failed); the setting's values kept")
                continue
            chosen[method] = dict(best.params)
            notes.append(f"{method}: trial {best.number}, objective {best.value:.3f}")
            lines.append(f"{method}: trial {best.number}, objective {best.value:.3f}: "
                         + ", ".join(f"{k}={_short(v)}" for k, v in best.params.items()))
        path = self.out / "chosen.toml"
        write_atomic(path, chosen_toml(self.plan, chosen, notes))
        for method in self.plan.methods:
            best = self.best(method)
            if best is None:
                continue
            job = Job(self.plan.name, str(path), method, self.plan.seed, best.user_attrs[RUN_DIR],
                      (*self.execution, f"rounds={self.plan.rounds}", TRIAL_SPLITS, f"method={json.dumps(method)}",
                       f"seed={self.plan.seed}"))
            others = [o for o in self.plan.methods if o != method]
            shared = {p.name: o for o in others for p in self.params[o] if p.name.split(".")[0] not in ("lr", o)}
            diff = {k: v for k, v in config_differences(job).items()  # other methods' own tables are theirs
                    if not any(k.startswith((f"lr.{o}.", f"{o}.")) for o in others)}
            for key in sorted(set(diff) & set(shared)):
                there, here = diff.pop(key)
                lines.append(f"note: {method} runs with {key} = {_short(here)}, tuned for {shared[key]} (its trial: "
                             f"{_short(there)})")
            if diff:
                lines.append(f"warning: {path} gives {method} another configuration than its trial "
                             f"{best.number}: {diff}")
        return path, lines


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def pin_calibration(plan: TunePlan, execution: Sequence[str] = ()) -> TunePlan:
    """``plan`` with ``calibration.lr_*`` pinned to the rates a grid of its setting calibrates at, when one of
    its methods calibrates (see :class:`~fedhv.config.schema.CalibrationConfig`)."""
    from fedhv.config.schema import CALIBRATION_METHOD

    if not plan.methods or not all(m in METHODS for m in plan.methods):
        return plan  # trial_configs names the bad method
    base = plan.base_overrides(execution)
    if not any(METHODS.get(m).from_config(load_config(plan.setting, (*base, f"method={json.dumps(m)}")))
               .uses_calibration() for m in plan.methods):
        return plan
    cfg = load_config(plan.setting, (*base, f"method={json.dumps(CALIBRATION_METHOD)}"))
    train = cfg.calibration.train_for(cfg.train)
    return dataclasses.replace(plan, pinned=(f"calibration.lr_global={train.lr_global!r}",
                                             f"calibration.lr_local={train.lr_local!r}"))


@dataclass
class TuneReport:
    """What a tuning did: the record, the chosen file and its lines, the seconds."""

    record: dict[str, Any]
    chosen: Path
    lines: list[str]
    seconds: float


def conclude(tuner: Tuner) -> TuneReport:
    """The record and the chosen configuration of a finished tuning."""
    chosen, lines = tuner.choose()
    return TuneReport(tuner.write_record(), chosen, lines, time.perf_counter() - tuner.started)


def run_tune(plan: TunePlan, out: Path, storage: str | None = None, execution: Sequence[str] = ()) -> TuneReport:
    """Tune every method of ``plan`` in this process, one trial at a time, holding ``out``'s driver lock.

    Raises
    ------
    TuneError, ConfigError
        Bad input, before any run; or a trial that failed (the rerun continues).
    KeyboardInterrupt
        Ctrl-C: the running trial is checkpointed; the same command resumes it.
    """
    from fedhv.experiment.grid import _run_calibration
    from fedhv.experiment.grid_lock import driver_lock

    with driver_lock(out, "fedhv tune"):
        tuner = Tuner(plan, out, storage_url(storage, out), execution)
        tuner.prepare()
        for cal in tuner.calibrations.values():
            if not Path(cal.path).exists():
                print(f"calibration: {cal.rounds} rounds -> {cal.path}", flush=True)
                with quiet_console():
                    _run_calibration(cal)
        for method in plan.methods:
            while tuner.remaining(method) > 0:
                trial, spec = tuner.ask(method)
                try:
                    result = run_trial(spec)
                except KeyboardInterrupt:
                    raise  # left RUNNING: the next run of the same command resumes it from its checkpoint
                except Exception as exc:
                    tuner.fail(method, trial, f"{type(exc).__name__}: {exc}")
                    raise TuneError(f"{method} trial {trial.number} failed ({type(exc).__name__}: {exc}); see "
                                    f"{spec.job.run_dir}/run.log, fix it and rerun the same command (finished "
                                    "trials are kept)") from exc
                print(tuner.finish(method, trial, result), flush=True)
                tuner.write_record()
        return conclude(tuner)
