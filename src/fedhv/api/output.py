"""The run directory of :func:`fedhv.simulate` (``out=``): the files ``fedhv run`` writes.

``simulate(..., out=DIR)`` claims ``DIR`` with :class:`~fedhv.results.rundir.RunDir` (an
exclusive ``flock`` on ``DIR/.lock``; a directory that already holds a run is refused, a
finished one is replaced only with ``overwrite=True``) before any work starts, and writes

- ``config.toml``: what applies to a user model: ``setting`` (the ``name`` argument),
  ``method``, ``seed``, ``rounds``, ``engine``, ``[train]``, ``[eval]``, the method's
  options, ``[tasks]`` and ``source = "fedhv.simulate"`` (it names a Python model, so
  ``fedhv run`` cannot re-run it);
- ``environment.json``: versions, host, threads and the data description;
- ``calibration.json``: FedHV's calibration (with its digest), when it ran;
- ``rounds.jsonl`` / ``metrics.jsonl``: one line per round / evaluation, flushed and
  fsync'ed as they happen, with the fields of ``fedhv run``'s lines;
- ``model.pt`` and ``summary.json`` (atomically, at the end).

So ``fedhv table DIR`` and ``fedhv plot DIR`` read it like any other run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import nn

from fedhv.config import dumps
from fedhv.experiment.accounting import RunTotals
from fedhv.experiment.calibration import CalibrationResult
from fedhv.experiment.environment import environment
from fedhv.experiment.loop import RoundRecord
from fedhv.metrics.summary import SUMMARY_EVAL_KEYS
from fedhv.results.rundir import RunDir, write_atomic_with

_START_FILES = ("calibration.json", "environment.json", "config.toml")
#: ``config.toml``'s ``source`` of a ``simulate`` run: an unfinished one cannot be resumed by
#: ``fedhv run --resume``, so ``overwrite=True`` may replace it (when no process holds it).
_SOURCE = "fedhv.simulate"


def _toml_safe(value: Any) -> Any:
    """``value`` without ``None`` entries (TOML has no null); tuples as lists."""
    if isinstance(value, dict):
        return {k: _toml_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_toml_safe(v) for v in value]
    return value


def method_options(method: Any) -> dict[str, Any]:
    """The method object's options as a TOML table (``lr_global`` goes to ``[train]``)."""
    fields = {f.name: getattr(method, f.name) for f in dataclasses.fields(method)}
    fields.pop("lr_global", None)
    table = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v
             for k, v in fields.items()}
    return _toml_safe(table)


def round_record(rec: RoundRecord, wall_clock_s: float, eval_entry: dict[str, Any] | None) -> dict[str, Any]:
    """The ``rounds.jsonl`` record of round ``rec`` (as ``fedhv run`` writes it)."""
    record = {**rec.as_dict(), "wall_clock_s": wall_clock_s}
    if eval_entry is not None:
        record["time_eval_s"] = eval_entry["time_eval_s"]
    return record


class SimRunWriter:
    """Writes one :func:`fedhv.simulate` run into a locked run directory.

    Call :meth:`start` once the run can start (after a calibration), then
    :meth:`round` / :meth:`evaluation` per round and :meth:`finish`; :meth:`fail` on an
    error (before :meth:`start` it removes what the claim created, after it keeps every
    written line), :meth:`close` in any case.
    """

    def __init__(self, out: str | Path, overwrite: bool = False) -> None:
        self.run = RunDir.create(out, overwrite=overwrite, replace_unfinished=_SOURCE)
        self.path = self.run.path
        self.totals = RunTotals()
        self.started = False
        self.last_eval: dict[str, Any] = {}

    def start(self, config: dict[str, Any], provenance: dict[str, Any], calibration: CalibrationResult | None) -> None:
        """Write ``config.toml``, ``environment.json`` and ``calibration.json``; open the line files."""
        self.run.write_text("config.toml", dumps(_toml_safe(config)))
        self.run.write_json("environment.json", environment(provenance))
        if calibration is not None:
            self.run.write_json("calibration.json", calibration.as_dict())
        self.run.open_logs()
        self.started = True

    def round(self, rec: RoundRecord, wall_clock_s: float, eval_entry: dict[str, Any] | None) -> dict[str, Any]:
        """Append round ``rec`` (and its evaluation) to the line files; return the ``rounds.jsonl`` record."""
        self.totals.add_round(rec)
        record = round_record(rec, wall_clock_s, eval_entry)
        if eval_entry is not None:
            self.totals.time_eval_s += eval_entry["time_eval_s"]
            entry = {
                **eval_entry, "weights": rec.log.get("weights"), "sync_stages": rec.sync_stages,
                "bytes_down_per_client_round": rec.bytes_down, "bytes_up_per_client_round": rec.bytes_up,
                "dropped_clients": self.totals.dropped_clients, "rejected_clients": self.totals.rejected_clients,
                "skipped_rounds": self.totals.skipped_rounds, "time_client_s": rec.time_client_s,
                "time_server_s": rec.time_server_s, "wall_clock_s": wall_clock_s,
            }
            self.run.metrics.append(entry)
            self.last_eval = entry
        self.run.rounds.append(record)
        return record

    def finish(self, config: dict[str, Any], tasks: list[str], model: nn.Module, reference: list[float] | None,
               calibration: CalibrationResult | None, loop_seconds: float, total_seconds: float,
               task_metrics: list[dict[str, Any]] | None = None, hv_reference: list[float] | None = None,
               stopped_early: bool = False) -> None:
        """Write ``model.pt`` (``{"state_dict", "round"}``, on the CPU) and ``summary.json``.

        ``state_dict`` is the user's module's own (``MyNet().load_state_dict(torch.load(path,
        weights_only=True)["state_dict"])``), as ``fedhv run`` writes it.
        """
        rounds = int(config["rounds"])
        buffer = io.BytesIO()
        torch.save({"state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}, "round": rounds},
                   buffer)

        def write(fh: BinaryIO) -> None:
            fh.write(buffer.getvalue())

        write_atomic_with(self.path / "model.pt", write)
        last = self.last_eval
        summary: dict[str, Any] = {
            "setting": config["setting"], "method": config["method"], "seed": config["seed"], "rounds": rounds,
            "engine": config["engine"], "tasks": tasks, "final_eval_round": last.get("round"),
            **{k: last.get(k) for k in SUMMARY_EVAL_KEYS},
            "task_metrics": task_metrics, "hv_reference": hv_reference,
            "wall_clock_s": loop_seconds, "seconds_per_round": loop_seconds / max(rounds, 1), **self.totals.cost(),
        }
        end_to_end = {"wall_clock_s": loop_seconds, "bytes_down": self.totals.bytes_down,
                      "bytes_up": self.totals.bytes_up, "rounds": rounds}
        if reference is not None:
            summary.update(reference=reference, reference_source="calibrate" if calibration else "given",
                           min_report_slack=self.totals.min_report_slack,
                           floor_activations=self.totals.floor_activations, floor_checks=rounds * len(tasks))
        if calibration is not None:
            cal = calibration
            summary["calibration"] = {"rounds": cal.rounds, "seconds": cal.seconds, "bytes_down": cal.bytes_down,
                                      "bytes_up": cal.bytes_up}
            end_to_end = {"wall_clock_s": loop_seconds + cal.seconds,
                          "bytes_down": self.totals.bytes_down + cal.bytes_down,
                          "bytes_up": self.totals.bytes_up + cal.bytes_up, "rounds": rounds + cal.rounds}
        if stopped_early:
            summary["stopped_early"] = True
        summary["end_to_end"] = end_to_end
        summary["wall_clock_total_s"] = total_seconds
        self.run.write_json("summary.json", summary)

    def fail(self) -> None:
        """After an error: a run that never started leaves nothing behind; a started one keeps its lines."""
        if self.started:
            self.run.close()
            return
        for name in _START_FILES:
            with contextlib.suppress(OSError):
                (self.path / name).unlink(missing_ok=True)
        self.run.abandon()

    def close(self) -> None:
        self.run.close()
