"""Figures of the diagnostics and of the final per-task results (matplotlib, no torch).

- ``diagnostics-<setting>``: ``||grad Phi||^2`` (with its running mean, dashed), the Pareto
  residual ``P(theta)``, the report error ``||F^t - f(theta^t)||_inf`` and the worst client's
  accuracy (worst task; dashed: the 10th percentile client), one colour per method, mean ± 1σ
  over seeds
  (``fedhv.diagnostics``; runs made with ``diagnostics.enabled = true``);
- ``fairness-<setting>``: per task, the clients' mean score, 10th percentile and worst client;
- ``bars-<setting>``: final per-task test accuracy per method, mean ± 1σ over seeds (the
  paper's Figure 2 for CIFAR10–MNIST-B and CelebA5-B, named ``fig2-bars-<setting>``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedhv.results.collect import Run, method_label, ordered_methods, setting_label
from fedhv.results.plot_style import figure as _figure
from fedhv.results.plot_style import finish as _finish
from fedhv.results.plot_style import line as _line
from fedhv.results.plot_style import method_color
from fedhv.results.plot_style import round_axis as _round_axis
from fedhv.results.plot_style import series as _series

Groups = dict[tuple[str, Any, str], list[Run]]


def _diag(key: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda e: (e.get("diagnostics") or {}).get(key)


def _at_round(key: str) -> Callable[[dict[str, Any]], float | None]:
    """A ``rounds.jsonl`` diagnostics value, placed at the evaluated round it describes (``at_round``)."""
    return lambda e: (e.get("diagnostics") or {}).get(key)


def _round_records(run: Run) -> list[dict[str, Any]]:
    """``rounds.jsonl`` records with diagnostics, re-keyed to the round of the model they describe."""
    return [{**r, "round": r["diagnostics"]["at_round"]} for r in run.rounds
            if isinstance(r.get("diagnostics"), dict) and r["diagnostics"].get("at_round") is not None]


def _worst_client(e: dict[str, Any], key: str = "worst") -> float | None:
    """The worst client's (``key = "p10"``: the 10th percentile's) score on the worst accuracy task."""
    d = e.get("diagnostics") or {}
    scores = (d.get("clients") or {}).get("score") or []
    acc = e.get("task_acc") or []
    values = [s.get(key) for i, s in enumerate(scores) if i < len(acc) and acc[i] is not None]
    values = [v for v in values if v is not None]
    return min(values) if values else None


def _client_stat(i: int, key: str) -> Callable[[dict[str, Any]], float | None]:
    def get(e: dict[str, Any]) -> float | None:
        scores = ((e.get("diagnostics") or {}).get("clients") or {}).get("score") or []
        return scores[i].get(key) if i < len(scores) else None

    return get


def has_diagnostics(runs: Sequence[Run]) -> bool:
    return any("diagnostics" in e for r in runs for e in r.metrics)


def diagnostics_curves(groups: Groups, setting: str, size: str = "page") -> Any | None:
    """``diagnostics-<setting>`` (None when no run of the setting has diagnostics)."""
    methods = [m for m in ordered_methods({m for s, v, m in groups if s == setting and v is None})
               if has_diagnostics(groups[(setting, None, m)])]
    if not methods:
        return None
    fig, axes = _figure(size, 0.75, 2, 2, sharex=True)
    panels = [
        (axes[0, 0], lambda r: r.metrics, _diag("grad_phi_sq"), r"$\|\nabla\Phi(\theta^t)\|^2$", True),
        (axes[0, 1], lambda r: r.metrics, _diag("pareto_residual"), r"Pareto residual $P(\theta^t)$", True),
        (axes[1, 0], _round_records, _at_round("report_error"), r"report error $\|F^t - f(\theta^t)\|_\infty$", True),
        (axes[1, 1], lambda r: r.metrics, _worst_client, "worst client accuracy (%)\n(dashed: 10th percentile)",
         False),
    ]
    for m in methods:
        runs = groups[(setting, None, m)]
        for ax, entries, value, _, _ in panels:
            x, mean, std = _series(runs, entries, value)
            _line(ax, x, mean, std, method_label(m), method_color(m))
        x, mean, _ = _series(runs, lambda r: r.metrics, _diag("grad_phi_sq_avg"))
        if len(x):
            axes[0, 0].plot(x, mean, color=method_color(m), lw=0.9, ls="--")
        x, mean, _ = _series(runs, lambda r: r.metrics, lambda e: _worst_client(e, "p10"))
        if len(x):  # with many small clients the worst one is often at 0 %: the 10th percentile, dashed
            axes[1, 1].plot(x, mean, color=method_color(m), lw=0.9, ls="--")
    for ax, _, _, label, log in panels:
        ax.set_ylabel(label)
        if log and any(line.get_ydata().size and (np.asarray(line.get_ydata()) > 0).all() for line in ax.get_lines()):
            ax.set_yscale("log")
        _round_axis(ax)
    for ax in axes[0]:
        ax.set_xlabel("")
    return _finish(fig, axes[1, 1], f"{setting_label(setting)}: theory diagnostics (dashed: running mean of "
                   r"$\|\nabla\Phi\|^2$)")


def fairness_curves(groups: Groups, setting: str, size: str = "page") -> Any | None:
    """``fairness-<setting>``: per task, mean (solid), 10th percentile (dashed) and worst (dotted) client."""
    methods = [m for m in ordered_methods({m for s, v, m in groups if s == setting and v is None})
               if has_diagnostics(groups[(setting, None, m)])]
    if not methods:
        return None
    first = groups[(setting, None, methods[0])][0]
    tasks = first.summary.get("tasks") or []
    metrics = first.summary.get("task_metrics") or [{}] * len(tasks)
    fig, axes = _figure(size, 0.45, 1, max(1, len(tasks)), sharex=True, squeeze=False)
    for i, task in enumerate(tasks):
        ax = axes[0, i]
        for m in methods:
            for key, style in (("mean", "-"), ("p10", "--"), ("worst", ":")):
                x, mean, _ = _series(groups[(setting, None, m)], lambda r: r.metrics, _client_stat(i, key))
                if len(x):
                    ax.plot(x, mean, ls=style, color=method_color(m), lw=1.1,
                            label=f"{method_label(m)} {key}" if i == 0 else None)
        ax.set_title(f"{task}: per-client {metrics[i].get('metric', 'score') if i < len(metrics) else 'score'}")
        _round_axis(ax)
    return _finish(fig, axes[0, 0], f"{setting_label(setting)}: per-client fairness (mean, 10th percentile, worst)")


def final_task_bars(groups: Groups, setting: str, size: str = "page") -> Any:
    """``bars-<setting>``: final per-task test score per method (mean ± 1σ over seeds; paper Figure 2)."""
    methods = ordered_methods({m for s, v, m in groups if s == setting and v is None})
    tasks = groups[(setting, None, methods[0])][0].summary.get("tasks") or []
    fig, ax = _figure(size, 0.45)
    width = 0.8 / max(1, len(methods))
    lows = []
    for j, m in enumerate(methods):
        runs = groups[(setting, None, m)]
        values = np.array([[(r.reported.get("task_score") or r.reported.get("task_acc") or [np.nan] * len(tasks))[i]
                            for i in range(len(tasks))] for r in runs], dtype=float)
        with warnings.catch_warnings():  # a task whose score is missing in every seed: no bar
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(values, 0)
        err = values.std(0, ddof=1) if len(runs) > 1 else None
        xs = np.arange(len(tasks)) + (j - (len(methods) - 1) / 2) * width
        ax.bar(xs, mean, width, yerr=err, label=f"{method_label(m)} ({len(runs)})", color=method_color(m),
               capsize=2)
        low_bar = mean - (err if err is not None else 0)
        if np.isfinite(low_bar).any():
            lows.append(float(np.nanmin(low_bar)))
    ax.set_xticks(np.arange(len(tasks)), tasks)
    low = min(lows) if lows else 0.0
    if np.isfinite(low) and low > 10:
        ax.set_ylim(max(0.0, low - 5), None)
    bottom, top = ax.get_ylim()
    ax.set_ylim(bottom, top + 0.15 * (top - bottom))  # room for the legend above the bars
    ax.set_ylabel("final test score (accuracy %)")
    ax.legend(loc="upper right", ncols=min(4, len(methods)), framealpha=1.0)
    ax.set_title(f"{setting_label(setting)}: final per-task test accuracy (mean ± 1σ over seeds)")
    return fig
