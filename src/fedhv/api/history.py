"""What :func:`fedhv.simulate` returns: :class:`History`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from fedhv.experiment.calibration import CalibrationResult


@dataclass
class History:
    """What a simulation produced.

    The keys of ``rounds`` and ``evaluations`` are those of the run directory's
    ``rounds.jsonl`` and ``metrics.jsonl`` (and ``summary.json`` for the last evaluation).

    Attributes
    ----------
    rounds : list of dict
        One record per round (``round``, ``clients``, ``weights`` ``w^t``, ``report`` ``F^t``,
        bytes, times), as ``rounds.jsonl``.
    evaluations : list of dict
        Per test evaluation: ``round``, ``task_score`` (each task's score in its metric's
        units), ``task_acc`` (accuracy in %, ``None`` for a task without one), ``task_loss``,
        ``mean_acc`` / ``worst_acc`` (over the tasks with an accuracy; ``None`` if none),
        ``mean_loss`` and ``hv = prod_i max(r^eval_i - loss_i, 0)``, as ``metrics.jsonl``.
    model : nn.Module
        A copy of the user's module holding the final parameters and buffers, in eval mode.
    tasks : list of str
        Task names, in output order.
    task_metrics : list of dict
        Per task: ``task``, ``metric`` (``"accuracy"``, ``"mse"``, ...), ``higher_is_better``,
        ``is_accuracy``.
    hv_reference : list of float
        The HV offsets ``r^eval`` used.
    reference : list of float or None
        FedHV's reference ``r``; ``calibration`` the calibration that produced it.
    engine : str
        The engine that ran (``"batched"`` or ``"sequential"``).
    out : Path or None
        The run directory written (``simulate(out=...)``), else None.
    seconds : float
        Wall-clock time of the whole call (calibration included).
    stopped_early : bool
        Whether a ``callback`` stopped the run before ``rounds``.
    client_ids : list
        Client ``c``'s id (``FederatedDataset.client_ids``: its natural id under
        ``partition="ids"``, else ``c``); ``rounds[k]["clients"]`` hold client indices ``c``.
    """

    rounds: list[dict[str, Any]]
    evaluations: list[dict[str, Any]]
    model: nn.Module
    reference: list[float] | None = None
    calibration: CalibrationResult | None = None
    engine: str = "batched"
    out: Path | None = None
    seconds: float = 0.0
    tasks: list[str] = field(default_factory=list)
    task_metrics: list[dict[str, Any]] = field(default_factory=list)
    hv_reference: list[float] = field(default_factory=list)
    stopped_early: bool = False
    client_ids: list[Any] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def round_client_ids(self, k: int) -> list[Any]:
        """The ids of the clients sampled in ``rounds[k]`` (``client_ids[c]`` of each index ``c``)."""
        return [self.client_ids[c] for c in self.rounds[k].get("clients") or []]

    def to_rows(self) -> list[dict[str, Any]]:
        """One flat dict per round, pandas-ready (``pandas.DataFrame(hist.to_rows())``).

        Keys: ``round``, ``clients`` (how many), ``weight/<task>``, ``report/<task>`` (when the
        method reports), the round's times and bytes, and on evaluated rounds ``mean_acc``,
        ``worst_acc``, ``mean_loss``, ``hv``, ``score/<task>``, ``acc/<task>`` (tasks with an
        accuracy) and ``loss/<task>``.
        """
        evals = {e["round"]: e for e in self.evaluations}
        rows = []
        for rec in self.rounds:
            row: dict[str, Any] = {"round": rec["round"], "clients": len(rec.get("clients") or [])}
            for key, prefix in (("weights", "weight"), ("report", "report")):
                values = rec.get(key)
                if isinstance(values, list) and len(values) == len(self.tasks):
                    row.update({f"{prefix}/{t}": v for t, v in zip(self.tasks, values)})
            for key in ("time_client_s", "time_server_s", "wall_clock_s", "bytes_down_per_client",
                        "bytes_up_per_client"):
                if key in rec:
                    row[key] = rec[key]
            ev = evals.get(rec["round"])
            if ev is not None:
                row.update({k: ev.get(k) for k in ("mean_acc", "worst_acc", "mean_loss", "hv")})
                for t, score, acc, loss in zip(self.tasks, ev["task_score"], ev["task_acc"], ev["task_loss"]):
                    row[f"score/{t}"] = score
                    if acc is not None:
                        row[f"acc/{t}"] = acc
                    row[f"loss/{t}"] = loss
            rows.append(row)
        return rows
