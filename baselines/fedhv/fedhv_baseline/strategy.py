"""The Strategy: fedhv's FedHVStrategy (the paper's server rule) or UniformStrategy, from the run config."""

from __future__ import annotations

from typing import Any

from fedhv.flower.strategy import FedHVStrategy, UniformStrategy

TASKS = 2


def make_strategy(run_config: Any, num_nodes: int) -> FedHVStrategy | UniformStrategy:
    """``strategy = "fedhv"``: ``calibration-rounds`` uniform rounds give ``r = max F + 0.15``, then
    ``w_i ∝ 1 / max(r_i - F_i, 1e-6)``; ``"uniform"``: ``w = 1/2`` every round."""
    kind = str(run_config["strategy"])
    sampling = {"fraction_train": float(run_config["fraction-train"]), "min_available_nodes": num_nodes,
                "fraction_evaluate": 0.0}
    if kind == "fedhv":
        return FedHVStrategy(TASKS, calibration_rounds=int(run_config["calibration-rounds"]), **sampling)
    if kind == "uniform":
        return UniformStrategy(TASKS, **sampling)
    raise ValueError(f"run config strategy = {kind!r}: use \"fedhv\" or \"uniform\"")
