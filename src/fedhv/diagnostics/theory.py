"""The quantities the paper's analysis is stated in, measured at a model ``theta``.

Notation (paper §4, Appendix A): ``f_i`` the full-population objective of task ``i``
(:func:`fedhv.diagnostics.clients.population_objective`), ``r`` the training reference,
slack ``s_i = r_i - f_i(theta)``, log-hypervolume potential ``Phi = -sum_i log s_i``.

- **log-HV gradient** (Theorem 4.1): ``grad Phi = sum_i grad f_i / s_i``, so with the task
  Gram matrix ``G_ij = <grad f_i, grad f_j>``: ``||grad Phi||^2 = u^T G u``, ``u_i = 1/s_i``.
- **Pareto-stationarity residual** (§4.2, A.10): ``P(theta) = min_{lambda in simplex}
  ||sum_i lambda_i grad f_i||`` = the square root of the min-norm value of ``G``
  (:func:`fedhv.weighting.min_norm`), with the minimising ``lambda``. The normalised
  inverse-slack weights are feasible, so ``P <= ||grad Phi|| / c`` with ``c = sum_i 1/s_i``
  (``pareto_bound``; ``c >= c_min = sum_i 1/r_i`` for non-negative losses).
- **worst-task slack** (§4.3, A.4): ``min_i s_i >= e^{-B} / R_max(S)`` whenever ``Phi <= B``,
  ``R_max(S) = max_i prod_{j != i} S_j`` with ``S_j`` an upper bound of ``s_j``. Non-negative
  losses give ``S = r``. With ``B = Phi(theta)`` the bound is
  ``prod_j s_j / max_i prod_{j != i} r_j``; with ``B`` = the largest ``Phi`` seen so far on
  the run's evaluated models it holds uniformly along the trajectory (``slack_bound_run``).
  Both are computable from measured values; the bound needs ``s > 0`` (inside the
  reference box), else ``Phi`` is undefined and they are reported as ``None``.

The gradients are estimated on a fixed probe (:func:`draw_probe`) in eval mode:
``g_i = (1/P) sum_p grad l_i(theta; x_p, y_p)``, an unbiased estimate of ``grad f_i`` because
each probe sample is drawn by choosing a client uniformly among the non-empty ones and then
one of its samples uniformly (the mixture that defines ``f_i`` with equal client weights).
Cost: one forward and ``m`` backward passes over ``P`` samples per evaluation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from fedhv.data.parts import ClientParts
from fedhv.diagnostics.clients import membership
from fedhv.rng import numpy_rng
from fedhv.weighting import min_norm

#: Probe samples per forward/backward chunk.
PROBE_CHUNK = 256


def draw_probe(parts: ClientParts, size: int, seed: int) -> np.ndarray:
    """``size`` sample indices drawn with replacement from the clients' mixture.

    Each draw picks a client uniformly among those with samples, then one of its samples
    uniformly (stream ``diagnostics-probe`` of ``seed``), so the probe mean of any
    per-sample quantity is unbiased for its equal-weight population mean (paper A.2).
    """
    rows, _, sizes = (t.cpu().numpy() for t in membership(parts, "cpu"))
    clients = np.flatnonzero(sizes > 0)
    if len(clients) == 0:
        raise ValueError("no client holds samples: the probe is empty")
    rng = numpy_rng(seed, "diagnostics-probe")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    pick = clients[rng.integers(0, len(clients), size)]
    offset = np.floor(rng.random(size) * sizes[pick]).astype(np.int64)
    return rows[starts[pick] + offset]


def task_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor, objective: Any,
                   rows: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
    """Per-task probe gradients ``[m, d]`` (float64, over ``model``'s trainable parameters in
    :meth:`~torch.nn.Module.parameters` order) and probe losses ``[m]``, in eval mode."""
    params = [p for p in model.parameters() if p.requires_grad]
    was_training = model.training
    model.eval()
    idx = torch.as_tensor(rows, device=x.device)
    total = None
    loss_sum = None
    try:
        for start in range(0, len(idx), PROBE_CHUNK):
            chunk = idx[start:start + PROBE_CHUNK]
            with torch.enable_grad():
                losses, _ = objective.per_sample(model(x[chunk]), y[chunk])
                m = losses.shape[1]
                sums = losses.sum(0)
                grads = []
                for i in range(m):
                    g = torch.autograd.grad(sums[i], params, retain_graph=i < m - 1, allow_unused=True)
                    grads.append(torch.cat([(gi if gi is not None else torch.zeros_like(p)).reshape(-1).double()
                                            for gi, p in zip(g, params)]))
            block = torch.stack(grads)
            total = block if total is None else total + block
            loss_sum = sums.detach().double() if loss_sum is None else loss_sum + sums.detach().double()
    finally:
        model.train(was_training)
    assert total is not None and loss_sum is not None
    return total / len(idx), (loss_sum / len(idx)).cpu().numpy()


def r_max(reference: np.ndarray) -> float:
    """``R_max(r) = max_i prod_{j != i} r_j`` (paper §4.3 with ``S = r``)."""
    r = np.asarray(reference, dtype=np.float64)
    return max(math.prod(np.delete(r, i).tolist()) for i in range(len(r)))


def slack_bound(phi: float, reference: np.ndarray) -> float:
    """``e^{-B} / R_max(r)`` with ``B = phi``: the least worst-task slack ``Phi <= B`` allows."""
    return math.exp(-phi) / r_max(reference)


def loghv_quantities(gram: np.ndarray, objective: np.ndarray, reference: np.ndarray) -> dict[str, Any]:
    """``||grad Phi||^2``, ``P(theta)`` with its ``lambda``, ``pareto_bound``, ``Phi`` and the slack bound.

    Parameters
    ----------
    gram : array ``[m, m]``
        ``G_ij = <g_i, g_j>`` of the per-task gradients.
    objective : array ``[m]``
        ``f(theta)`` (full population).
    reference : array ``[m]``
        The training reference ``r``.
    """
    g = np.asarray(gram, dtype=np.float64)
    slack = np.asarray(reference, dtype=np.float64) - np.asarray(objective, dtype=np.float64)
    mn = min_norm(g)
    out: dict[str, Any] = {
        "slack": slack.tolist(),
        "min_slack": float(slack.min()),
        "pareto_residual": math.sqrt(max(mn.norm_sq, 0.0)),
        "pareto_lambda": mn.weights.tolist(),
        "task_grad_norm": np.sqrt(np.clip(np.diag(g), 0.0, None)).tolist(),
    }
    if (slack <= 0).any():  # outside the reference box: Phi and its gradient are undefined
        out.update(phi=None, grad_phi_sq=None, pareto_bound=None, slack_bound=None)
        return out
    u = 1.0 / slack
    grad_phi_sq = float(max(u @ g @ u, 0.0))
    phi = float(-np.log(slack).sum())
    out.update(phi=phi, grad_phi_sq=grad_phi_sq, pareto_bound=math.sqrt(grad_phi_sq) / float(u.sum()),
               slack_bound=slack_bound(phi, reference))
    return out
