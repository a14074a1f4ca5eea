"""What a run writes about itself: evaluation entries (``metrics.jsonl``), ``summary.json``,
``model.pt`` and the model buffers of a checkpoint -- one implementation for ``fedhv run``,
``fedhv grid``, Flower and ``fedhv.simulate`` (which all run through
:mod:`fedhv.experiment.runner`)."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any, BinaryIO

import torch

from fedhv.config.schema import RunConfig
from fedhv.data.federated import FederatedData
from fedhv.errors import ConfigError
from fedhv.experiment.accounting import RunTotals
from fedhv.experiment.checkpoint import ResumeError
from fedhv.experiment.loop import RoundRecord
from fedhv.experiment.method_setup import MethodSetup
from fedhv.metrics import evaluate_record
from fedhv.metrics.summary import SUMMARY_EVAL_KEYS, hv_reference, list_or_float
from fedhv.models import MultiTaskModel, set_flat
from fedhv.results.rundir import write_atomic_with
from fedhv.sim.precision import amp_module


def evaluated_splits(cfg: RunConfig, data: FederatedData) -> tuple[str, ...]:
    """The sets a run evaluates: ``eval.splits``, or (empty, the default) ``"test"`` and, where the
    data holds a validation set, ``"val"``.

    Raises
    ------
    ConfigError
        When ``eval.splits`` names a set the data does not hold (checked before round 1).
    """
    if not cfg.eval.splits:
        return tuple(split for split in ("test", "val") if split in data.eval_sets)
    missing = [split for split in cfg.eval.splits if split not in data.eval_sets]
    if missing:
        fix = ("give the FederatedDataset validation= (a fraction of the training rows or its own tensors)"
               if "val" in missing else "give the data a test set")
        raise ConfigError(f"eval.splits = {list(cfg.eval.splits)}: the data of data.benchmark = "
                          f"{cfg.data.benchmark!r} holds no {' or '.join(map(repr, missing))} set; {fix}, or "
                          "leave eval.splits unset (the sets the data holds)")
    return cfg.eval.splits


def evaluate(cfg: RunConfig, evaluator: MultiTaskModel, theta: torch.Tensor, data: FederatedData) -> dict[str, Any]:
    """Test metrics (top level) and the other evaluated sets' (nested, ``entry["val"]``) of ``theta``
    (:func:`evaluated_splits`)."""
    set_flat(evaluator, theta)
    entry: dict[str, Any] = {}
    for split in evaluated_splits(cfg, data):
        values = evaluate_record(amp_module(evaluator, cfg.precision), *data.eval_sets[split],
                                 cfg.eval.batch_size, data.objective, list_or_float(cfg.eval.hv_reference))
        if split == "test":
            entry.update(values)
        else:
            entry[split] = values
    return entry


def write_model(path: Path, model: MultiTaskModel, rounds: int) -> None:
    """``model.pt``: ``{"state_dict": the user's module's own keys, on the CPU, "round": rounds}``
    (``MyNet().load_state_dict(torch.load(path, weights_only=True)["state_dict"])``), atomically."""
    buffer = io.BytesIO()
    cpu_state = {k: v.detach().cpu() for k, v in model.user_state_dict().items()}  # loadable without a GPU
    torch.save({"state_dict": cpu_state, "round": rounds}, buffer)

    def write(fh: BinaryIO) -> None:
        fh.write(buffer.getvalue())

    write_atomic_with(path, write)


def restore_buffers(engine: Any, buffers: list[torch.Tensor], path: Path) -> None:
    """Load a checkpoint's global buffers into the engine (refused when they do not fit the model)."""
    shapes = [tuple(b.shape) for b in engine.buffers]
    if [tuple(b.shape) for b in buffers] != shapes:
        raise ResumeError(f"{path}: the checkpoint holds {len(buffers)} model buffers that do not fit the model's "
                          f"{len(shapes)}; delete checkpoint.pt to restart the run from round 0")
    engine.load_buffers([b.to(device=dst.device, dtype=dst.dtype) for b, dst in zip(buffers, engine.buffers)])


def evaluation_entry(cfg: RunConfig, evaluator: MultiTaskModel, theta: torch.Tensor, data: FederatedData,
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
              totals: RunTotals, loop_seconds: float, total_seconds: float,
              task_metrics: list[dict[str, Any]] | None = None, rounds_done: int | None = None) -> dict[str, Any]:
    """``summary.json``: final evaluation, cost and, for FedHV, reference diagnostics.

    ``task_metrics`` names each task's score (metric, direction, whether it enters MeanAcc);
    ``hv_reference`` records the HV offsets used. ``rounds_done`` below ``cfg.rounds``: a run an
    in-process callback stopped (``fedhv.simulate``), marked ``stopped_early``.

    ``end_to_end`` adds the calibration cost to the adaptive rounds (paper Appendix D).
    """
    rounds = cfg.rounds if rounds_done is None else rounds_done
    summary: dict[str, Any] = {
        "setting": cfg.setting,
        "method": cfg.method,
        "seed": cfg.seed,
        "rounds": rounds,
        "engine": cfg.engine,
        "tasks": list(task_names),
        "final_eval_round": last_eval.get("round"),
        **{k: last_eval.get(k) for k in SUMMARY_EVAL_KEYS},
        "task_metrics": task_metrics,
        "hv_reference": hv_reference(cfg.eval.hv_reference, len(task_names)),
        "wall_clock_s": loop_seconds,
        "seconds_per_round": loop_seconds / max(rounds, 1),
        **totals.cost(),
    }
    end_to_end = {"wall_clock_s": loop_seconds, "bytes_down": totals.bytes_down, "bytes_up": totals.bytes_up,
                  "rounds": rounds}
    if rounds < cfg.rounds:
        summary["stopped_early"] = True
    if setup.complexity is not None:
        summary["complexity"] = list(setup.complexity)
    if setup.label is not None:
        summary["label"] = setup.label
    if setup.reference is not None:
        summary["reference"] = setup.reference
        summary["reference_source"] = setup.reference_source
        summary["min_report_slack"] = totals.min_report_slack
        summary["floor_activations"] = totals.floor_activations
        summary["floor_checks"] = rounds * len(task_names)
    if setup.calibration is not None:
        cal = setup.calibration
        summary["calibration"] = {"rounds": cal.rounds, "seconds": cal.seconds, "bytes_down": cal.bytes_down,
                                  "bytes_up": cal.bytes_up}
        end_to_end = {"wall_clock_s": loop_seconds + cal.seconds, "bytes_down": totals.bytes_down + cal.bytes_down,
                      "bytes_up": totals.bytes_up + cal.bytes_up, "rounds": rounds + cal.rounds}
    summary["end_to_end"] = end_to_end
    summary["wall_clock_total_s"] = total_seconds
    return summary
