"""Front figures of a front sweep (``fedhv plot`` on a folder with ``fedhv grid --front`` runs).

- ``front-<setting>-loss``: each family's final test-loss vectors over the directions (one marker per run),
  with, for ``m = 2``, its empirical attainment surfaces over seeds (:func:`fedhv.results.fronts.attainment`):
  the median (thick) between the best (some seed reached it) and the worst (every seed did), the band shaded;
- ``front-<setting>-accuracy``: the same in accuracy space (attainment of ``-accuracy``, drawn back as
  accuracy: higher is better);
- ``m > 2``: one panel per pair of tasks, the runs' points projected (no attainment surfaces).

A family is a method with its margin (:mod:`fedhv.results.tables_front`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import combinations
from typing import Any

import numpy as np

from fedhv.results.collect import Run, setting_label
from fedhv.results.fronts import attainment
from fedhv.results.plot_style import figure, method_color
from fedhv.results.tables_front import Family, complete_seeds, family_label, family_order, front_runs

#: Losses spanning more than this factor are drawn on log axes (the knee of a front is otherwise a dot).
LOG_SPAN = 4.0
#: The spaces drawn: (stem, summary key, axis word, sign that makes it a minimisation).
SPACES: tuple[tuple[str, str, str, float], ...] = (("loss", "task_loss", "test loss", 1.0),
                                                  ("accuracy", "task_acc", "test accuracy (%)", -1.0))


def _values(run: Run, key: str) -> np.ndarray | None:
    v = run.reported.get(key)
    if not isinstance(v, list) or not v:
        return None
    a = np.asarray(v, dtype=np.float64)
    return a if np.isfinite(a).all() else None


def _staircase(points: np.ndarray, sign: float) -> tuple[np.ndarray, np.ndarray]:
    """The boundary of the region an attainment surface's points (minimisation) dominate, as a step line."""
    p = points[np.argsort(points[:, 0])]
    xs, ys = [p[0, 0]], [p[0, 1]]
    for a, b in p[1:]:
        xs += [a, a]
        ys += [ys[-1], b]
    return sign * np.asarray(xs), sign * np.asarray(ys)


def _corners(x: np.ndarray) -> list[int]:
    """The staircase's vertices that are attainment points (every other one after the first)."""
    return [0, *range(2, len(x), 2)]


def _family_style(family: Family, families: Sequence[Family]) -> tuple[str, str, str]:
    """Colour of the method; line style and marker by the margin's place among the method's margins
    (so that two margins of one method stay apart in a scatter without attainment lines, m > 2)."""
    margins = sorted(d for m, d in families if m == family[0] and d is not None)
    styles, markers = ("-", "--", ":", "-."), ("o", "^", "s", "D", "v", "P", "X")
    k = margins.index(family[1]) if family[1] is not None else 0
    return method_color(family[0]), styles[k % len(styles)], markers[k % len(markers)]


def _plane(ax: Any, fams: dict[Family, dict[int, list[tuple[tuple[float, ...], Run]]]], key: str, sign: float,
           i: int, j: int, surfaces: bool) -> None:
    for family in family_order(list(fams)):  # the legend in the tables' order: by method, then margin
        seeds, _ = complete_seeds(fams[family])  # as the table: a seed covering fewer directions is left out
        color, style, marker = _family_style(family, list(fams))
        per_seed = []
        for _, pairs in sorted(seeds.items()):
            pts = [v for _, r in pairs if (v := _values(r, key)) is not None]
            if pts:
                per_seed.append(np.asarray(pts)[:, [i, j]])
        if not per_seed:
            continue
        allp = np.vstack(per_seed)
        ax.scatter(allp[:, 0], allp[:, 1], s=12, color=color, marker=marker, alpha=0.5, linewidths=0)
        label = family_label(family)
        if surfaces:
            surf = attainment([sign * p for p in per_seed], (0, 50, 100))
            if 50.0 in surf:
                x, y = _staircase(surf[50.0], sign)
                ax.plot(x, y, style, color=color, lw=1.6, label=label, marker=marker, markersize=3,
                        markevery=_corners(x))
                label = ""
            for q in (0.0, 100.0):
                if q in surf:
                    x, y = _staircase(surf[q], sign)
                    ax.plot(x, y, style, color=color, lw=0.6, alpha=0.6)
        if label:
            ax.scatter([], [], s=12, color=color, marker=marker, label=label)


def _log_axes(ax: Any) -> None:
    """Log axes labelled with plain numbers (0.2, 0.3, 1), not powers of ten."""
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.set_xscale("log")  # before the formatters: setting a scale installs its own
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)


def front_figures(runs: Sequence[Run], size: str = "page") -> Iterator[tuple[str, Any]]:
    """``(stem, figure)`` of every front figure the runs support (see the module docstring)."""
    for setting, fams in front_runs(runs).items():
        members = [r for seeds in fams.values() for pairs in seeds.values() for _, r in pairs]
        tasks = next((r.summary.get("tasks") for r in members if r.summary.get("tasks")), None)
        for stem, key, word, sign in SPACES:
            m = next((len(v) for r in members if (v := _values(r, key)) is not None), 0)
            if m < 2:
                continue
            names = list(tasks) if isinstance(tasks, list) and len(tasks) == m else [f"task {k + 1}" for k in range(m)]
            pairs = list(combinations(range(m), 2))
            cols = min(len(pairs), 3)
            rows = -(-len(pairs) // cols)
            fig, axes = figure(size, 0.8 * rows / cols if len(pairs) > 1 else 0.75, rows, cols, squeeze=False)
            points = np.vstack([v for r in members if (v := _values(r, key)) is not None])
            log = stem == "loss" and bool((points > 0).all()) and points.max() > LOG_SPAN * points.min()
            for ax, (i, j) in zip(axes.flat, pairs):
                _plane(ax, fams, key, sign, i, j, surfaces=(m == 2))
                ax.set_xlabel(f"{names[i]} {word}" + (" (log)" if log else ""))
                ax.set_ylabel(f"{names[j]} {word}" + (" (log)" if log else ""))
                if log:  # a front from one task's best to the other's spans decades; the knee needs the room
                    _log_axes(ax)
            for ax in list(axes.flat)[len(pairs):]:
                ax.set_visible(False)
            axes.flat[0].legend(fontsize="small")
            what = "median attainment over seeds; thin: best, worst" if m == 2 else "pairwise projections"
            fig.suptitle(f"{setting_label(setting)}: fronts in {stem} ({what})")
            yield f"front-{setting}-{stem}", fig
