"""The paper's published table values (``paper_tables.json``, transcribed from the paper text).

Source: Dehghanpour, Azimi-Abarghouyi & Brinton, "FedHV: Low-Overhead Hypervolume
Weighting for Federated Multi-Objective Optimization", Tables 1, 6-13. The file's
``notes`` list the transcription caveats (e.g. Table 13's "per client" megabytes are
one round summed over the ten sampled clients).
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from fedhv.results.collect import Stat


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
