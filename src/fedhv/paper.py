"""The FedHV paper's published values, kept as data (no torch): fedhv's one home of paper numbers.

Source: Dehghanpour, Azimi-Abarghouyi & Brinton, "FedHV: Low-Overhead Hypervolume
Weighting for Federated Multi-Objective Optimization", Tables 1, 6-13, transcribed from
the paper's text into ``fedhv/paper_tables.json``. The file's ``notes`` list the
transcription caveats (e.g. Table 13's "per client" megabytes are one round summed over
the ten sampled clients). :data:`REFERENCES` (Table 6, per benchmark family) is read from
it; :mod:`fedhv.results.paper_data` compares runs with it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

__all__ = ["REFERENCES", "paper_tables", "paper_value"]


@lru_cache(maxsize=1)
def paper_tables() -> dict[str, Any]:
    """The whole transcription (``paper_tables.json``).

    Returns
    -------
    dict
        ``{"source": ..., "table1": ..., "table6": ..., ..., "notes": [...]}``.
    """
    text = (resources.files("fedhv") / "paper_tables.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def paper_value(*path: str | int) -> Any:
    """The entry at ``path`` of :func:`paper_tables`, or ``None`` when there is none.

    Parameters
    ----------
    *path : str or int
        Keys (and list indices), e.g. ``"table1", "multimnist", "fedhv", "mean_acc"``.

    Returns
    -------
    Any
        The entry, or ``None``.
    """
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


def _family(setting: str) -> str:
    """The benchmark family of a paper setting (``celeba5-a`` -> ``celeba5``)."""
    return setting[:-2] if setting.endswith(("-a", "-b")) else setting


def _references() -> dict[str, tuple[float, ...]]:
    """Table 6's training references per benchmark family (the file lists them per setting)."""
    out: dict[str, tuple[float, ...]] = {}
    for setting, values in paper_tables()["table6"].items():
        ref = tuple(float(v) for v in values)
        if out.setdefault(_family(setting), ref) != ref:  # pragma: no cover - a damaged transcription
            raise ValueError(f"paper_tables.json: table6 gives two references for {_family(setting)}")
    return out


#: Table 6: frozen training references r^train per benchmark family.
REFERENCES: dict[str, tuple[float, ...]] = _references()
