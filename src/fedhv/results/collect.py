"""Find run directories under a folder and read what the tables and figures need.

Reads only files (``config.toml``, ``summary.json``, ``metrics.jsonl``,
``rounds.jsonl``, ``calibration.json``, ``grid-job.json``); never imports torch.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from fedhv.results.rundir import read_jsonl

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

    @property
    def setting(self) -> str:
        return str(self.summary.get("setting") or self.config.get("setting"))

    @property
    def method(self) -> str:
        return str(self.summary.get("method") or self.config.get("method"))

    @property
    def seed(self) -> int:
        return int(self.summary.get("seed", self.config.get("seed", 0)))

    @cached_property
    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path / "metrics.jsonl")

    @cached_property
    def rounds(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path / "rounds.jsonl")

    @cached_property
    def calibration(self) -> dict[str, Any] | None:
        p = self.path / "calibration.json"
        return json.loads(p.read_text()) if p.exists() else None

    def config_value(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def last_scheduled(self, n: int = 10) -> list[dict[str, Any]]:
        """The last ``n`` *scheduled* test evaluations (round a multiple of ``eval.test_period``).

        The extra evaluation after the last round, when that round is off schedule, is
        left out (paper Table 11 averages "the final ten scheduled test evaluations").
        """
        period = int(self.config_value("eval.test_period", 0) or 0)
        scheduled = [e for e in self.metrics if period and e["round"] % period == 0]
        return (scheduled or self.metrics)[-n:]


def find_runs(root: Path | str) -> tuple[list[Run], list[Path]]:
    """Finished runs under ``root`` (recursively) and unfinished run directories."""
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
        config = tomllib.loads(config_path.read_text())
        summary = json.loads(summary_path.read_text())
        variant, ablation = None, None
        job_path = folder / "grid-job.json"
        if job_path.exists():
            job = json.loads(job_path.read_text())
            ablation = job.get("ablation")
            if job.get("variant"):
                variant = (str(job["variant"][0]), job["variant"][1])
        runs.append(Run(folder, config, summary, variant, ablation))
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


def ordered_settings(settings: Iterable[str]) -> list[str]:
    known = [s for s in SETTING_ORDER if s in set(settings)]
    return known + sorted(set(settings) - set(known))


def ordered_methods(methods: Iterable[str]) -> list[str]:
    known = [m for m in METHOD_ORDER if m in set(methods)]
    return known + sorted(set(methods) - set(known))
