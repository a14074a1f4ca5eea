"""Figures from run directories (matplotlib, no torch).

- ``curves-<setting>``: MeanAcc, WorstAcc, MeanLoss and HV against the round, the mean
  over seeds with a ±1σ band, one colour per method (paper C.3);
- ``tasks-<setting>``: per-task test accuracy and loss (paper C.4);
- ``weights-<setting>``: FedHV's task weights w_i^t per round (paper C.6);
- ``wallclock-<setting>``: cumulative wall-clock time per method, FedHV's calibration
  drawn as its starting offset; for CIFAR10–MNIST-B it is the paper's Figure 20 and is
  named ``fig20-wallclock-cifar10-mnist-b`` (:data:`PAPER_FIGURES`);
- ``ablation-<setting>-<parameter>``: FedHV MeanAcc curves of an ablation sweep;
- ``bars-<setting>`` (paper Figure 2), ``diagnostics-<setting>`` and ``fairness-<setting>``:
  :mod:`fedhv.results.plots_diagnostics`;
- ``front-<setting>-loss`` / ``-accuracy``: the fronts of a front sweep (``fedhv grid --front``) with
  attainment bands, :mod:`fedhv.results.plots_front`.

A band is drawn where at least two seeds exist; a curve keeps the rounds all its seeds have,
with markers where it has at most :data:`SPARSE` points. Round axes have integer ticks.
Each method has one colour in every figure (:func:`method_color`). ``size`` is the
figure width: ``"column"`` (3.3 in, one paper column) or ``"page"`` (6.9 in), with
fonts scaled to match (:data:`SIZES`).

matplotlib is an optional dependency (``pip install 'fedhv[plot]'``); without it
:func:`require_matplotlib` raises :class:`PlotDependencyError` (the CLI prints it as one
``error:`` line) before any run directory is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedhv.results.collect import (
    Run,
    group,
    method_label,
    ordered_methods,
    ordered_settings,
    setting_label,
    variant_order,
)
from fedhv.results.plot_style import (  # the old names of this module: re-exported
    COLORS,
    EXTRA_COLORS,
    SIZES,
    SPARSE,
    PlotDependencyError,
    PlotSizeError,
    method_color,
    require_matplotlib,
    supported_formats,
)
from fedhv.results.plot_style import figure as _figure
from fedhv.results.plot_style import finish as _finish
from fedhv.results.plot_style import line as _line
from fedhv.results.plot_style import round_axis as _round_axis
from fedhv.results.plot_style import save as _save
from fedhv.results.plot_style import series as _series
from fedhv.results.plots_diagnostics import diagnostics_curves, fairness_curves, final_task_bars
from fedhv.results.plots_front import front_figures
from fedhv.results.plots_intervals import interval_figures

__all__ = ["COLORS", "EXTRA_COLORS", "METRICS", "PAPER_FIGURES", "SIZES", "SPARSE", "PlotDependencyError",
           "PlotSizeError", "ablation_curves", "build_figures", "diagnostics_curves", "fairness_curves",
           "final_task_bars", "learning_curves", "make_figures", "method_color", "require_matplotlib",
           "supported_formats", "task_curves", "wall_clock", "weight_trajectories"]

#: Figures that reproduce a numbered figure of the paper: (kind, setting) -> prefix of the file name.
PAPER_FIGURES: dict[tuple[str, str], str] = {("wallclock", "cifar10-mnist-b"): "fig20", ("bars", "cifar10-mnist-b"): "fig2",
                                              ("bars", "celeba5-b"): "fig2"}
METRICS = (("mean_acc", "MeanAcc (%)"), ("worst_acc", "WorstAcc (%)"), ("mean_loss", "MeanLoss"), ("hv", "HV"))


def _stem(kind: str, setting: str) -> str:
    """``<kind>-<setting>``, prefixed with the paper's figure number where it has that figure."""
    prefix = PAPER_FIGURES.get((kind, setting))
    return f"{prefix}-{kind}-{setting}" if prefix else f"{kind}-{setting}"


def _seeds_note(groups: dict[tuple[str, Any, str], list[Run]], setting: str) -> str:
    counts = sorted({len(v) for (s, var, _), v in groups.items() if s == setting and var is None})
    return f"mean ± 1σ over {'/'.join(map(str, counts))} seed(s)"


Entry = dict[str, Any]


def _field(key: str) -> Callable[[Entry], float | None]:
    """``entry[key]`` (None when missing)."""
    return lambda e: e.get(key)


def _item(key: str, i: int) -> Callable[[Entry], float | None]:
    """``entry[key][i]`` (None when missing or short)."""

    def get(e: Entry) -> float | None:
        values = e.get(key) or []
        return values[i] if i < len(values) else None

    return get


def _method_lines(ax: Any, groups: dict[tuple[str, Any, str], list[Run]], setting: str, methods: Sequence[str],
                  value: Callable[[dict[str, Any]], float | None]) -> None:
    """One test-metric curve (mean ± 1σ over seeds) per method."""
    for m in methods:
        x, mean, std = _series(groups[(setting, None, m)], lambda r: r.metrics, value)
        _line(ax, x, mean, std, method_label(m), method_color(m))


def learning_curves(groups: dict[tuple[str, Any, str], list[Run]], setting: str, size: str = "page") -> Any:
    """``curves-<setting>``: the four test metrics, one line (± 1σ band) per method."""
    fig, axes = _figure(size, 0.75, 2, 2, sharex=True)
    methods = ordered_methods({m for s, v, m in groups if s == setting and v is None})
    for ax, (key, label) in zip(axes.flat, METRICS):
        _method_lines(ax, groups, setting, methods, _field(key))
        ax.set_ylabel(label)
        _round_axis(ax)
    for ax in axes[0]:
        ax.set_xlabel("")
    return _finish(fig, axes[0, 0], f"{setting_label(setting)}: test metrics ({_seeds_note(groups, setting)})")


def task_curves(groups: dict[tuple[str, Any, str], list[Run]], setting: str, size: str = "page") -> Any:
    """``tasks-<setting>``: per-task accuracy (top row) and loss (bottom row) per method."""
    methods = ordered_methods({m for s, v, m in groups if s == setting and v is None})
    tasks = groups[(setting, None, methods[0])][0].summary.get("tasks") or []
    m = len(tasks)
    fig, axes = _figure(size, 0.75 if m <= 2 else 0.5, 2, max(m, 1), sharex=True, squeeze=False)
    for i, task in enumerate(tasks):
        for row, (key, label) in enumerate((("task_acc", "accuracy (%)"), ("task_loss", "loss"))):
            ax = axes[row, i]
            _method_lines(ax, groups, setting, methods, _item(key, i))
            ax.set_title(f"{task}: {label}")
            _round_axis(ax)
            ax.set_xlabel("round" if row == 1 else "")
    title = f"{setting_label(setting)}: per-task test accuracy and loss ({_seeds_note(groups, setting)})"
    return _finish(fig, axes[0, 0], title)


def weight_trajectories(groups: dict[tuple[str, Any, str], list[Run]], setting: str,
                        size: str = "page") -> Any | None:
    """``weights-<setting>``: FedHV's weights per task (None without FedHV runs)."""
    runs = groups.get((setting, None, "fedhv"))
    if not runs:
        return None
    tasks = runs[0].summary.get("tasks") or []
    fig, ax = _figure(size, 0.6)
    for i, task in enumerate(tasks):
        x, mean, std = _series(runs, lambda r: r.rounds, _item("weights", i))
        _line(ax, x, mean, std, f"w[{task}]", None)
    ax.axhline(1 / max(1, len(tasks)), color="k", lw=0.8, ls=":", label="uniform 1/m")
    _round_axis(ax)
    ax.set_ylabel("task weight $w_i^t$")
    ax.legend()
    ax.set_title(f"{setting_label(setting)}: FedHV weights (mean ± 1σ over {len(runs)} seed(s))")
    return fig


def wall_clock(groups: dict[tuple[str, Any, str], list[Run]], setting: str, size: str = "page") -> Any:
    """``wallclock-<setting>``: cumulative wall-clock per method, calibration as FedHV's offset."""
    fig, ax = _figure(size, 0.6)
    for m in ordered_methods({m for s, v, m in groups if s == setting and v is None}):
        runs = groups[(setting, None, m)]
        offsets = [float((r.summary.get("calibration") or {}).get("seconds") or 0.0) for r in runs]
        x, mean, std = _series(runs, lambda r: r.rounds, _field("wall_clock_s"))
        offset = float(np.mean(offsets)) if offsets else 0.0
        label = method_label(m) + (f" (incl. {offset:.3g} s calibration)" if offset else "")
        if len(x):
            x, mean = np.concatenate([[0.0], x]), np.concatenate([[offset], mean + offset])
            std = None if std is None else np.concatenate([[0.0], std])
        _line(ax, x, mean, std, label, method_color(m))
    _round_axis(ax)
    ax.set_ylabel("cumulative wall-clock (s)")
    ax.legend(loc="upper left")
    ax.set_title(f"{setting_label(setting)}: end-to-end wall-clock")
    return fig


def ablation_curves(runs: Sequence[Run], size: str = "page") -> Iterator[tuple[str, Any]]:
    """``ablation-<setting>-<parameter>``: one MeanAcc line per variant of each sweep."""
    groups = group(runs, with_variants=True)
    for setting, param in sorted({(s, v[0]) for s, v, m in groups if v is not None}):
        fig, ax = _figure(size, 0.6)
        variants = sorted((v for s, v, m in groups if s == setting and v is not None and v[0] == param),
                          key=variant_order)
        for variant in variants:
            rs = [r for (s, v, _), g in groups.items() if s == setting and v == variant for r in g]
            x, mean, std = _series(rs, lambda r: r.metrics, _field("mean_acc"))
            _line(ax, x, mean, std, f"{param.split('.')[-1]} = {variant[1]}", None)
        _round_axis(ax)
        ax.set_ylabel("MeanAcc (%)")
        ax.legend(loc="lower right")
        ax.set_title(f"{setting_label(setting)}: FedHV ablation over {param}")
        yield f"ablation-{setting}-{param.split('.')[-1]}", fig


def build_figures(runs: Sequence[Run], size: str = "page") -> Iterator[tuple[str, Any]]:
    """Every figure the runs support, as ``(stem, matplotlib Figure)``, drawn but not saved.

    The seam for inspecting the plotted data (``ax.get_lines()``, band polygons from
    ``ax.collections``); the caller closes each figure (``matplotlib.pyplot.close``).
    Figures are built one at a time, as the iterator advances; ``size`` is ``"column"``
    or ``"page"`` (:data:`SIZES`).
    """
    if size not in SIZES:
        raise PlotSizeError(f"size = {size!r} is not a figure size; choose one of {', '.join(SIZES)}")
    groups = group(runs)
    for setting in ordered_settings({s for s, _, _ in groups}):
        yield _stem("curves", setting), learning_curves(groups, setting, size)
        yield _stem("tasks", setting), task_curves(groups, setting, size)
        weights = weight_trajectories(groups, setting, size)
        if weights is not None:
            yield _stem("weights", setting), weights
        yield _stem("wallclock", setting), wall_clock(groups, setting, size)
        yield _stem("bars", setting), final_task_bars(groups, setting, size)
        for kind, build in (("diagnostics", diagnostics_curves), ("fairness", fairness_curves)):
            fig = build(groups, setting, size)
            if fig is not None:
                yield _stem(kind, setting), fig
    yield from ablation_curves(runs, size)
    yield from front_figures(runs, size)
    yield from interval_figures(runs, size)


def make_figures(runs: Sequence[Run], out: Path, formats: Sequence[str] = ("png", "pdf"),
                 size: str = "page") -> list[Path]:
    """Every figure the runs support, saved as ``out/<stem>.<format>``; returns the files written."""
    files: list[Path] = []
    for stem, fig in build_figures(runs, size):
        files += _save(fig, out, stem, formats)
    return files
