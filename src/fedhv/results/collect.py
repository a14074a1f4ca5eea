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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from fedhv import safe_io
from fedhv.results.pooling import PooledRunsError, label_configurations  # noqa: F401 - re-exported

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger("fedhv")

METHOD_ORDER: tuple[str, ...] = ("uniform", "fsmgda", "fedcmoo", "fedhv")
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


@dataclass
class Run:
    """One finished run directory."""

    path: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    variant: tuple[str, Any] | None = None
    ablation: str | None = None
    #: Report the extra evaluation after the last round instead of the last scheduled one
    #: (:attr:`reported`; ``fedhv table --final-eval``).
    final_eval: bool = False

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
        return _load_checked(p, json.loads, _object_problem, left_out="")

    def config_value(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

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
                        "scheduled one: its final-result table values are left out (fedhv table --final-eval "
                        "reports summary.json's final evaluation instead)")
        return found[-1] if found else None

    @property
    def reported(self) -> dict[str, Any]:
        """The test evaluation that the final-result tables (1, 8, 9, 10) report.

        Paper B.5: "Final tables use the final scheduled test evaluation" -- the last
        evaluation at a multiple of ``eval.test_period`` (:attr:`scheduled_round`: round
        198 of 200, 498 of 500 with test period 3), read from ``metrics.jsonl``. fedhv also
        evaluates after the last round (``eval.final``); that evaluation is ``summary.json``'s
        and is reported instead when :attr:`final_eval` is set, or when the run has no
        scheduled evaluation. A run whose ``metrics.jsonl`` lacks the scheduled record
        reports nothing (``{}``; one warning names the file).

        Returns
        -------
        dict
            ``mean_acc``, ``worst_acc``, ``mean_loss``, ``hv``, ``task_acc``, ``task_loss``
            (each possibly ``None``) and ``round``.
        """
        if self.final_eval or self.scheduled_round is None:
            final = self.summary.get("final_eval_round")
            return {**self.summary, "round": final if isinstance(final, int) else self.total_rounds}
        return self._scheduled_record or {}


def evaluation_note(runs: Sequence[Run]) -> str:
    """The table note saying which evaluation :attr:`Run.reported` took, with its rounds."""
    def rounds(selected: Iterable[Run]) -> str:
        pairs = {(r.scheduled_round if not r.final_eval and r.scheduled_round is not None
                  else r.reported.get("round"), r.total_rounds) for r in selected}
        return ", ".join(f"round {a} of {b}" for a, b in sorted(pairs, key=str))

    final = [r for r in runs if r.final_eval]
    scheduled = [r for r in runs if not r.final_eval and r.scheduled_round is not None]
    unscheduled = [r for r in runs if not r.final_eval and r.scheduled_round is None]
    parts = []
    if scheduled:
        parts.append(f"Values are each run's last scheduled test evaluation ({rounds(scheduled)}), as in paper B.5; "
                     "the extra evaluation after the last round is in summary.json and metrics.jsonl "
                     "(fedhv table --final-eval).")
    if unscheduled:
        parts.append(f"Runs without a scheduled test evaluation report their final one ({rounds(unscheduled)}).")
    if final:
        parts.append(f"Values are each run's final test evaluation after the last round ({rounds(final)}; "
                     "--final-eval), not the last scheduled one that paper B.5 reports.")
    return " ".join(parts)


#: Record and summary fields the tables and figures read, by kind (each may be ``null``).
NUMBER_FIELDS: tuple[str, ...] = (
    "mean_acc", "worst_acc", "mean_loss", "hv", "wall_clock_s", "min_report_slack", "floor_activations",
    "floor_checks", "bytes_down_per_client_round", "bytes_up_per_client_round", "seconds", "bytes_down", "bytes_up",
)
LIST_FIELDS: tuple[str, ...] = ("task_acc", "task_loss", "weights", "reference")
TABLE_FIELDS: tuple[str, ...] = ("calibration", "end_to_end")


#: ``diagnostics`` values the tables and figures read as one number (each may be ``null``).
DIAGNOSTICS_SCALARS: tuple[str, ...] = (
    "grad_phi_sq", "grad_phi_sq_avg", "pareto_residual", "min_slack", "slack_bound_run", "phi_max", "report_error",
    "stale_weight_error", "probe_samples", "seconds",
)


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _field_problem(record: dict[str, Any]) -> str | None:
    """Why ``record`` cannot be read (a field of the wrong type), or None."""
    for key in NUMBER_FIELDS:
        if key in record and not _is_number(record[key]):
            return f"{key!r} is not a number"
    for key in LIST_FIELDS:
        if key in record and not (record[key] is None or (isinstance(record[key], list)
                                                         and all(_is_number(v) for v in record[key]))):
            return f"{key!r} is not a list of numbers"
    for key in TABLE_FIELDS:
        if key in record and record[key] is not None:
            if not isinstance(record[key], dict):
                return f"{key!r} is not a JSON object"
            problem = _field_problem(record[key])
            if problem is not None:
                return f"{key}.{problem}"
    return None


def _summary_problem(summary: Any) -> str | None:
    """Why a parsed ``summary.json`` cannot be used, or None."""
    if not isinstance(summary, dict):
        return "not a JSON object"
    for key in ("setting", "method"):
        if key in summary and not isinstance(summary[key], str):
            return f"{key!r} is not a string"
    if "seed" in summary and not (isinstance(summary["seed"], int) and not isinstance(summary["seed"], bool)):
        return "'seed' is not an integer"
    tasks = summary.get("tasks")
    if tasks is not None and not (isinstance(tasks, list) and all(isinstance(t, str) for t in tasks)):
        return "'tasks' is not a list of names"
    return _field_problem(summary)


def _config_problem(config: dict[str, Any]) -> str | None:
    """Why a parsed ``config.toml`` cannot be used (a read key of the wrong type), or None."""
    for key in ("setting", "method"):
        if key in config and not isinstance(config[key], str):
            return f"{key!r} is not a string"
    if "seed" in config and not (isinstance(config["seed"], int) and not isinstance(config["seed"], bool)):
        return "'seed' is not an integer"
    for table, key in (("eval", "test_period"), ("train", "clients_per_round")):
        section = config.get(table, {})
        if not isinstance(section, dict):
            return f"[{table}] is not a table"
        value = section.get(key, 0)
        if not (isinstance(value, int) and not isinstance(value, bool)):
            return f"{table}.{key} is not an integer"
    return None


def _record_problem(record: Any) -> str | None:
    """Why a parsed JSON-lines record cannot be used, or None."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if not (isinstance(record.get("round"), int) and not isinstance(record.get("round"), bool)):
        return "no integer 'round'"
    return _field_problem(record)


def _read_text(path: Path) -> str:
    """UTF-8 text of the regular file ``path`` (``UnicodeDecodeError`` / ``OSError`` propagate; a link,
    a FIFO, a device or a file over :data:`fedhv.safe_io.MAX_FILE_BYTES` is an ``OSError`` naming it)."""
    return safe_io.read_regular(path).decode("utf-8")


def _numeric_tree(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is a number / null, or a list / object of such values (nested at most 4 deep)."""
    if _is_number(value):
        return True
    if depth >= 4:
        return False
    if isinstance(value, list):
        return all(_numeric_tree(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(_numeric_tree(v, depth + 1) for v in value.values())
    return False


def _diagnostics_problem(diag: Any) -> str | None:
    """Why a record's ``diagnostics`` value cannot be read (the first bad key), or None.

    Every value must be a number or ``null`` (``at_round``: an integer), or a list / object
    of them; ``clients.score`` a list of objects (one per task).
    """
    if not isinstance(diag, dict):
        return "is not a JSON object"
    for key, value in diag.items():
        if key == "at_round":
            if not (value is None or (isinstance(value, int) and not isinstance(value, bool))):
                return "'at_round' is not an integer"
        elif key == "clients":
            if not (isinstance(value, dict) and _numeric_tree(value)):
                return "'clients' is not an object of numbers"
            score = value.get("score")
            if score is not None and not (isinstance(score, list) and all(isinstance(v, dict) for v in score)):
                return "'clients.score' is not a list of objects"
        elif key in DIAGNOSTICS_SCALARS:
            if not _is_number(value):
                return f"{key!r} is not a number"
        elif not _numeric_tree(value):
            return f"{key!r} is not a number or a list of numbers"
    return None


def _clean_diagnostics(record: dict[str, Any], path: Path, number: int) -> None:
    """Drop a malformed ``diagnostics`` value from ``record`` (one warning; the rest of the line is kept)."""
    if "diagnostics" not in record or record["diagnostics"] is None:
        return
    problem = _diagnostics_problem(record["diagnostics"])
    if problem is not None:
        log.warning(f"skipped the diagnostics of {path} line {number}: diagnostics {problem}")
        del record["diagnostics"]


def _reason(exc: BaseException) -> str:
    """A short description of why a file could not be read."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
    if isinstance(exc, tomllib.TOMLDecodeError):
        return f"not valid TOML ({exc})"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc})"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, OSError):
        return f"cannot be read ({exc.strerror or exc})"
    return str(exc)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every valid record of a JSON-lines file.

    A damaged line (not UTF-8, not valid JSON, not an object with an integer ``round``,
    or a read field of the wrong type) is skipped with one warning naming the file and the
    1-based line number; the lines after it are kept. A missing file has no records.
    """
    if not path.exists() and not path.is_symlink():
        return []
    try:
        raw = safe_io.read_regular(path)
    except OSError as exc:
        log.warning(f"skipped {path}: {_reason(exc)}")
        return []
    records: list[dict[str, Any]] = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            problem: str | None = "not UTF-8 text"
        except (ValueError, RecursionError):
            problem = "not valid JSON"
        else:
            problem = _record_problem(record)
        if problem is not None:
            log.warning(f"skipped {path} line {number}: {problem}")
            continue
        _clean_diagnostics(record, path, number)
        records.append(record)
    return records


def _parse(path: Path, loads: Callable[[str], Any]) -> tuple[Any, str | None]:
    """``loads`` of the UTF-8 text of ``path``, or None and why it failed."""
    try:
        return loads(_read_text(path)), None
    except (OSError, ValueError, RecursionError) as exc:  # JSON / TOML / Unicode errors are ValueErrors
        return None, _reason(exc)


def _load_checked(path: Path, loads: Callable[[str], Any], problem_of: Callable[[Any], str | None],
                  left_out: str = " (run left out)") -> dict[str, Any] | None:
    """The parsed object of ``path``, or None after one ``warning: skipped PATH: reason`` line.

    ``loads`` parses the UTF-8 text; ``problem_of`` says why the parsed value cannot be used,
    or None (it refuses anything but a dict); ``left_out`` ends the warning.
    """
    value, problem = _parse(path, loads)
    if problem is None:
        problem = problem_of(value)
    if problem is not None:
        log.warning(f"skipped {path}: {problem}{left_out}")
        return None
    return value if isinstance(value, dict) else None


def _object_problem(value: Any) -> str | None:
    """Why a parsed JSON file is not an object, or None."""
    return None if isinstance(value, dict) else "not a JSON object"


def _job_problem(job: Any) -> str | None:
    """Why a parsed ``grid-job.json`` cannot be used, or None."""
    if not isinstance(job, dict):
        return "not a JSON object"
    variant = job.get("variant")
    if not (variant is None or variant == [] or (isinstance(variant, list) and len(variant) == 2
                                                  and isinstance(variant[1], (str, int, float)))):
        return "'variant' is not [key, value] or null"
    if job.get("ablation") is not None and not isinstance(job["ablation"], str):
        return "'ablation' is not a string"
    return None


def _load_run(folder: Path, config_path: Path, summary_path: Path) -> Run | None:
    """The run in ``folder``, or None (with a warning naming the file) when a file is damaged."""
    config = _load_checked(config_path, tomllib.loads, _config_problem)
    if config is None:
        return None
    summary = _load_checked(summary_path, json.loads, _summary_problem)
    if summary is None:
        return None
    variant, ablation = None, None
    job_path = folder / "grid-job.json"
    if job_path.exists():
        job = _load_checked(job_path, json.loads, _job_problem)
        if job is None:
            return None
        ablation = job.get("ablation")
        if job.get("variant"):
            variant = (str(job["variant"][0]), job["variant"][1])
    return Run(folder, config, summary, variant, ablation)


def find_runs(root: Path | str, final_eval: bool = False) -> tuple[list[Run], list[Path]]:
    """Finished runs under ``root`` (recursively) and unfinished run directories.

    A run directory is a folder with a ``config.toml``; it is finished when it has a
    ``summary.json``. Runs with a damaged file are left out with a warning (see the
    module docstring); the others are returned. ``final_eval`` sets :attr:`Run.final_eval`
    (the final-result tables then report the evaluation after the last round).
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
            run.final_eval = final_eval
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
    """Runs by ``(setting, variant, method)``, seeds sorted; ablation runs only if asked."""
    out: dict[tuple[str, Any, str], list[Run]] = {}
    for run in runs:
        if (run.variant is not None) != with_variants:
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
