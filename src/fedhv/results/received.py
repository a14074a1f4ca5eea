"""Received run files read defensively: what the tables and figures accept from a run directory.

Damaged input never stops a table or a figure (:mod:`fedhv.results.collect`): a run directory whose
``config.toml``, ``summary.json`` or ``grid-job.json`` cannot be read (not UTF-8, not valid TOML/JSON,
fields of the wrong type) is skipped, and a damaged line of ``metrics.jsonl`` / ``rounds.jsonl`` (or a
malformed ``diagnostics`` value in it) is skipped while the rest is kept; each skip is one
``warning: skipped PATH ...`` line naming the file (and line). Files are read only as bounded regular
files (:mod:`fedhv.safe_io`). Never imports torch.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedhv import safe_io

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger("fedhv")


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


def is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def field_problem(record: dict[str, Any]) -> str | None:
    """Why ``record`` cannot be read (a field of the wrong type), or None."""
    for key in NUMBER_FIELDS:
        if key in record and not is_number(record[key]):
            return f"{key!r} is not a number"
    for key in LIST_FIELDS:
        if key in record and not (record[key] is None or (isinstance(record[key], list)
                                                         and all(is_number(v) for v in record[key]))):
            return f"{key!r} is not a list of numbers"
    for key in TABLE_FIELDS:
        if key in record and record[key] is not None:
            if not isinstance(record[key], dict):
                return f"{key!r} is not a JSON object"
            problem = field_problem(record[key])
            if problem is not None:
                return f"{key}.{problem}"
    return None


def summary_problem(summary: Any) -> str | None:
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
    return field_problem(summary)


def config_problem(config: dict[str, Any]) -> str | None:
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


def record_problem(record: Any) -> str | None:
    """Why a parsed JSON-lines record cannot be used, or None."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if not (isinstance(record.get("round"), int) and not isinstance(record.get("round"), bool)):
        return "no integer 'round'"
    return field_problem(record)


def read_text(path: Path) -> str:
    """UTF-8 text of the regular file ``path`` (``UnicodeDecodeError`` / ``OSError`` propagate; a link,
    a FIFO, a device or a file over :data:`fedhv.safe_io.MAX_FILE_BYTES` is an ``OSError`` naming it)."""
    return safe_io.read_regular(path).decode("utf-8")


def numeric_tree(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is a number / null, or a list / object of such values (nested at most 4 deep)."""
    if is_number(value):
        return True
    if depth >= 4:
        return False
    if isinstance(value, list):
        return all(numeric_tree(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(numeric_tree(v, depth + 1) for v in value.values())
    return False


def diagnostics_problem(diag: Any) -> str | None:
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
            if not (isinstance(value, dict) and numeric_tree(value)):
                return "'clients' is not an object of numbers"
            score = value.get("score")
            if score is not None and not (isinstance(score, list) and all(isinstance(v, dict) for v in score)):
                return "'clients.score' is not a list of objects"
        elif key in DIAGNOSTICS_SCALARS:
            if not is_number(value):
                return f"{key!r} is not a number"
        elif not numeric_tree(value):
            return f"{key!r} is not a number or a list of numbers"
    return None


def clean_diagnostics(record: dict[str, Any], path: Path, number: int) -> None:
    """Drop a malformed ``diagnostics`` value from ``record`` (one warning; the rest of the line is kept)."""
    if "diagnostics" not in record or record["diagnostics"] is None:
        return
    problem = diagnostics_problem(record["diagnostics"])
    if problem is not None:
        log.warning(f"skipped the diagnostics of {path} line {number}: diagnostics {problem}")
        del record["diagnostics"]


def reason(exc: BaseException) -> str:
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
        log.warning(f"skipped {path}: {reason(exc)}")
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
            problem = record_problem(record)
        if problem is not None:
            log.warning(f"skipped {path} line {number}: {problem}")
            continue
        clean_diagnostics(record, path, number)
        records.append(record)
    return records


def parse(path: Path, loads: Callable[[str], Any]) -> tuple[Any, str | None]:
    """``loads`` of the UTF-8 text of ``path``, or None and why it failed."""
    try:
        return loads(read_text(path)), None
    except (OSError, ValueError, RecursionError) as exc:  # JSON / TOML / Unicode errors are ValueErrors
        return None, reason(exc)


def load_checked(path: Path, loads: Callable[[str], Any], problem_of: Callable[[Any], str | None],
                  left_out: str = " (run left out)") -> dict[str, Any] | None:
    """The parsed object of ``path``, or None after one ``warning: skipped PATH: reason`` line.

    ``loads`` parses the UTF-8 text; ``problem_of`` says why the parsed value cannot be used,
    or None (it refuses anything but a dict); ``left_out`` ends the warning.
    """
    value, problem = parse(path, loads)
    if problem is None:
        problem = problem_of(value)
    if problem is not None:
        log.warning(f"skipped {path}: {problem}{left_out}")
        return None
    return value if isinstance(value, dict) else None


def object_problem(value: Any) -> str | None:
    """Why a parsed JSON file is not an object, or None."""
    return None if isinstance(value, dict) else "not a JSON object"


def _front_aim(variant: list[Any]) -> bool:
    """Whether ``variant`` is a front run's ``["front", [u, delta]]``: ``u`` finite positive numbers,
    ``delta`` a finite positive number or null."""
    if variant[0] != "front" or not isinstance(variant[1], list) or len(variant[1]) != 2:
        return False
    u, delta = variant[1]
    number = (int, float)
    return (isinstance(u, list) and len(u) >= 2
            and all(isinstance(v, number) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in u)
            and (delta is None or (isinstance(delta, number) and not isinstance(delta, bool)
                                   and math.isfinite(delta) and delta > 0)))


def job_problem(job: Any) -> str | None:
    """Why a parsed ``grid-job.json`` cannot be used, or None."""
    if not isinstance(job, dict):
        return "not a JSON object"
    variant = job.get("variant")
    if not (variant is None or variant == [] or (isinstance(variant, list) and len(variant) == 2
                                                  and (isinstance(variant[1], (str, int, float))
                                                       or _front_aim(variant)))):
        return "'variant' is not [key, value], a front run's [\"front\", [u, delta]] or null"
    if isinstance(variant, list) and variant and variant[0] == "front" and not _front_aim(variant):
        return "'variant' is [\"front\", …] but not a front run's [\"front\", [u, delta]]"
    if job.get("ablation") is not None and not isinstance(job["ablation"], str):
        return "'ablation' is not a string"
    return None
