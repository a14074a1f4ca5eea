"""The paper's published table values (``paper_tables.json``, transcribed from the paper text).

Source: Dehghanpour, Azimi-Abarghouyi & Brinton, "FedHV: Low-Overhead Hypervolume
Weighting for Federated Multi-Objective Optimization", Tables 1, 6-13. The file's
``notes`` list the transcription caveats (e.g. Table 13's "per client" megabytes are
one round summed over the ten sampled clients).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import cache, lru_cache
from importlib import resources
from typing import Any

from fedhv.results.collect import Run, Stat

#: Configuration keys that make a run's setting the paper's (Tables 3-5 and B.5): a run
#: that differs in one of them is not comparable with the published value.
SETTING_KEYS: tuple[str, ...] = (
    "rounds", "partition.clients", "partition.samples_per_client", "partition.alpha", "partition.strata",
    "partition.seed", "train.clients_per_round", "train.batch_size", "train.local_steps", "train.momentum",
    "eval.test_period", "data.max_test_samples",
)


@lru_cache(maxsize=1)
def paper_tables() -> dict[str, Any]:
    """The whole transcription."""
    text = (resources.files("fedhv.results") / "paper_tables.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def paper_value(*path: str | int) -> Any:
    """The entry at ``path`` (e.g. ``"table1", "multimnist", "fedhv", "mean_acc"``) or ``None``."""
    node: Any = paper_tables()
    for key in path:
        if isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
            continue
        if isinstance(node, dict) and key in node:
            node = node[key]
            continue
        return None
    return node


def paper_stat(*path: str | int) -> Stat | None:
    """A ``{"mean", "std"}`` entry (or a plain number) as a :class:`Stat` over 3 seeds."""
    value = paper_value(*path)
    if isinstance(value, dict) and "mean" in value:
        return Stat(float(value["mean"]), None if value.get("std") is None else float(value["std"]), 3)
    if isinstance(value, (int, float)):
        return Stat(float(value), None, 3)
    return None


@cache
def _preset(setting: str) -> dict[str, Any] | None:
    """The bundled preset ``setting`` with its defaults filled in (no validation, no torch), or None."""
    from fedhv.config.loader import build, load_setting, preset_names, to_dict
    from fedhv.config.schema import RunConfig

    if setting not in preset_names():
        return None
    data: dict[str, Any] = to_dict(build(RunConfig, load_setting(setting)))
    return data


def _get(config: Mapping[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def setting_differences(runs: Iterable[Run], setting: str, ignore: Iterable[str] = (),
                        paper: Mapping[str, Any] | None = None) -> list[str]:
    """How the runs' configuration differs from the paper's ``setting``, as ``"key = ours (paper P)"``.

    The paper's setting is the bundled preset of that name (paper Tables 3-5), with
    ``paper`` overriding some keys (Table 13 reports 300 rounds); only
    :data:`SETTING_KEYS` not in ``ignore`` are compared (an ablation varies its own key).
    Empty when they agree, when ``setting`` is not a preset, or when a run does not record
    a key.
    """
    preset = _preset(setting)
    if preset is None:
        return []
    out: list[str] = []
    for key in SETTING_KEYS:
        if key in ignore:
            continue
        theirs = (paper or {}).get(key, _get(preset, key))
        ours = sorted({repr(v) for v in (_get(r.config, key) for r in runs) if v is not None and v != theirs})
        if ours:
            out.append(f"{key} = {'/'.join(o.strip(chr(39)) for o in ours)} (paper {theirs})")
    return out
