"""Figure 4 of the paper: example images of a benchmark (``fedhv plot --examples SETTING``).

Two-task image benchmarks (MultiMNIST, MNIST–FMNIST, CIFAR10–MNIST): the first training
image of each of the first task's classes 0–5, each titled with its two labels. CelebA5: for each of the
five objectives the paper's representative attribute (Eyeglasses for T1, Wavy Hair for T2,
Wearing Hat for T3, Smiling for T4, Bangs for T5; paper Figure 4) and the first training
images that have it. Images are shown as stored (uint8), before normalisation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

#: Class names of the source datasets, by a substring of the task name.
CLASS_NAMES: dict[str, tuple[str, ...]] = {
    "fashion": ("T-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot"),
    "cifar": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
}
#: Paper Figure 4: one representative positive attribute per CelebA5 objective.
CELEBA_CUES: tuple[str, ...] = ("Eyeglasses", "Wavy_Hair", "Wearing_Hat", "Smiling", "Bangs")


def _label(task: str, value: int) -> str:
    for key, names in CLASS_NAMES.items():
        if key in task and 0 <= value < len(names):
            return names[value]
    return str(value)


def _show(ax: Any, image: np.ndarray, title: str) -> None:
    ax.imshow(image, cmap="gray" if image.ndim == 2 else None, interpolation="nearest")
    ax.set_title(title, fontsize="small")
    ax.set_xticks([])
    ax.set_yticks([])


def examples_figure(bench: Any, setting: str, count: int = 6, size: str = "page") -> Any:
    """The example figure of ``bench`` (a :class:`fedhv.data.benchmarks.Benchmark`)."""
    from fedhv.data.celeba import ATTRIBUTES
    from fedhv.results.collect import setting_label
    from fedhv.results.plots import _figure

    groups = getattr(bench.objective, "groups", None)
    if groups is not None:  # multi-label: attribute columns per task
        fig, axes = _figure(size, 0.45, 2, len(groups), squeeze=False)
        for i, cue in enumerate(CELEBA_CUES[: len(groups)]):
            col = ATTRIBUTES.index(cue)
            rows = np.flatnonzero(bench.train_y[:, col] == 1)[:2]
            for j in range(2):
                ax = axes[j, i]
                if j < len(rows):
                    _show(ax, bench.train_x[rows[j]], f"{bench.task_names[i]}: {cue.replace('_', ' ')}")
                else:
                    ax.set_axis_off()
    else:
        fig, axes = _figure(size, 0.22, 1, count, squeeze=False)
        # the first image of each of the first-task classes 0, 1, ... (image folders are sorted by class)
        first = bench.train_y[:, 0]
        rows = [int(np.flatnonzero(first == c)[0]) for c in range(count) if (first == c).any()]
        for j, row in enumerate(rows):
            title = " / ".join(_label(t, int(v)) for t, v in zip(bench.task_names, bench.train_y[row]))
            _show(axes[0, j], bench.train_x[row], title)
        for j in range(len(rows), count):
            axes[0, j].set_axis_off()
    fig.suptitle(f"{setting_label(setting)}: training examples (labels: {' / '.join(bench.task_names)})")
    return fig


def make_examples(setting: str, overrides: list[str], out: Path, formats: list[str], size: str = "page") -> list[Path]:
    """Load ``setting``'s benchmark and write ``fig4-examples-<setting>.<format>``."""
    from fedhv.config import load_config
    from fedhv.data.benchmarks import load_benchmark
    from fedhv.results.plots import _save

    cfg = load_config(setting, overrides)
    d = cfg.data
    bench = load_benchmark(d.benchmark, root=d.root, download=d.download, pair_seed=d.pair_seed,
                           val_fraction=d.val_fraction, val_seed=d.val_seed)
    return _save(examples_figure(bench, cfg.setting, size=size), out, f"fig4-examples-{cfg.setting}", formats)
