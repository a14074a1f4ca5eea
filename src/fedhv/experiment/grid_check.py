"""A grid's existing runs against what it asks for now (:func:`check_existing_runs`).

An existing run counts as a job's (skipped when finished, resumed when partial) only when its
``config.toml`` is the job's resolved configuration, keys that say where and how a run
executes (:data:`IGNORED_KEYS`) aside; otherwise the grid refuses to start, naming the keys.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from fedhv.config import load_config, to_dict
from fedhv.config.loader import config_from_toml_text
from fedhv.errors import FedHVError
from fedhv.results.rundir import read_bytes_nofollow


class Job(Protocol):
    """What the checks read of a grid's job (:class:`fedhv.experiment.grid.Job`)."""

    @property
    def source(self) -> str:
        """The setting's preset name or TOML file."""
        ...

    @property
    def run_dir(self) -> str:
        """The job's run directory."""
        ...

    @property
    def overrides(self) -> tuple[str, ...]:
        """The job's ``--set`` overrides."""
        ...

    @property
    def calibration(self) -> str | None:
        """The shared calibration file, if the method uses one."""
        ...


class GridError(FedHVError):
    """A grid that cannot run as asked (e.g. its folder holds runs of another configuration)."""


def job_state(job: Job) -> str:
    """``done``, ``partial`` (resume) or ``new``."""
    path = Path(job.run_dir)
    if (path / "summary.json").exists():
        return "done"
    if (path / "config.toml").exists():
        return "partial"
    return "new"

#: Config keys (or key prefixes ending in ".") ignored when an existing run is compared
#: with the grid's job: they say where and how a run executes, not what it computes (the
#: same algorithm, data and random streams; results differ at most by floating-point
#: round-off). Where the data is read from and whether it may be downloaded (the files are
#: checksum-verified, so it is the same data wherever it lives), the device (a run may be
#: resumed on another one), torch threads (the grid's ``--threads`` is not recorded
#: either), the batched engine's memory cap and checkpoint placement (resume is exact
#: whatever the period).
IGNORED_KEYS: tuple[str, ...] = ("data.root", "data.download", "device", "threads", "engine_chunk", "checkpoint.")


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dict -> ``{"a.b": value}``."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def _ignored(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in IGNORED_KEYS)


def config_differences(job: Job) -> dict[str, tuple[Any, Any]]:
    """Keys whose value in the run directory's ``config.toml`` differs from the job's.

    Both sides are resolved configurations (``to_dict``); keys in :data:`IGNORED_KEYS` are
    left out. Returns ``{key: (value in the run, value in the job)}``, ``None`` for unset;
    an unreadable ``config.toml`` is reported under the key ``"config.toml"``.
    """
    job_cfg = load_config(job.source, job.overrides)
    try:
        run_cfg = config_from_toml_text(read_bytes_nofollow(Path(job.run_dir) / "config.toml").decode())
    except (OSError, FedHVError) as exc:
        return {"config.toml": (f"unreadable ({exc})", "a valid run configuration")}
    # A method section one side leaves out holds its defaults (a run written before config.toml kept
    # only the sections it names recorded every built-in method's): compare both with all of them.
    for name in {*job_cfg.sections, *run_cfg.sections}:
        job_cfg, run_cfg = (c.with_section(name, c.section(name)) for c in (job_cfg, run_cfg))
    wanted, found = _flatten(to_dict(job_cfg)), _flatten(to_dict(run_cfg))
    keys = sorted((set(wanted) | set(found)) - {k for k in set(wanted) | set(found) if _ignored(k)})
    return {k: (found.get(k), wanted.get(k)) for k in keys if found.get(k) != wanted.get(k)}


def _show(value: Any) -> str:
    return "unset" if value is None else json.dumps(value)


def check_existing_runs(jobs: Sequence[Job], out: Path) -> None:
    """Refuse a grid whose folder holds finished or partial runs of another configuration.

    A run directory counts as the job's (skipped when finished, resumed when partial)
    only if its ``config.toml`` matches the job's resolved configuration (see
    :func:`config_differences`). Called before anything runs or is written.

    Raises
    ------
    GridError
        Naming the runs, the differing keys with both values, and the fixes.
    """
    paths = {p for job in jobs for p in (job.run_dir, job.calibration) if p is not None}
    for path in sorted(paths):  # a grid received from others: its folders and calibrations must not lead elsewhere
        folder = Path(path)
        while folder != out and folder != folder.parent:
            if folder.is_symlink():
                raise GridError(f"{folder} is a symbolic link (to {os.readlink(folder)}); fedhv never follows links "
                                "in a grid: remove it, or choose another --out")
            folder = folder.parent
    stale: dict[str, dict[str, tuple[Any, Any]]] = {}
    for job in jobs:
        if job_state(job) != "new":
            diff = config_differences(job)
            if diff:
                stale[job.run_dir] = diff
    if not stale:
        return
    keys: dict[str, tuple[Any, Any]] = {}
    for diff in stale.values():
        for key, values in diff.items():
            keys.setdefault(key, values)
    shown = ", ".join(list(stale)[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
    what = "; ".join(f"{k} = {_show(there)} in the run, {_show(here)} in this grid"
                     for k, (there, here) in keys.items())
    raise GridError(
        f"--out {out}: {len(stale)} existing run(s) were made with another configuration ({shown}: {what}); "
        "rerun the grid with the arguments they were made with, choose another --out, or delete those runs"
    )
