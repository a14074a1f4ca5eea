"""Reference calibration (paper §3.2, B.8).

One (or several) uniform-weight runs of ``R`` rounds whose clients report their task
losses exactly as FedHV clients do; the reference is

    r_i = max over calibration seeds and rounds of F_i^t  +  delta_r.

The adaptive run then restarts from a fresh initialisation; only ``r`` is reused.
The calibration seeds are independent of the training seed (the paper shares one
reference across all training seeds).

A stored calibration (``calibration.json`` of a run, or a grid's shared file) carries
``digest``, the SHA-256 of the canonical JSON of its other fields
(:func:`calibration_digest`); loading verifies it, so an edited or damaged file is
refused instead of silently changing the reference.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from fedhv import safe_io
from fedhv.algorithms.uniform import UniformAlgorithm
from fedhv.config.schema import CALIBRATION_METHOD, RunConfig
from fedhv.data.federated import FederatedData
from fedhv.errors import FedHVError
from fedhv.experiment.divergence import check_calibration_round, lr_hint
from fedhv.experiment.loop import FederationFactory, RoundRecord, run_rounds
from fedhv.experiment.problem import Problem
from fedhv.experiment.setup import make_engine
from fedhv.models import get_flat
from fedhv.weighting.module import reference_from_losses

#: ``(total, description) -> progress bar`` with ``update()`` and ``close()``.
ProgressFactory = Callable[[int, str], Any]


class CalibrationError(FedHVError):
    """A stored calibration that is malformed, edited or damaged."""


def calibration_digest(data: dict[str, Any]) -> str:
    """SHA-256 (hex) of ``json.dumps(data without "digest", sort_keys=True, separators=(",", ":"))``.

    Non-finite floats count as ``null`` (what the strict JSON writer stores). JSON
    floats round-trip exactly, so the digest of a file's parsed content equals the
    digest of the result that was written.
    """
    body = safe_io.finite_json({k: v for k, v in data.items() if k != "digest"})
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


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

    def as_dict(self) -> dict[str, Any]:
        """The fields and their ``digest`` (what ``calibration.json`` holds)."""
        data = dict(self.__dict__)
        data["digest"] = calibration_digest(data)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "calibration") -> CalibrationResult:
        """Inverse of :meth:`as_dict` (e.g. a run directory's ``calibration.json``).

        Raises
        ------
        CalibrationError
            When the digest is missing or does not match the fields, or the fields are
            not those of a calibration; ``source`` names the file in the message.
        """
        fix = f"delete {source} to recompute the calibration"
        if not isinstance(data, dict):
            raise CalibrationError(f"{source} is not a JSON object; {fix}")
        names = {f.name for f in fields(cls)}
        required = {"reference", "max_report", "margin", "seeds"}  # the fields without defaults
        keys = set(data) - {"digest"}
        if not required <= keys <= names:
            raise CalibrationError(f"{source} has the fields {sorted(keys)}, expected {sorted(names)}; {fix}")
        if "digest" not in data:
            raise CalibrationError(f"{source} has no digest (written by an older fedhv or edited); {fix}")
        if data["digest"] != calibration_digest(data):
            raise CalibrationError(f"{source} was modified after it was written (its digest does not match); {fix}")
        return cls(**{k: v for k, v in data.items() if k != "digest"})


def load_calibration(path: str | Path) -> CalibrationResult:
    """Read and verify a stored calibration (see :meth:`CalibrationResult.from_dict`)."""
    from fedhv.results.rundir import RunDirError, read_bytes_nofollow

    path = Path(path)
    try:
        data = json.loads(read_bytes_nofollow(path).decode("utf-8"))
    except RunDirError:  # a symbolic link: never followed
        raise CalibrationError(f"{path} is a symbolic link (to {os.readlink(path)}); fedhv never follows links for "
                               f"a calibration: delete {path} to recompute the calibration") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"{path} cannot be read ({exc}); delete {path} to recompute the calibration") from None
    return CalibrationResult.from_dict(data, source=str(path))


def calibrate(cfg: RunConfig, data: FederatedData, progress: ProgressFactory | None = None,
              federation_factory: FederationFactory | None = None, problem: Problem | None = None
              ) -> CalibrationResult:
    """Run the uniform-weight calibration and derive the reference.

    ``progress(total, description)``, if given, returns a progress bar (``update()``,
    ``close()``) advanced once per calibration round. ``federation_factory`` runs the
    calibration rounds on another back-end (:func:`~fedhv.experiment.loop.run_rounds`).
    ``problem`` makes the models (by default the one ``cfg`` names).
    """
    problem = problem if problem is not None else Problem.of(cfg)
    c = cfg.calibration
    cfg = replace(cfg, train=c.train_for(cfg.train))  # calibration.lr_*, when pinned
    bar = progress(c.rounds * len(c.seeds), "calibration") if progress is not None else None
    start = time.perf_counter()
    records: dict[str, list[RoundRecord]] = {}

    def on_round(rec: RoundRecord, theta: Any, state: Any) -> None:
        # No faults are simulated here: a round without a valid reply means the calibration diverged.
        check_calibration_round(rec.round, rec.skipped, rec.rejected, lr_hint(cfg.lr_local, cfg.lr_global))
        records[current].append(rec)
        if bar is not None:
            bar.update()

    for seed in c.seeds:
        current = str(seed)
        records[current] = []
        model = problem.model(cfg, data, seed)
        engine = make_engine(cfg, model, data, seed, stream="calibration")
        algorithm = UniformAlgorithm(lr_global=cfg.lr_global, report=True,
                                     report_batches=cfg.section(CALIBRATION_METHOD).report_batches)
        run_rounds(
            algorithm, engine, data, get_flat(model).clone(), c.rounds,
            cfg.train.clients_per_round, seed, "calibration", on_round, validation=cfg.validation,
            federation_factory=federation_factory, aggregation=cfg.train.aggregation,
        )
    if bar is not None:
        bar.close()
    return calibration_from_records(records, c.margin, time.perf_counter() - start, c.seeds)


def calibration_from_records(records: Mapping[str, Sequence[RoundRecord]], margin: float,
                             seconds: float = 0.0, seeds: Sequence[int] | None = None) -> CalibrationResult:
    """The calibration of finished uniform-weight rounds, independent of any configuration.

    For the averaged reports ``F^{s,t}`` of calibration seed ``s`` and round ``t``::

        max_report_i = max_{s,t} F_i^{s,t},      r_i = max_report_i + margin,

    both computed by :func:`fedhv.weighting.reference_from_losses` (the one implementation
    of the rule, shared with the centralized recipe); bytes are totals over rounds and
    clients, ``sum_t bytes_per_client^t * |clients^t|``. Used by the configured run
    (:func:`calibrate`) and by :func:`fedhv.calibrate` / :func:`fedhv.simulate`.

    Parameters
    ----------
    records : mapping ``{seed: [RoundRecord per round]}``
        Each record's ``log["report"]`` is ``F^{s,t}``.
    margin : float
        ``delta_r >= 0``.
    seconds : float
        Wall-clock time of the calibration.
    seeds : sequence of int, optional
        The calibration seeds as configured (default: the keys of ``records``).
    """
    reports = {str(seed): [list(rec.log["report"]) for rec in recs] for seed, recs in records.items()}
    rows = [row for rows in reports.values() for row in rows]
    if not rows:
        raise CalibrationError("the calibration has no rounds; give calibration rounds >= 1 and at least one seed")
    all_records = [rec for recs in records.values() for rec in recs]
    return CalibrationResult(
        reference=reference_from_losses(rows, margin),
        max_report=reference_from_losses(rows, 0.0),
        margin=margin,
        seeds=[int(seed) for seed in (records if seeds is None else seeds)],
        reports=reports,
        rounds=len(all_records),
        seconds=seconds,
        bytes_down=sum(rec.bytes_down * len(rec.clients) for rec in all_records),
        bytes_up=sum(rec.bytes_up * len(rec.clients) for rec in all_records),
    )
