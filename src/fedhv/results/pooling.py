"""Runs found together that are not the same experiment: split by configuration, no seed twice.

``fedhv table`` reads every run under a folder. Two grids with the same settings but another
configuration (``--set train.lr_local=0.01``) would otherwise average into one cell, seed 0
counted twice. :func:`label_configurations` labels such runs with the keys that set them apart.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from fedhv.errors import FedHVError


class Run(Protocol):
    """What pooling reads (and labels) of a run (:class:`fedhv.results.collect.Run`)."""

    path: Path
    config: dict[str, Any]
    variant: tuple[str, Any] | None
    config_label: str | None

    @property
    def base_setting(self) -> str:
        """The run's setting as configured."""
        ...

    @property
    def setting(self) -> str:
        """The setting, with :attr:`config_label` when set."""
        ...

    @property
    def method(self) -> str:
        """The run's method."""
        ...

    @property
    def seed(self) -> int:
        """The run's training seed."""
        ...


class PooledRunsError(FedHVError):
    """Two runs of one table cell (setting, configuration, method) with the same seed."""


#: Keys that may differ between the runs of one cell without making them different experiments.
POOL_IGNORED = ("seed", "device", "threads", "engine_chunk", "data.root", "data.download", "source")


def _flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def _comparable(run: Run) -> dict[str, str]:
    return {k: json.dumps(v, sort_keys=True) for k, v in _flat(run.config).items() if k not in POOL_IGNORED}


def label_configurations(runs: Sequence[Run]) -> None:
    """Split runs of one setting whose configurations differ, and refuse a seed twice in one cell.

    Within each cell (setting, ablation variant, method) the configurations, seeds and machine
    keys (:data:`POOL_IGNORED`) aside, must agree; the keys in which any cell's runs differ
    label every run of that setting (:attr:`Run.config_label`), so the tables show one row per
    configuration instead of averaging different experiments. Two runs of one (labelled) cell
    with the same seed raise :class:`PooledRunsError` naming both directories.
    """
    by_setting: dict[str, list[Run]] = {}
    for run in runs:
        by_setting.setdefault(run.base_setting, []).append(run)
    for members in by_setting.values():
        cells: dict[tuple[Any, str], list[dict[str, str]]] = {}
        for run in members:
            cells.setdefault((run.variant, run.method), []).append(_comparable(run))
        differ: set[str] = set()
        for flats in cells.values():
            for key in set().union(*flats):
                if len({f.get(key) for f in flats}) > 1:
                    differ.add(key)
        if differ:
            for run in members:
                flat = _comparable(run)
                run.config_label = ", ".join(f"{k}={flat.get(k, 'unset')}" for k in sorted(differ))
    seen: dict[tuple[str, Any, str, int], Path] = {}
    for run in runs:
        key = (run.setting, run.variant, run.method, run.seed)
        if key in seen:
            raise PooledRunsError(f"{seen[key]} and {run.path} are both {run.method} seed {run.seed} of "
                                  f"{run.setting} with the same configuration; a table cell takes each seed once: "
                                  "move one of them out of the folder or name folders separately")
        seen[key] = run.path
