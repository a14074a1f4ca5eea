"""Run one configured experiment into a run directory."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from fedhv.config import dumps, to_dict
from fedhv.config.schema import RunConfig
from fedhv.data.federated import FederatedData
from fedhv.experiment.accounting import RunTotals
from fedhv.experiment.environment import environment
from fedhv.experiment.loop import RoundRecord, run_rounds
from fedhv.experiment.methods import MethodSetup, build_method
from fedhv.experiment.setup import federated_data, make_engine, new_model
from fedhv.metrics import aggregate_metrics, evaluate_tasks
from fedhv.models import MultiTaskModel, get_flat, set_flat
from fedhv.results.rundir import RunDir, default_run_dir


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


def run_experiment(cfg: RunConfig, out: str | Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Train ``cfg.method`` on ``cfg``'s setting and write the run directory.

    Returns
    -------
    dict
        The run summary (also written to ``summary.json``).
    """
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    # Everything that can fail on bad input (data files, reference checks, calibration)
    # happens before the run directory is created, so a failed start leaves nothing behind.
    data = federated_data(cfg)
    setup = build_method(cfg, data, _bar_factory(progress))
    run = RunDir(Path(out) if out is not None else default_run_dir(cfg.setting, cfg.method, cfg.seed))
    try:
        run.write_text("config.toml", dumps(to_dict(cfg)))
        run.write_json("environment.json", environment())
        if setup.calibration is not None:
            run.write_json("calibration.json", setup.calibration.as_dict())
        bar = tqdm(total=cfg.rounds, desc=f"{cfg.setting} {cfg.method} s{cfg.seed}", disable=not progress,
                   dynamic_ncols=True, mininterval=1.0)
        model = new_model(cfg, data, cfg.seed)
        evaluator = new_model(cfg, data, cfg.seed).eval()
        engine = make_engine(cfg, model, data, cfg.seed, stream="train")
        totals = RunTotals()
        last_eval: dict[str, Any] = {}
        loop_start = time.perf_counter()

        def on_round(rec: RoundRecord, theta_new: torch.Tensor, state: Any) -> None:
            totals.add_round(rec)
            record = rec.as_dict()
            record["wall_clock_s"] = time.perf_counter() - loop_start
            if eval_due(rec.round, cfg):
                t0 = time.perf_counter()
                entry = {"round": rec.round, **evaluate(cfg, evaluator, theta_new, data)}
                t_eval = time.perf_counter() - t0
                totals.time_eval_s += t_eval
                record["time_eval_s"] = t_eval
                entry.update({
                    "weights": rec.log.get("weights"),
                    "sync_stages": rec.sync_stages,
                    "bytes_down_per_client_round": rec.bytes_down,
                    "bytes_up_per_client_round": rec.bytes_up,
                    "time_client_s": rec.time_client_s,
                    "time_server_s": rec.time_server_s,
                    "time_eval_s": t_eval,
                    "wall_clock_s": time.perf_counter() - loop_start,
                })
                run.metrics.append(entry)
                last_eval.clear()
                last_eval.update(entry)
                if "task_acc" in entry:
                    bar.set_postfix_str(
                        f"acc {_fmt(entry['task_acc'], 2)} mean {entry['mean_acc']:.2f} "
                        f"w {_fmt(rec.log.get('weights') or [], 3)}", refresh=False
                    )
            run.rounds.append(record)
            bar.update()

        theta, _ = run_rounds(
            setup.algorithm, engine, data, get_flat(model).clone(), cfg.rounds, cfg.train.clients_per_round,
            cfg.seed, "train", on_round,
        )
        bar.close()
        loop_seconds = time.perf_counter() - loop_start
        set_flat(evaluator, theta)
        torch.save({"state_dict": evaluator.state_dict(), "round": cfg.rounds}, run.path / "model.pt")
        summary = summarize(cfg, setup, data.task_names, last_eval, totals, loop_seconds, time.perf_counter() - start)
        run.write_json("summary.json", summary)
        return summary
    finally:
        run.close()


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
