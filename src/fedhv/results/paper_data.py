"""The paper's published table values compared with runs.

The values live in :mod:`fedhv.paper` (``fedhv/paper_tables.json``, transcribed from the
paper's text; :func:`paper_tables` and :func:`paper_value` are re-exported from there);
this module reads them as :class:`~fedhv.results.collect.Stat` and names how a grid's
setting differs from the paper's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

from fedhv.paper import paper_tables, paper_value  # noqa: F401 - re-exported: the paper data's one home
from fedhv.results.collect import Run, Stat

#: Configuration keys that make a run's setting the paper's (Tables 3-5 and B.5): a run
#: that differs in one of them is not comparable with the published value.
SETTING_KEYS: tuple[str, ...] = (
    "rounds", "partition.clients", "partition.samples_per_client", "partition.alpha", "partition.strata",
    "partition.seed", "train.clients_per_round", "train.batch_size", "train.local_steps", "train.momentum",
    "eval.test_period", "data.max_test_samples",
)


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
    from fedhv.config.loader import build_run_config, load_setting, preset_names, to_dict

    if setting not in preset_names():
        return None
    data: dict[str, Any] = to_dict(build_run_config(load_setting(setting)))
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
