"""Run one configured experiment into a run directory."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm  # type: ignore[import-untyped]

from fedhv.config import dumps, to_dict
from fedhv.config.loader import config_from_toml_text
from fedhv.config.schema import RunConfig
from fedhv.data.federated import FederatedData
from fedhv.experiment.accounting import RunTotals
from fedhv.experiment.calibration import CalibrationResult
from fedhv.experiment.checkpoint import (
    CHECKPOINT_FILE,
    Checkpoint,
    ResumeError,
    config_digest,
    global_rng_state,
    load_checkpoint,
    restore_global_rng,
    save_checkpoint,
    truncate_jsonl,
)
from fedhv.experiment.environment import environment
from fedhv.experiment.loop import RoundRecord, run_rounds
from fedhv.experiment.methods import MethodSetup, build_method
from fedhv.experiment.setup import federated_data, make_engine, new_model
from fedhv.metrics import aggregate_metrics, evaluate_tasks
from fedhv.models import MultiTaskModel, get_flat, set_flat
from fedhv.results.rundir import RunDir, default_run_dir
from fedhv.sim.faults import FaultInjector

log = logging.getLogger("fedhv")


def eval_due(round_done: int, cfg: RunConfig) -> bool:
    """Whether the test set is evaluated after ``round_done`` rounds (1-based)."""
    period = cfg.eval.test_period
    return (period > 0 and round_done % period == 0) or (cfg.eval.final and round_done == cfg.rounds)


def _bar_factory(enabled: bool) -> Callable[[int, str], tqdm]:
    """Progress bars for sub-tasks such as calibration (disabled when quiet)."""
    return lambda total, desc: tqdm(total=total, desc=desc, disable=not enabled, dynamic_ncols=True, mininterval=1.0)


def _fmt(values: list[float], digits: int = 3) -> str:
    return "/".join(f"{v:.{digits}f}" for v in values)


def evaluate(cfg: RunConfig, evaluator: MultiTaskModel, theta: torch.Tensor, data: FederatedData) -> dict[str, Any]:
    """Test metrics (top level) and other configured splits (nested) of ``theta``."""
    set_flat(evaluator, theta)
    entry: dict[str, Any] = {}
    for split in cfg.eval.splits:
        acc, loss = evaluate_tasks(evaluator, *data.eval_sets[split], cfg.eval.batch_size, data.objective)
        values = {**aggregate_metrics(acc, loss), "task_acc": acc, "task_loss": loss}
        if split == "test":
            entry.update(values)
        else:
            entry[split] = values
    return entry


def checkpoint_due(round_done: int, cfg: RunConfig) -> bool:
    """Whether a checkpoint is written after ``round_done`` rounds."""
    c = cfg.checkpoint
    if not c.enabled:
        return False
    return eval_due(round_done, cfg) or round_done == cfg.rounds or (c.period > 0 and round_done % c.period == 0)


def _prepare(cfg: RunConfig, progress: bool, calibration: CalibrationResult | None
             ) -> tuple[FederatedData, MethodSetup]:
    """Threads, data and the built method (calibrating unless ``calibration`` is given)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    data = federated_data(cfg)
    return data, build_method(cfg, data, _bar_factory(progress), calibration)


def run_experiment(cfg: RunConfig, out: str | Path | None = None, progress: bool = True,
                   calibration: CalibrationResult | None = None) -> dict[str, Any]:
    """Train ``cfg.method`` on ``cfg``'s setting and write the run directory.

    Parameters
    ----------
    calibration : CalibrationResult, optional
        Reuse this calibration instead of running one (FedHV with
        ``fedhv.reference = "calibrate"``).

    Returns
    -------
    dict
        The run summary (also written to ``summary.json``).
    """
    start = time.perf_counter()
    # Everything that can fail on bad input (data files, reference checks, calibration)
    # happens before the run directory is created, so a failed start leaves nothing behind.
    data, setup = _prepare(cfg, progress, calibration)
    run = RunDir(Path(out) if out is not None else default_run_dir(cfg.setting, cfg.method, cfg.seed))
    try:
        run.write_text("config.toml", dumps(to_dict(cfg)))
        run.write_json("environment.json", environment())
        if setup.calibration is not None:
            run.write_json("calibration.json", setup.calibration.as_dict())
    except BaseException:
        run.close()
        raise
    return _train(cfg, run, data, setup, None, start, progress)


def resume_experiment(run_dir: str | Path, progress: bool = True) -> dict[str, Any]:
    """Continue an interrupted run to its configured number of rounds.

    The run restarts from its last checkpoint (round 0 when it has none, reusing its
    calibration); records written after the checkpoint, and a torn last line, are
    removed from ``rounds.jsonl`` and ``metrics.jsonl`` first. The result equals that
    of an uninterrupted run, timing fields aside.
    """
    path = Path(run_dir)
    config_path = path / "config.toml"
    if not config_path.is_file():
        raise ResumeError(f"{path} is not a fedhv run directory (no config.toml); give the directory of a run")
    if (path / "summary.json").exists():
        summary = json.loads((path / "summary.json").read_text())
        log.info("%s is already complete (summary.json exists); nothing to resume", path)
        return summary
    text = config_path.read_text()
    cfg = config_from_toml_text(text)
    ckpt = load_checkpoint(path)
    if ckpt is not None and ckpt.config_sha256 != config_digest(text):
        raise ResumeError(
            f"{config_path} changed after the checkpoint was written; restore it or start a new run"
        )
    start = time.perf_counter()
    calibration = None
    if (path / "calibration.json").exists():
        calibration = CalibrationResult.from_dict(json.loads((path / "calibration.json").read_text()))
    data, setup = _prepare(cfg, progress, calibration)
    for stale in path.glob(".*.*"):  # temporary files of writes cut short by a kill
        if stale.name.startswith((".checkpoint.pt.", ".summary.json.", ".calibration.json.")):
            stale.unlink(missing_ok=True)
    offsets = ckpt.offsets if ckpt is not None else {"rounds.jsonl": 0, "metrics.jsonl": 0}
    for name, offset in offsets.items():
        note = truncate_jsonl(path / name, offset).describe(name)
        if note:
            log.warning("resume: %s", note)
    done = 0 if ckpt is None else ckpt.round
    log.warning("resuming %s at round %d of %d", path, done, cfg.rounds)
    run = RunDir(path)
    with open(path / "resumes.jsonl", "a") as fh:
        fh.write(json.dumps({"round": done, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    return _train(cfg, run, data, setup, ckpt, start, progress)


def _train(cfg: RunConfig, run: RunDir, data: FederatedData, setup: MethodSetup, ckpt: Checkpoint | None,
           start: float, progress: bool) -> dict[str, Any]:
    """The round loop with evaluation, logging and checkpoints, then the final files."""
    try:
        model = new_model(cfg, data, cfg.seed)
        evaluator = new_model(cfg, data, cfg.seed).eval()
        engine = make_engine(cfg, model, data, cfg.seed, stream="train")
        faults = FaultInjector(**dataclasses.asdict(cfg.faults), seed=cfg.seed, stream="train")
        sha = config_digest((run.path / "config.toml").read_text())
        if ckpt is None:
            theta, state, totals, last_eval = get_flat(model).clone(), None, RunTotals(), {}
            done, elapsed = 0, 0.0
        else:
            theta = ckpt.theta.to(device=cfg.device, dtype=get_flat(model).dtype)
            state, totals, last_eval = ckpt.state, RunTotals(**ckpt.totals), dict(ckpt.last_eval)
            done, elapsed = ckpt.round, ckpt.elapsed_s
            restore_global_rng(ckpt.rng)
        bar = tqdm(total=cfg.rounds, initial=done, desc=f"{cfg.setting} {cfg.method} s{cfg.seed}",
                   disable=not progress, dynamic_ncols=True, mininterval=1.0)
        loop_start = time.perf_counter() - elapsed
        saved = {"round": done}
        latest: dict[str, Any] = {}

        def checkpoint(round_done: int, theta_now: torch.Tensor, state_now: Any, offsets: dict[str, int]) -> None:
            save_checkpoint(run.path, Checkpoint(
                round_done, theta_now, state_now, dataclasses.asdict(totals), dict(last_eval), offsets,
                time.perf_counter() - loop_start, sha, global_rng_state(),
            ))
            saved["round"] = round_done

        def on_round(rec: RoundRecord, theta_new: torch.Tensor, state_new: Any) -> None:
            totals.add_round(rec)
            record = rec.as_dict()
            record["wall_clock_s"] = time.perf_counter() - loop_start
            if eval_due(rec.round, cfg):
                entry = _evaluation(cfg, evaluator, theta_new, data, rec, totals, loop_start)
                record["time_eval_s"] = entry["time_eval_s"]
                run.metrics.append(entry)
                last_eval.clear()
                last_eval.update(entry)
                if "task_acc" in entry:
                    bar.set_postfix_str(
                        f"acc {_fmt(entry['task_acc'], 2)} mean {entry['mean_acc']:.2f} "
                        f"w {_fmt(rec.log.get('weights') or [], 3)}", refresh=False
                    )
            run.rounds.append(record)
            offsets = {name: (run.path / name).stat().st_size for name in ("rounds.jsonl", "metrics.jsonl")}
            latest.update(round=rec.round, theta=theta_new, state=state_new, offsets=offsets)
            if checkpoint_due(rec.round, cfg):
                checkpoint(rec.round, theta_new, state_new, offsets)
            bar.update()

        try:
            theta, _ = run_rounds(
                setup.algorithm, engine, data, theta, cfg.rounds - done, cfg.train.clients_per_round,
                cfg.seed, "train", on_round, start_round=done, state=state, faults=faults,
            )
        except BaseException:
            # Interrupted or failed: keep every fully written round.
            if cfg.checkpoint.enabled and latest and latest["round"] > saved["round"]:
                checkpoint(latest["round"], latest["theta"], latest["state"], latest["offsets"])
                log.warning("checkpoint written at round %d; continue with `fedhv run --resume %s`",
                            latest["round"], run.path)
            raise
        bar.close()
        loop_seconds = time.perf_counter() - loop_start
        set_flat(evaluator, theta)
        torch.save({"state_dict": evaluator.state_dict(), "round": cfg.rounds}, run.path / "model.pt")
        summary = summarize(cfg, setup, data.task_names, last_eval, totals, loop_seconds, time.perf_counter() - start)
        run.write_json("summary.json", summary)
        # The run is complete: model.pt and summary.json replace the checkpoint.
        (run.path / CHECKPOINT_FILE).unlink(missing_ok=True)
        return summary
    finally:
        run.close()


def _evaluation(cfg: RunConfig, evaluator: MultiTaskModel, theta: torch.Tensor, data: FederatedData,
                rec: RoundRecord, totals: RunTotals, loop_start: float) -> dict[str, Any]:
    """The ``metrics.jsonl`` entry of an evaluated round."""
    t0 = time.perf_counter()
    entry = {"round": rec.round, **evaluate(cfg, evaluator, theta, data)}
    t_eval = time.perf_counter() - t0
    totals.time_eval_s += t_eval
    entry.update({
        "weights": rec.log.get("weights"),
        "sync_stages": rec.sync_stages,
        "bytes_down_per_client_round": rec.bytes_down,
        "bytes_up_per_client_round": rec.bytes_up,
        "dropped_clients": totals.dropped_clients,
        "rejected_clients": totals.rejected_clients,
        "skipped_rounds": totals.skipped_rounds,
        "time_client_s": rec.time_client_s,
        "time_server_s": rec.time_server_s,
        "time_eval_s": t_eval,
        "wall_clock_s": time.perf_counter() - loop_start,
    })
    return entry


def summarize(cfg: RunConfig, setup: MethodSetup, task_names: tuple[str, ...], last_eval: dict[str, Any],
              totals: RunTotals, loop_seconds: float, total_seconds: float) -> dict[str, Any]:
    """``summary.json``: final evaluation, cost and, for FedHV, reference diagnostics.

    ``end_to_end`` adds the calibration cost to the adaptive rounds (paper Appendix D).
    """
    summary: dict[str, Any] = {
        "setting": cfg.setting,
        "method": cfg.method,
        "seed": cfg.seed,
        "rounds": cfg.rounds,
        "engine": cfg.engine,
        "tasks": list(task_names),
        "final_eval_round": last_eval.get("round"),
        **{k: last_eval.get(k) for k in ("mean_acc", "worst_acc", "mean_loss", "hv", "task_acc", "task_loss")},
        "wall_clock_s": loop_seconds,
        "seconds_per_round": loop_seconds / cfg.rounds,
        **totals.cost(),
    }
    end_to_end = {"wall_clock_s": loop_seconds, "bytes_down": totals.bytes_down, "bytes_up": totals.bytes_up,
                  "rounds": cfg.rounds}
    if setup.reference is not None:
        summary["reference"] = setup.reference
        summary["reference_source"] = setup.reference_source
        summary["min_report_slack"] = totals.min_report_slack
        summary["floor_activations"] = totals.floor_activations
        summary["floor_checks"] = cfg.rounds * len(task_names)
    if setup.calibration is not None:
        cal = setup.calibration
        summary["calibration"] = {"rounds": cal.rounds, "seconds": cal.seconds, "bytes_down": cal.bytes_down,
                                  "bytes_up": cal.bytes_up}
        end_to_end = {"wall_clock_s": loop_seconds + cal.seconds, "bytes_down": totals.bytes_down + cal.bytes_down,
                      "bytes_up": totals.bytes_up + cal.bytes_up, "rounds": cfg.rounds + cal.rounds}
    summary["end_to_end"] = end_to_end
    summary["wall_clock_total_s"] = total_seconds
    return summary
