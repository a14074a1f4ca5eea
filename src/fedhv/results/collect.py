"""Find run directories under a folder and read what the tables and figures need.

Reads only files (``config.toml``, ``summary.json``, ``metrics.jsonl``,
``rounds.jsonl``, ``calibration.json``, ``grid-job.json``); never imports torch.

Damaged input never stops a table or a figure: a run directory whose ``config.toml``,
``summary.json`` or ``grid-job.json`` cannot be read (not UTF-8, not valid TOML/JSON,
fields of the wrong type) is skipped, and a damaged line of ``metrics.jsonl`` /
``rounds.jsonl`` is skipped while the lines after it are kept; each skip is logged as one
``warning: skipped PATH ...`` line naming the file (and line). Numbers may be ``null``
(the writers store NaN and infinities as ``null``); readers treat them as missing.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from fedhv.results.pooling import PooledRunsError, label_configurations  # noqa: F401 - re-exported
from fedhv.results.received import (
    config_problem,
    job_problem,
    load_checked,
    object_problem,
    read_records,
    summary_problem,
)
from fedhv.results.rundir import FAILURE_FILE
from fedhv.results.runfiles import RunDirError, read_bytes_nofollow

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger("fedhv")

#: Table order: the paper's four, the loss-only methods, then the Gramian ones by exchange (others sorted after).
METHOD_ORDER: tuple[str, ...] = (
    "uniform", "fsmgda", "fedcmoo", "fedhv", "linear", "inverse-loss", "rlw", "dwa", "famo", "stch",
    *(f"fsmgda-{r}" for r in ("upgrad", "dualproj", "cagrad", "pcgrad", "imtl-g", "aligned-mtl")), "fedmgda-plus",
    *(f"fedcmoo-{r}" for r in ("upgrad", "dualproj", "cagrad", "pcgrad", "imtl-g", "aligned-mtl")), "fedcmoo-pref",
)
#: Labels by method name: the paper's four, and every other method's own (``Method.label``) once a run of it
#: that records one (``summary.json``'s ``label``) is loaded.
METHOD_LABELS: dict[str, str] = {"uniform": "Uniform", "fsmgda": "FSMGDA", "fedcmoo": "FedCMOO", "fedhv": "FedHV"}
SETTING_ORDER: tuple[str, ...] = (
    "multimnist", "mnist-fmnist", "celeba5-a", "celeba5-b", "cifar10-mnist-a", "cifar10-mnist-b",
)
SETTING_LABELS: dict[str, str] = {
    "multimnist": "MultiMNIST", "mnist-fmnist": "MNIST–FMNIST", "celeba5-a": "CelebA5-A", "celeba5-b": "CelebA5-B",
    "cifar10-mnist-a": "CIFAR10–MNIST-A", "cifar10-mnist-b": "CIFAR10–MNIST-B",
}


def setting_label(setting: str) -> str:
    return SETTING_LABELS.get(setting, setting)


def method_label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


#: How a run's evaluations become one value per metric (``fedhv table --statistic``):
#:
#: - ``"last10"``: the mean of the last ten scheduled evaluations (paper Table 11's rule; a run's
#:   WorstAcc moves 1-5 points between consecutive evaluations near the end of training, so one
#:   evaluation is a noisy read of where a run ended);
#: - ``"scheduled"``: the last scheduled evaluation (paper B.5, the rule of the paper's Tables 1, 8-10);
#: - ``"final"``: the extra evaluation after the last round (``eval.final``; ``summary.json``'s).
STATISTICS: tuple[str, ...] = ("last10", "scheduled", "final")
#: The statistic of the paper's final-result tables (1, 7-10, 12, 13): the paper's own rule.
PAPER_STATISTIC = "scheduled"
#: The statistic of the comparison tables (``ranks``, ``intervals``) unless ``--statistic`` says otherwise.
COMPARISON_STATISTIC = "last10"
#: The evaluated sets a table can read (``fedhv table --split``): ``metrics.jsonl``'s top level and ``"val"``.
SPLITS: tuple[str, ...] = ("test", "val")
#: The scalar metrics of an evaluation and its per-task lists.
SCALARS: tuple[str, ...] = ("mean_acc", "worst_acc", "mean_loss", "hv")
PER_TASK: tuple[str, ...] = ("task_acc", "task_loss", "task_score")


def _mean_entry(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The mean of each metric over ``entries`` (a metric missing or ``null`` in any entry is ``None``;
    per-task lists averaged element by element when every entry has one of the same length)."""
    out: dict[str, Any] = {}
    for key in SCALARS:
        values = [e.get(key) for e in entries]
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
        out[key] = statistics.fmean(values) if entries and ok else None
    for key in PER_TASK:
        lists = [e.get(key) for e in entries]
        if entries and all(isinstance(v, list) and len(v) == len(lists[0]) for v in lists) and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for v in lists for x in v):
            out[key] = [statistics.fmean(col) for col in zip(*lists)]
        else:
            out[key] = None
    return out


@dataclass
class Run:
    """One finished run directory."""

    path: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    variant: tuple[str, Any] | None = None
    ablation: str | None = None
    #: The statistic every table reads (:data:`STATISTICS`; ``fedhv table --statistic``), or ``None``:
    #: each table's own (:data:`PAPER_STATISTIC`, :data:`COMPARISON_STATISTIC`).
    statistic: str | None = None
    #: The evaluated set the tables read (:data:`SPLITS`; ``fedhv table --split``).
    split: str = "test"

    #: The configuration keys that set this run apart from other runs of its setting found
    #: together (``"train.lr_local=0.01"``), or ``None`` (:func:`label_configurations`).
    config_label: str | None = None

    @property
    def base_setting(self) -> str:
        return str(self.summary.get("setting") or self.config.get("setting"))

    @property
    def setting(self) -> str:
        """The setting, with the configuration keys that set it apart when runs of one setting differ."""
        return self.base_setting if self.config_label is None else f"{self.base_setting} [{self.config_label}]"

    @property
    def method(self) -> str:
        return str(self.summary.get("method") or self.config.get("method"))

    @property
    def seed(self) -> int:
        return int(self.summary.get("seed", self.config.get("seed", 0)))

    @cached_property
    def metrics(self) -> list[dict[str, Any]]:
        return read_records(self.path / "metrics.jsonl")

    @cached_property
    def rounds(self) -> list[dict[str, Any]]:
        return read_records(self.path / "rounds.jsonl")

    @cached_property
    def calibration(self) -> dict[str, Any] | None:
        p = self.path / "calibration.json"
        if not p.exists():
            return None
        return load_checked(p, json.loads, object_problem, left_out="")

    def config_value(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def _of_split(self, entry: dict[str, Any]) -> dict[str, Any]:
        """``entry``'s metrics of :attr:`split` (``{}`` when the run did not evaluate that set then)."""
        if self.split == "test":
            return entry
        nested = entry.get(self.split)
        return {**nested, "round": entry.get("round")} if isinstance(nested, dict) else {}

    def last_scheduled(self, n: int = 10, until: int | None = None) -> list[dict[str, Any]]:
        """The last ``n`` *scheduled* test evaluations (round a multiple of ``eval.test_period``).

        The extra evaluation after the last round, when that round is off schedule, is
        left out (paper Table 11 averages "the final ten scheduled test evaluations").
        ``until``: only evaluations at rounds ``<= until`` (the first ``until`` rounds of a
        longer run, e.g. against a shorter run of the same setting).
        """
        period = int(self.config_value("eval.test_period", 0) or 0)
        metrics = [e for e in self.metrics if until is None or e["round"] <= until]
        scheduled = [e for e in metrics if period and e["round"] % period == 0]
        return (scheduled or metrics)[-n:]

    @property
    def total_rounds(self) -> int:
        """The run's number of adaptive rounds ``T`` (``summary.json``, else ``config.toml``)."""
        value = self.summary.get("rounds", self.config.get("rounds"))
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    @property
    def scheduled_round(self) -> int | None:
        """The round of the last scheduled test evaluation, ``floor(T / P) P`` for test period ``P``.

        None when the run has no scheduled evaluation (``P = 0`` or ``P > T``).
        """
        period = self.config_value("eval.test_period", 0)
        period = period if isinstance(period, int) and not isinstance(period, bool) else 0
        rounds = self.total_rounds
        return (rounds // period) * period if 0 < period <= rounds else None

    @cached_property
    def _scheduled_record(self) -> dict[str, Any] | None:
        """The ``metrics.jsonl`` record of :attr:`scheduled_round` (None, with a warning, if missing)."""
        target = self.scheduled_round
        found = [e for e in self.metrics if e["round"] == target]
        if target is not None and not found:
            log.warning(f"{self.path / 'metrics.jsonl'} has no test evaluation at round {target}, the run's last "
                        "scheduled one: its final-result table values are left out (fedhv table --statistic final "
                        "reports summary.json's final evaluation instead)")
        return found[-1] if found else None

    @property
    def reported(self) -> dict[str, Any]:
        """The evaluation that the paper's final-result tables (1, 8, 9, 10) report:
        :meth:`evaluation` of :attr:`statistic`, by default :data:`PAPER_STATISTIC`."""
        return self.evaluation(self.statistic or PAPER_STATISTIC)

    def compared(self, key: str) -> float | None:
        """The number ``key`` as the comparison tables and figures read it: :meth:`evaluation` of
        :attr:`statistic`, by default :data:`COMPARISON_STATISTIC` (``None`` when missing or not a number)."""
        value = self.evaluation(self.statistic or COMPARISON_STATISTIC).get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def evaluation(self, statistic: str) -> dict[str, Any]:
        """The run's values of :attr:`split` under ``statistic`` (:data:`STATISTICS`).

        ``"scheduled"``: paper B.5, "Final tables use the final scheduled test evaluation" -- the
        last evaluation at a multiple of ``eval.test_period`` (:attr:`scheduled_round`: round 198 of
        200, 498 of 500 with test period 3), read from ``metrics.jsonl``. ``"final"``: the
        evaluation after the last round (``eval.final``; ``summary.json``'s for the test set),
        also taken when the run has no scheduled evaluation. ``"last10"``: the mean of each metric
        over the last ten scheduled evaluations (:meth:`last_scheduled`; Table 11's rule), with
        ``rounds`` = the first and last round averaged. A run whose ``metrics.jsonl`` lacks the
        records reports nothing (``{}``; one warning names the file).

        Returns
        -------
        dict
            ``mean_acc``, ``worst_acc``, ``mean_loss``, ``hv``, ``task_acc``, ``task_loss``
            (each possibly ``None``) and ``round``.
        """
        if statistic not in STATISTICS:
            raise ValueError(f"statistic {statistic!r}: use one of {', '.join(STATISTICS)}")
        if statistic == "last10" and self.scheduled_round is not None:
            entries = [self._of_split(e) for e in self.last_scheduled(10)]
            entries = [e for e in entries if e]
            if not entries:
                return {}
            return {**_mean_entry(entries), "round": entries[-1]["round"],
                    "rounds": [entries[0]["round"], entries[-1]["round"]], "evaluations": len(entries)}
        if statistic == "final" or self.scheduled_round is None:
            final = self.summary.get("final_eval_round")
            at = final if isinstance(final, int) else self.total_rounds
            if self.split == "test":
                return {**self.summary, "round": at}
            found = [self._of_split(e) for e in self.metrics if e.get("round") == at]
            return found[-1] if found else {}
        return self._of_split(self._scheduled_record) if self._scheduled_record else {}


def evaluation_note(runs: Sequence[Run], default: str = PAPER_STATISTIC) -> str:
    """The table note saying which evaluations the values are (statistic, set and rounds); ``default`` is the
    table's own statistic, used where :attr:`Run.statistic` is unset."""
    def stat(r: Run) -> str:
        return r.statistic or default

    def rounds(selected: Iterable[Run]) -> str:
        pairs = {(r.scheduled_round if stat(r) == "scheduled" and r.scheduled_round is not None
                  else r.evaluation(stat(r)).get("round"), r.total_rounds) for r in selected}
        return ", ".join(f"round {a} of {b}" for a, b in sorted(pairs, key=str))

    def spans(selected: Iterable[Run]) -> str:
        pairs = {(tuple(r.evaluation("last10").get("rounds") or ()), r.total_rounds) for r in selected}
        return ", ".join(f"rounds {a[0]}–{a[-1]} of {b}" if a else f"none of {b}" for a, b in sorted(pairs, key=str))

    where = {"test": "test", "val": "validation"}
    parts = []
    for split in sorted({r.split for r in runs}, key=SPLITS.index):
        of = [r for r in runs if r.split == split]
        name = where[split]
        last10 = [r for r in of if stat(r) == "last10" and r.scheduled_round is not None]
        scheduled = [r for r in of if stat(r) == "scheduled" and r.scheduled_round is not None]
        unscheduled = [r for r in of if stat(r) != "final" and r.scheduled_round is None]
        final = [r for r in of if stat(r) == "final"]
        if last10:
            parts.append(f"Values are each run's mean over its last ten scheduled {name} evaluations ({spans(last10)}; "
                         "paper Table 11's rule); fedhv table --statistic scheduled reads the last one only.")
        if scheduled:
            parts.append(f"Values are each run's last scheduled {name} evaluation ({rounds(scheduled)}), as in paper "
                         "B.5; the extra evaluation after the last round is in metrics.jsonl (fedhv table --statistic "
                         "final), the mean of the last ten: --statistic last10.")
        if unscheduled:
            parts.append(f"Runs without a scheduled {name} evaluation report their final one ({rounds(unscheduled)}).")
        if final:
            parts.append(f"Values are each run's final {name} evaluation after the last round ({rounds(final)}; "
                         "--statistic final), not the last scheduled one that paper B.5 reports.")
    return " ".join(parts)


def _frozen(value: Any) -> Any:
    """A JSON value with its lists as tuples (a front run's variant ``[u, delta]`` keys groups)."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


#: The ``ablation`` of a front sweep's runs (``fedhv grid --front``), tabulated by :mod:`fedhv.results.tables_front`
#: only: :func:`group` leaves them out.
FRONT_ABLATION = "front"


def _load_run(folder: Path, config_path: Path, summary_path: Path) -> Run | None:
    """The run in ``folder``, or None (with a warning naming the file) when a file is damaged."""
    config = load_checked(config_path, tomllib.loads, config_problem)
    if config is None:
        return None
    summary = load_checked(summary_path, json.loads, summary_problem)
    if summary is None:
        return None
    variant, ablation = None, None
    job_path = folder / "grid-job.json"
    if job_path.exists():
        job = load_checked(job_path, json.loads, job_problem)
        if job is None:
            return None
        ablation = job.get("ablation")
        if job.get("variant"):
            variant = (str(job["variant"][0]), _frozen(job["variant"][1]))
    run = Run(folder, config, summary, variant, ablation)
    if isinstance(summary.get("label"), str):
        METHOD_LABELS.setdefault(run.method, summary["label"])
    return run


def failure_of(folder: Path) -> dict[str, Any] | None:
    """An unfinished run's failure record (``failure.json``: ``error``, ``message``, ``rounds_done``),
    or ``None`` when it has none (interrupted, or still running) or it cannot be read."""
    try:
        data = json.loads(read_bytes_nofollow(folder / FAILURE_FILE))
    except (OSError, ValueError, RunDirError):
        return None
    return data if isinstance(data, dict) else None


def find_runs(root: Path | str, statistic: str | None = None, split: str = "test") -> tuple[list[Run], list[Path]]:
    """Finished runs under ``root`` (recursively) and unfinished run directories.

    A run directory is a folder with a ``config.toml``; it is finished when it has a
    ``summary.json``. Runs with a damaged file are left out with a warning (see the
    module docstring); the others are returned. ``statistic`` and ``split`` set every run's
    :attr:`Run.statistic` and :attr:`Run.split` (what the tables read).
    """
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such directory")
    runs: list[Run] = []
    unfinished: list[Path] = []
    for config_path in sorted(root.rglob("config.toml")):
        folder = config_path.parent
        if folder.name == "calibration":
            continue
        summary_path = folder / "summary.json"
        if not summary_path.exists():
            unfinished.append(folder)
            continue
        run = _load_run(folder, config_path, summary_path)
        if run is not None:
            run.statistic, run.split = statistic, split
            runs.append(run)
    label_configurations(runs)
    return runs, unfinished


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation over seeds (``std`` is None for one seed)."""

    mean: float
    std: float | None
    n: int
    values: tuple[float, ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat | None:
        vals = tuple(float(v) for v in values if v is not None and math.isfinite(float(v)))
        if not vals:
            return None
        std = statistics.stdev(vals) if len(vals) > 1 else None
        return cls(statistics.fmean(vals), std, len(vals), vals)


def group(runs: Sequence[Run], with_variants: bool = False) -> dict[tuple[str, Any, str], list[Run]]:
    """Runs by ``(setting, variant, method)``, seeds sorted; ablation runs only if asked, front runs never."""
    out: dict[tuple[str, Any, str], list[Run]] = {}
    for run in runs:
        if (run.variant is not None) != with_variants or run.ablation == FRONT_ABLATION:
            continue
        out.setdefault((run.setting, run.variant, run.method), []).append(run)
    for members in out.values():
        members.sort(key=lambda r: r.seed)
    return out


def variant_order(variant: tuple[str, Any]) -> tuple[bool, float, str]:
    """Sort key of an ablation variant ``(parameter, value)`` within its sweep: numbers by value
    (K = 1, 5, 10, 20, not "1", "10", "20", "5"), then other values by their text."""
    value = variant[1]
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (not numeric, float(value) if numeric else 0.0, str(value))


def ordered_settings(settings: Iterable[str]) -> list[str]:
    known = [s for s in SETTING_ORDER if s in set(settings)]
    return known + sorted(set(settings) - set(known))


def ordered_methods(methods: Iterable[str]) -> list[str]:
    known = [m for m in METHOD_ORDER if m in set(methods)]
    return known + sorted(set(methods) - set(known))
