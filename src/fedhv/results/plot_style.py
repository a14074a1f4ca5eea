"""Drawing primitives shared by fedhv's figures (matplotlib, no torch): one colour per method,
figure sizes, round axes, mean ± σ series, atomic saving.

:mod:`fedhv.results.plots` and :mod:`fedhv.results.plots_diagnostics` draw with these (the
names are also importable from :mod:`fedhv.results.plots`, as before).
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedhv import safe_io
from fedhv.errors import FedHVError
from fedhv.results.collect import Run

COLORS = {"uniform": "#7f7f7f", "fsmgda": "#1f77b4", "fedcmoo": "#2ca02c", "fedhv": "#d62728"}
#: Colours for other (registered) methods, picked by a stable hash of the name.
EXTRA_COLORS = ("#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#393b79", "#637939")
#: Figure width (inches) and base font size (pt) per ``size``.
SIZES: dict[str, tuple[float, float]] = {"column": (3.3, 7.0), "page": (6.9, 9.0)}
#: A curve with at most this many points is drawn with markers.
SPARSE = 30
class PlotDependencyError(FedHVError, ImportError):
    """matplotlib, needed for figures, cannot be imported."""


class PlotSizeError(FedHVError, ValueError):
    """An unknown figure size."""


def require_matplotlib() -> Any:
    """Import matplotlib with the non-interactive ``Agg`` backend.

    Raises
    ------
    PlotDependencyError
        When matplotlib is missing or broken, with the install command.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot
    except ImportError as exc:
        raise PlotDependencyError(
            f"fedhv plot needs matplotlib, which cannot be imported ({exc}); "
            "install it with: pip install 'fedhv[plot]'"
        ) from None
    return matplotlib


def supported_formats() -> list[str]:
    """File formats matplotlib can save figures in (``png``, ``pdf``, ``svg``, ...)."""
    require_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def method_color(method: str) -> str:
    """The colour of ``method`` in every figure: fixed for the paper's four, else by a stable hash."""
    if method in COLORS:
        return COLORS[method]
    return EXTRA_COLORS[zlib.crc32(method.encode("utf-8")) % len(EXTRA_COLORS)]


def pyplot(size: str = "page") -> Any:
    require_matplotlib()
    import matplotlib.pyplot as plt

    if size not in SIZES:
        raise PlotSizeError(f"size = {size!r} is not a figure size; choose one of {', '.join(SIZES)}")
    font = SIZES[size][1]
    plt.rcParams.update({"font.size": font, "axes.titlesize": font, "figure.titlesize": font + 1,
                         "legend.fontsize": font - 1, "axes.grid": True, "grid.alpha": 0.3, "legend.frameon": False,
                         "lines.markersize": 3.0, "figure.dpi": 110, "savefig.dpi": 300, "savefig.bbox": None})
    return plt


def figure(size: str, height_ratio: float, rows: int = 1, cols: int = 1, **kw: Any) -> tuple[Any, Any]:
    """A figure ``size`` wide (:data:`SIZES`) and ``height_ratio`` times as high, constrained layout."""
    width = SIZES[size][0] if size in SIZES else SIZES["page"][0]
    return pyplot(size).subplots(rows, cols, figsize=(width, width * height_ratio), layout="constrained", **kw)


def round_axis(ax: Any) -> None:
    """Label the x axis "round" and give it integer ticks only."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def series(runs: Sequence[Run], entries: Callable[[Run], list[dict[str, Any]]],
            value: Callable[[dict[str, Any]], float | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Rounds common to all runs, mean and (with >= 2 runs) sample std of ``value``."""
    per_run = []
    for run in runs:
        d = {}
        for e in entries(run):
            v = value(e)
            if v is not None:
                d[int(e["round"])] = float(v)
        per_run.append(d)
    common = sorted(set.intersection(*(set(d) for d in per_run))) if per_run else []
    x = np.asarray(common, dtype=float)
    ys = np.asarray([[d[r] for r in common] for d in per_run], dtype=float)
    if ys.size == 0:
        return x, np.zeros(0), None
    std = ys.std(0, ddof=1) if len(per_run) > 1 else None
    return x, ys.mean(0), std


def line(ax: Any, x: np.ndarray, mean: np.ndarray, std: np.ndarray | None, label: str, color: str | None) -> None:
    if len(x) == 0:
        return
    (line,) = ax.plot(x, mean, label=label, color=color, lw=1.2, marker="o" if len(x) <= SPARSE else None)
    if std is not None:
        ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.18, lw=0)


def save(fig: Any, out: Path, stem: str, formats: Sequence[str]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for fmt in formats:
        path = out / f"{stem}.{fmt}"
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt)
        safe_io.write_atomic_bytes(path, buf.getvalue())  # never through a link planted in the folder
        files.append(path)
    pyplot().close(fig)
    return files


def finish(fig: Any, legend_ax: Any, title: str) -> Any:
    """Legend on ``legend_ax`` and the figure title; returns ``fig``."""
    legend_ax.legend(loc="lower right")
    fig.suptitle(title)
    return fig
