"""Reference calibration (paper §3.2, B.8).

One (or several) uniform-weight runs of ``R`` rounds whose clients report their task
losses exactly as FedHV clients do; the reference is

    r_i = max over calibration seeds and rounds of F_i^t  +  delta_r.

The adaptive run then restarts from a fresh initialisation; only ``r`` is reused.
The calibration seeds are independent of the training seed (the paper shares one
reference across all training seeds).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedhv.algorithms.uniform import Uniform
from fedhv.config.schema import RunConfig
from fedhv.data.federated import FederatedData
from fedhv.experiment.loop import RoundRecord, run_rounds
from fedhv.experiment.setup import make_engine, new_model
from fedhv.models import get_flat

#: ``(total, description) -> progress bar`` with ``update()`` and ``close()``.
ProgressFactory = Callable[[int, str], Any]


@dataclass
class CalibrationResult:
    """Reference and cost of a calibration.

    Attributes
    ----------
    reference : list of float
        ``r = max reports + margin``.
    max_report : list of float
    reports : dict
        ``{seed: [[F_1, ..., F_m] per round]}``.
    rounds : int
        Sequential calibration rounds (rounds x seeds).
    seconds : float
    bytes_down, bytes_up : int
        Total bytes over all calibration rounds and participating clients.
    """

    reference: list[float]
    max_report: list[float]
    margin: float
    seeds: list[int]
    reports: dict[str, list[list[float]]] = field(default_factory=dict)
    rounds: int = 0
    seconds: float = 0.0
    bytes_down: int = 0
    bytes_up: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationResult:
        """Inverse of :meth:`as_dict` (e.g. a run directory's ``calibration.json``)."""
        return cls(**data)


def calibrate(cfg: RunConfig, data: FederatedData, progress: ProgressFactory | None = None) -> CalibrationResult:
    """Run the uniform-weight calibration and derive the reference.

    ``progress(total, description)``, if given, returns a progress bar (``update()``,
    ``close()``) advanced once per calibration round.
    """
    c = cfg.calibration
    bar = progress(c.rounds * len(c.seeds), "calibration") if progress is not None else None
    start = time.perf_counter()
    records: dict[str, list[RoundRecord]] = {}

    def on_round(rec: RoundRecord, theta: Any, state: Any) -> None:
        records[current].append(rec)
        if bar is not None:
            bar.update()

    for seed in c.seeds:
        current = str(seed)
        records[current] = []
        model = new_model(cfg, data, seed)
        engine = make_engine(cfg, model, data, seed, stream="calibration")
        algorithm = Uniform(lr_global=cfg.lr_global, report=True, report_batches=cfg.fedhv.report_batches)
        run_rounds(
            algorithm, engine, data, get_flat(model).clone(), c.rounds,
            cfg.train.clients_per_round, seed, "calibration", on_round,
        )
    if bar is not None:
        bar.close()
    all_records = [rec for recs in records.values() for rec in recs]
    reports = {seed: [rec.log["report"] for rec in recs] for seed, recs in records.items()}
    stacked = np.array([row for rows in reports.values() for row in rows])
    max_report = stacked.max(0)
    return CalibrationResult(
        reference=(max_report + c.margin).tolist(),
        max_report=max_report.tolist(),
        margin=c.margin,
        seeds=list(c.seeds),
        reports=reports,
        rounds=c.rounds * len(c.seeds),
        seconds=time.perf_counter() - start,
        bytes_down=sum(rec.bytes_down * len(rec.clients) for rec in all_records),
        bytes_up=sum(rec.bytes_up * len(rec.clients) for rec in all_records),
    )
