"""Figures of the comparison's interval estimates (``fedhv plot``), drawn where a setting has two methods with at
least :data:`MIN_SEEDS` seeds each.

- ``intervals-<setting>``: per metric (MeanAcc, WorstAcc) one row per method, its 95 % bootstrap interval as a bar
  and its mean as a dot, methods in the order of the ``intervals`` table (:mod:`fedhv.results.tables_intervals`;
  rliable's ``plot_interval_estimates`` draws the same).
- ``critical-difference``: across every block (a setting and a seed that every drawn method ran), the methods'
  average ranks on ``(MeanAcc + WorstAcc) / 2`` with the Nemenyi critical difference after a Friedman test
  (Demšar, JMLR 2006), drawn by ``autorank`` (``pip install 'fedhv[plot]'``; without it the figure is left out
  with a note). Methods missing from some block (a diverged seed) are left out of this figure and named.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from fedhv.results.collect import Run, group, method_label, ordered_settings, setting_label
from fedhv.results.intervals import CONFIDENCE, interval
from fedhv.results.plot_style import figure, method_color
from fedhv.results.tables_intervals import METRICS

log = logging.getLogger("fedhv")

#: Seeds a method needs in a setting to be drawn with an interval.
MIN_SEEDS = 3
#: Blocks (setting × seed) the critical-difference diagram needs (autorank's minimum).
MIN_BLOCKS = 5


def _values(runs: Sequence[Run], key: str) -> dict[int, float]:
    """``key`` of each run by seed, as the comparison reads it (:meth:`Run.compared`)."""
    return {r.seed: v for r in runs if (v := r.compared(key)) is not None}


def interval_figures(runs: Sequence[Run], size: str = "page") -> Iterator[tuple[str, Any]]:
    """``(stem, figure)`` of the interval figure of every setting with two methods of :data:`MIN_SEEDS` seeds."""
    groups = group(runs)
    drawn: dict[str, dict[str, dict[str, dict[int, float]]]] = {}
    for setting in ordered_settings({s for s, _, _ in groups}):
        values = {m: {key: _values(rs, key) for key, _ in METRICS} for (s, _, m), rs in groups.items()
                  if s == setting}
        values = {m: v for m, v in values.items() if all(len(x) >= MIN_SEEDS for x in v.values())}
        if len(values) < 2:
            continue
        drawn[setting] = values
        ivs = {m: {key: interval(list(v[key].values())) for key, _ in METRICS} for m, v in values.items()}
        order = sorted(values, key=lambda m: sum(ivs[m][k].mean for k, _ in METRICS))  # best at the top
        fig, axes = figure(size, 0.12 + 0.035 * len(order), 1, len(METRICS), sharey=True, squeeze=False)
        for ax, (key, label) in zip(axes[0], METRICS):
            for y, m in enumerate(order):
                iv = ivs[m][key]
                color = method_color(m)
                ax.plot([iv.low, iv.high], [y, y], color=color, linewidth=5, alpha=0.45, solid_capstyle="butt")
                ax.plot([iv.mean], [y], "o", color=color, markersize=4, label=method_label(m))
            ax.set_xlabel(f"{label} (%)")
            ax.grid(axis="x", alpha=0.3)
        axes[0][0].set_yticks(range(len(order)), [method_label(m) for m in order])
        seeds = sorted({len(v["mean_acc"]) for v in values.values()})
        fig.suptitle(f"{setting_label(setting)}: mean and {CONFIDENCE:.0%} bootstrap interval over "
                     f"{'–'.join(map(str, (seeds[0], seeds[-1]))) if len(seeds) > 1 else seeds[0]} seeds",
                     fontsize="medium")
        yield f"intervals-{setting}", fig
    if drawn:
        cd = critical_difference(drawn, size)
        if cd is not None:
            yield "critical-difference", cd


def critical_difference(drawn: dict[str, dict[str, dict[str, dict[int, float]]]], size: str = "page") -> Any:
    """The critical-difference diagram over the blocks every method ran (module docstring), or None."""
    try:
        import pandas as pd
        from autorank import autorank, plot_stats
    except ImportError:
        log.warning("note: the critical-difference figure needs autorank (pip install 'fedhv[plot]'); left out")
        return None
    methods = sorted({m for values in drawn.values() for m in values})
    blocks = [(s, seed) for s, values in drawn.items()
              for seed in sorted({seed for v in values.values() for seed in v["mean_acc"]})]

    def score(s: str, seed: int, m: str) -> float | None:
        v = drawn[s].get(m)
        if v is None or seed not in v["mean_acc"] or seed not in v["worst_acc"]:
            return None
        return (v["mean_acc"][seed] + v["worst_acc"][seed]) / 2

    complete = [m for m in methods if all(score(s, seed, m) is not None for s, seed in blocks)]
    left = sorted(set(methods) - set(complete))
    if left:
        log.warning(f"note: critical-difference figure: left out {', '.join(map(method_label, left))} "
                    "(not run on every setting and seed)")
    if len(complete) < 2 or len(blocks) < MIN_BLOCKS:
        log.warning(f"note: critical-difference figure left out: {len(blocks)} blocks (setting × seed), the Friedman "
                    f"test needs at least {MIN_BLOCKS}")
        return None
    frame = pd.DataFrame({method_label(m): [score(s, seed, m) for s, seed in blocks] for m in complete})
    result = autorank(frame, alpha=0.05, verbose=False, order="descending", force_mode="nonparametric")
    fig, ax = figure(size, 0.1 + 0.03 * len(complete))
    plot_stats(result, ax=ax, allow_insignificant=True)
    ax.set_title(f"Average rank on (MeanAcc + WorstAcc) / 2 over {len(blocks)} blocks (setting × seed); "
                 f"Friedman p = {result.pvalue:.2g}, Nemenyi CD = {result.cd:.2f}", fontsize="small")
    return fig
