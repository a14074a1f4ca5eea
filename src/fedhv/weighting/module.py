"""FedHV's weight map as composable torch objects, for centralized multi-task training.

For task losses ``l = (l_1, ..., l_m)`` and a reference ``r`` (a loss level every
task should stay below)::

    s_i = max(r_i - l_i, rho_clip),     w_i = s_i^{-1} / sum_j s_j^{-1},
    L   = sum_i w_i l_i .

``w`` is computed from ``l.detach()``: no gradient flows through the weights, so
``grad L = sum_i w_i grad l_i`` is the normalised gradient of the log-hypervolume
``-sum_i log(r_i - l_i)`` (paper §3.3). A task close to its reference (small slack)
gets a large weight.

Choosing ``r`` without a calibration run
-----------------------------------------
The federated method takes ``r_i = max_t F_i^t + delta_r`` from a short uniform-weight
calibration run (``delta_r = 0.15``). Centrally, the same rule applied to the losses
you already have works:

1. evaluate the freshly initialised model on a few training batches and take the mean
   loss per task, ``l_i(theta^0)`` (a ``C``-class cross-entropy starts near ``log C``;
   losses mostly fall from there);
2. set ``r_i = l_i(theta^0) + delta_r`` with ``delta_r = 0.15`` (for losses on another
   scale use about 10 % of ``l_i(theta^0)``) -- :func:`reference_from_losses` does
   this from one row or from the rows of a short warm-up with uniform weights.

If a task's loss rises above ``r_i`` during training its slack hits the floor
``rho_clip`` and that task takes almost all the weight until it is back below ``r``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedhv.errors import ConfigError


def reference_from_losses(losses: Sequence[float] | Sequence[Sequence[float]] | np.ndarray | torch.Tensor,
                          margin: float = 0.15) -> list[float]:
    """``r_i = max_t l_i^t + margin`` from one loss vector ``[m]`` or a history ``[T, m]``.

    Examples
    --------
    >>> reference_from_losses([[2.3, 0.7], [2.0, 0.9]], margin=0.15)
    [2.4499999999999997, 1.05]
    """
    arr = _as_array(losses)
    if arr.ndim not in (1, 2) or arr.size == 0 or not np.all(np.isfinite(arr)):
        raise ConfigError(f"losses = {arr.tolist()} must be finite values of shape [m] or [T, m]; "
                          "pass the per-task losses of the initial model or of a short warm-up")
    if not 0 <= margin < math.inf:
        raise ConfigError(f"margin = {margin} must be finite and >= 0; use e.g. margin = 0.15")
    return (np.atleast_2d(arr).max(0) + margin).tolist()


def _as_array(losses: object) -> np.ndarray:
    """``float64`` array of a tensor, an array or (nested) sequences of numbers or scalar tensors.

    Tensors are detached first, so the losses of a training step (``requires_grad``) can be
    passed as they are.
    """
    def plain(v: object) -> object:
        if isinstance(v, torch.Tensor):
            return v.detach().double().cpu().numpy()
        if isinstance(v, (list, tuple)):
            return [plain(u) for u in v]
        return v

    try:
        return np.asarray(plain(losses), dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"losses = {losses!r} are not numbers of shape [m] or [T, m]; pass the per-task "
                          "losses as a tensor, an array or a list of floats") from None


class HVWeighting(nn.Module):
    """Inverse-slack task weights ``w = W(l.detach(); r)`` as a module.

    Parameters
    ----------
    reference : sequence of float or Tensor ``[m]``
        ``r``; see the module docstring (or :func:`reference_from_losses`) for a recipe.
    rho_clip : float
        Slack floor ``rho_clip > 0`` (paper: ``1e-6``).

    Examples
    --------
    >>> hv = HVWeighting([3.0, 3.0])
    >>> hv(torch.tensor([1.0, 2.0]))
    tensor([0.3333, 0.6667])
    """

    reference: torch.Tensor

    def __init__(self, reference: Sequence[float] | torch.Tensor, rho_clip: float = 1e-6) -> None:
        super().__init__()
        ref = torch.as_tensor(reference, dtype=torch.float64).detach().clone()
        if ref.ndim != 1 or len(ref) == 0 or not bool(torch.isfinite(ref).all()):
            raise ConfigError(f"reference = {ref.tolist()} must be a non-empty vector of finite values, one per task")
        if not 0 < rho_clip < math.inf:
            raise ConfigError(f"rho_clip = {rho_clip} must be finite and > 0; use e.g. rho_clip = 1e-6")
        self.rho_clip = float(rho_clip)
        self.register_buffer("reference", ref)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]  # nn.Module's signature
        """Move the module like any other, but keep ``reference`` in float64.

        ``model.half()`` / ``model.to(torch.float32)`` on a model holding this module would
        otherwise round ``r`` (2.45 becomes 2.4492 in float16) and shift every weight.
        """
        ref = self.reference
        super()._apply(fn, recurse)
        self.reference = ref.to(device=self.reference.device)
        return self

    @property
    def num_tasks(self) -> int:
        return int(self.reference.numel())

    def forward(self, losses: torch.Tensor) -> torch.Tensor:
        """Weights ``[..., m]`` (on the simplex, no gradient) for losses ``[..., m]``.

        A non-finite loss raises :class:`~fedhv.errors.ConfigError` naming the task (its weights
        would be NaN); the check reads one flag back from the device per call.

        The map is evaluated in float64 (float32 on MPS, which has no float64) whatever the
        losses' dtype, and the weights are returned in the losses' floating dtype: in float16
        (mixed precision) ``1 / rho_clip = 1e6`` would overflow to ``inf`` and give NaN
        weights, and integer losses would truncate ``r``.
        """
        if losses.shape[-1:] != (self.num_tasks,):
            raise ConfigError(f"losses have shape {tuple(losses.shape)} but the reference has "
                              f"{self.num_tasks} tasks; pass one loss per task in the last dimension")
        work = torch.float32 if losses.device.type == "mps" else torch.float64
        out = losses.dtype if losses.is_floating_point() else torch.get_default_dtype()
        with torch.no_grad():
            finite = torch.isfinite(losses.detach())
            if not bool(finite.all()):  # one host sync per call: NaN weights would silently poison the step
                task = int(torch.nonzero(~finite.reshape(-1, self.num_tasks).all(0))[0, 0])
                raise ConfigError(f"losses[..., {task}] is not finite ({losses.detach().reshape(-1, self.num_tasks)[:, task].tolist()[:4]}); "
                                  "the weights of a diverged task are undefined: lower the learning rate or check "
                                  "that task's inputs and targets")
            ref = self.reference.to(device=losses.device, dtype=work)
            inv = 1.0 / torch.clamp(ref - losses.detach().to(work), min=self.rho_clip)
            return (inv / inv.sum(-1, keepdim=True)).to(out)

    def weighted_loss(self, losses: torch.Tensor) -> torch.Tensor:
        """``L = sum_i w_i l_i`` (gradient through ``l`` only)."""
        return (self(losses) * losses).sum(-1)

    def extra_repr(self) -> str:
        return f"reference={[round(v, 6) for v in self.reference.tolist()]}, rho_clip={self.rho_clip:g}"


class HVBackward:
    """Adapter for LibMTL-style training loops: ``weights = weighting.backward(losses)``.

    ``backward`` computes ``w = W(l.detach(); r)``, back-propagates ``sum_i w_i l_i``
    and returns ``w`` as a numpy array (what LibMTL's ``AbsWeighting.backward``
    returns for logging); :attr:`last_weights` keeps the last weights.

    Parameters
    ----------
    reference, rho_clip
        As for :class:`HVWeighting`.
    """

    def __init__(self, reference: Sequence[float] | torch.Tensor, rho_clip: float = 1e-6) -> None:
        self.weighting = HVWeighting(reference, rho_clip)
        self.last_weights: np.ndarray | None = None

    def backward(self, losses: torch.Tensor | Sequence[torch.Tensor], **kwargs: object) -> np.ndarray:
        """Back-propagate the weighted sum of ``losses`` (a tensor ``[m]`` or ``m`` scalars)."""
        vec = losses if isinstance(losses, torch.Tensor) else torch.stack([torch.as_tensor(v) for v in losses])
        weights = self.weighting(vec)
        (weights * vec).sum().backward()
        self.last_weights = weights.detach().cpu().numpy()
        return self.last_weights
