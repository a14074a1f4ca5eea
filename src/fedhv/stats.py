"""``fedhv partition-stats``: per-client label histograms of a setting's partition."""

from __future__ import annotations

import numpy as np

from fedhv.config.schema import RunConfig
from fedhv.data.partition import label_histograms
from fedhv.objectives import MultiLabel


def print_partition_stats(cfg: RunConfig) -> None:
    """Print, per client, the label counts of every task (classification) or the
    positive-attribute rate of every task (multi-label), and the strata present."""
    from fedhv.experiment.setup import load_data

    bench, parts = load_data(cfg)
    p = cfg.partition
    strata = bench.strata(p.strata)
    keys, counts = np.unique(strata, return_counts=True)
    print(
        f"{cfg.setting}: {p.clients} clients x {p.samples_per_client} samples, alpha = {p.alpha}, "
        f"{p.strata} strata ({len(keys)} present in the training pool), seed {p.seed}; "
        f"{len(np.unique(parts))} distinct samples of {len(bench.train_y)}"
    )
    if len(keys) <= 40:
        print("strata sizes: " + ", ".join(f"{k}:{c}" for k, c in zip(keys, counts)))
    if isinstance(bench.objective, MultiLabel):
        print("\npositive-attribute rate per task and client")
        print(f"{'client':>6} " + "".join(f"{n:>7}" for n in bench.task_names) + "   strata")
        for k, row in enumerate(parts):
            rates = [bench.train_y[row][:, list(g)].mean() for g in bench.objective.groups]
            print(f"{k:>6} " + "".join(f"{r:7.3f}" for r in rates) + f"   {len(np.unique(strata[row])):6d}")
        return
    hists = [label_histograms(bench.train_y[:, i], parts, c) for i, c in enumerate(bench.num_classes)]
    for i, name in enumerate(bench.task_names):
        width = max(4, len(str(int(hists[i].max()))) + 1)
        header = "".join(f"{c:>{width}}" for c in range(bench.num_classes[i]))
        print(f"\ntask {name!r}: label counts per client")
        print(f"{'client':>6} {header}   top-share  strata")
        for k, row in enumerate(hists[i]):
            present = len(np.unique(strata[parts[k]]))
            cells = "".join(f"{v:>{width}}" for v in row)
            print(f"{k:>6} {cells}   {row.max() / row.sum():9.2f}  {present:6d}")
