"""Gradient dissimilarity of a partition (``fedhv partition-stats --gradients``; paper A.2, A.3).

For task ``i`` at a model ``theta``, with client ``k``'s full-batch gradient
``g_i^(k) = grad f_i^(k)(theta)`` (its local samples, eval mode) and the equal-weight population
gradient ``g_i = (1/N) sum_k g_i^(k)``, the heterogeneity of the paper's analysis is::

    zeta_i^2 = H_i(theta) = (1/N) sum_k ||g_i^(k) - g_i||^2.

Over a seeded subset ``S`` of ``n`` clients (when ``N`` exceeds the ``clients`` budget) the
estimate is ``s^2 = (1/(n - 1)) sum_{k in S} ||g_i^(k) - mean_S g||^2``, unbiased for the population
variance with divisor ``N - 1``; it is rescaled by ``(N - 1)/N`` to estimate ``H_i``, and
``||g_i||^2`` is estimated by ``||mean_S g||^2 - (1 - n/N) s^2 / n`` (the square of the subset
mean is biased upward by its variance; the estimate can come out negative when the spread
dwarfs the mean, and the ratio is then not reported). Reported
with ``||g_i||^2``, their ratio (the "bounded dissimilarity" ``B^2 - 1`` of FedProx-style
analyses) and ``chi_N(M) zeta_i^2``, the variance of the ``M`` sampled clients' mean gradient
(:func:`fedhv.data.heterogeneity.participation_factor`). Cost: one forward and ``m`` backward passes over the
used clients' samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhv.config.schema import RunConfig
from fedhv.data.heterogeneity import participation_factor
from fedhv.diagnostics.theory import task_gradients
from fedhv.errors import ConfigError
from fedhv.rng import numpy_rng
from fedhv.safe_io import open_regular


def _load_model(cfg: RunConfig, data: Any, model: str | None) -> tuple[torch.nn.Module, str]:
    from fedhv.experiment.setup import new_model

    net = new_model(cfg, data, cfg.seed)
    if model is None:
        return net, f"the initial model (seed {cfg.seed})"
    path = Path(model)
    if path.is_dir():
        path = path / "model.pt"
    try:
        with open_regular(path, follow=True) as fh:  # a FIFO or a device: one line, never a hang
            state = torch.load(fh, map_location=cfg.device, weights_only=True)["state_dict"]
        target = getattr(net, "module", net)
        target.load_state_dict(state)
    except (OSError, KeyError, RuntimeError, TypeError) as exc:
        raise ConfigError(f"--model {model}: cannot load a {cfg.setting} model from {path} ({exc}); give the "
                          "model.pt (or run directory) of a run of this setting") from None
    return net, str(path)


def gradient_dissimilarity(cfg: RunConfig, model: str | None = None, clients: int = 100) -> dict[str, Any]:
    """The JSON-able gradient-dissimilarity report of ``cfg``'s partition (module docstring)."""
    from fedhv.experiment.setup import federated_data

    if clients < 2:
        raise ConfigError(f"--grad-clients {clients}: need at least 2 clients to measure a spread")
    data = federated_data(cfg)
    net, where = _load_model(cfg, data, model)
    n_total = data.num_clients
    nonempty = np.array([k for k in range(n_total) if len(data.parts[k]) > 0])
    chosen = nonempty if len(nonempty) <= clients else np.sort(
        numpy_rng(cfg.partition.seed, "gradient-dissimilarity").choice(nonempty, clients, replace=False))
    grads = []
    for k in chosen.tolist():
        rows = data.parts[k].cpu().numpy()
        g, _ = task_gradients(net, data.train_x, data.train_y, data.objective, rows)
        grads.append(g)
    stack = torch.stack(grads)  # [n, m, d]
    mean = stack.mean(0)
    n = len(chosen)
    spread = ((stack - mean) ** 2).sum(-1)  # [n, m]
    grad_sq = (mean ** 2).sum(-1)
    if n == len(nonempty):  # every client: the population values themselves
        zeta = spread.mean(0)
    else:
        pop = len(nonempty)
        sample_var = spread.sum(0) / (n - 1)
        zeta = sample_var * (pop - 1) / pop
        # ||mean_S g||^2 overestimates ||g||^2 by the variance of the subset mean, (1 - n/N) s^2 / n
        grad_sq = grad_sq - (1 - n / pop) * sample_var / n
    chi = participation_factor(len(nonempty), min(cfg.train.clients_per_round, len(nonempty)))
    zeta_l, grad_l = zeta.tolist(), grad_sq.tolist()
    return {
        "model": where, "clients": len(nonempty), "clients_used": n,
        "zeta_sq": zeta_l, "grad_sq": grad_l,
        "relative": [z / g if g > 0 else None for z, g in zip(zeta_l, grad_l)],
        "chi_zeta_sq": [chi * z for z in zeta_l],
    }
