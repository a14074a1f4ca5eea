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
   scale use about 10 % of the loss's scale, ``|l_i(theta^0)|`` or how far it is expected
   to fall: a loss may be negative, e.g. a Gaussian NLL, and the margin must stay
   ``>= 0``) -- :func:`reference_from_losses` does
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


def _check_losses(losses: object, where: str) -> None:
    if not isinstance(losses, torch.Tensor):
        raise ConfigError(f"{where}: losses = {losses!r} ({type(losses).__name__}) is not a tensor; pass the task "
                          "losses as one tensor [..., m], e.g. torch.stack([loss_1, ..., loss_m])")


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
        try:
            ref = torch.as_tensor(reference, dtype=torch.float64).detach().clone()
        except (TypeError, ValueError, RuntimeError):
            raise ConfigError(f"reference = {reference!r} is not numbers; pass one finite loss level per task, e.g. "
                              "[2.45, 1.05] (see reference_from_losses)") from None
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
        """The number of tasks ``m`` (the reference's length)."""
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
        _check_losses(losses, "HVWeighting")
        if losses.shape[-1:] != (self.num_tasks,):
            raise ConfigError(f"losses have shape {tuple(losses.shape)} but the reference has "
                              f"{self.num_tasks} tasks; pass one loss per task in the last dimension")
        work = torch.float32 if losses.device.type == "mps" else torch.float64
        out = losses.dtype if losses.is_floating_point() else torch.get_default_dtype()
        with torch.no_grad():
            finite = torch.isfinite(losses.detach())
            if not bool(finite.all()):  # one host sync per call: NaN weights would silently poison the step
                task = int(torch.nonzero(~finite.reshape(-1, self.num_tasks).all(0))[0, 0])
                values = losses.detach().reshape(-1, self.num_tasks)[:, task].tolist()[:4]
                raise ConfigError(f"losses[..., {task}] is not finite ({values}): task {task}'s loss is NaN or "
                                  "infinite, so its weight is undefined; find where that loss becomes non-finite "
                                  "(its loss function on these inputs and targets, e.g. log of 0, or a model that "
                                  "diverged earlier: then lower the learning rate)")
            ref = self.reference.to(device=losses.device, dtype=work)
            inv = 1.0 / torch.clamp(ref - losses.detach().to(work), min=self.rho_clip)
            return (inv / inv.sum(-1, keepdim=True)).to(out)

    def weighted_loss(self, losses: torch.Tensor) -> torch.Tensor:
        """``L = sum_i w_i l_i`` (gradient through ``l`` only)."""
        _check_losses(losses, "HVWeighting.weighted_loss")
        return (self(losses) * losses).sum(-1)

    def backward(self, *args: object, **kwargs: object) -> None:
        """Not a training step: raises, naming the two that are."""
        raise ConfigError("HVWeighting has no backward(); call hv.weighted_loss(losses).backward(), or use "
                          "HVBackward(reference).backward(losses) (LibMTL style)")

    def extra_repr(self) -> str:
        """The reference and ``rho_clip`` in the module's ``repr``."""
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

    def __call__(self, *args: object, **kwargs: object) -> None:
        """Not callable: raises, naming the method to call."""
        raise ConfigError("HVBackward is not called: use weights = hvb.backward(losses) (it back-propagates), or "
                          "HVWeighting(reference)(losses) for the weights alone")

    def backward(self, losses: torch.Tensor | Sequence[torch.Tensor], **kwargs: object) -> np.ndarray:
        """Back-propagate the weighted sum of ``losses`` (a tensor ``[m]`` or ``m`` scalar tensors).

        Raises
        ------
        ConfigError
            For losses that are not tensors of the forward pass (numbers, ``.item()`` or
            ``.detach()`` values: nothing to back-propagate), or a graph already freed by an
            earlier ``backward``.
        """
        if isinstance(losses, torch.Tensor):
            vec = losses
        elif isinstance(losses, (list, tuple)) and losses and all(isinstance(v, torch.Tensor) for v in losses):
            if any(v.numel() != 1 for v in losses):
                raise ConfigError(f"HVBackward.backward: losses are tensors of shapes {[list(v.shape) for v in losses]}; "
                                  "pass one scalar loss per task (or one tensor [m])")
            vec = torch.stack([v.reshape(()) for v in losses])
        else:
            raise ConfigError(f"HVBackward.backward: losses = {losses!r} are not loss tensors; pass the m task losses "
                              "of the forward pass (a tensor [m] or a list of scalar tensors), not their .item() values")
        if not vec.requires_grad:
            raise ConfigError("HVBackward.backward: the losses do not require grad, so there is nothing to "
                              "back-propagate; pass the losses computed from the model (not .detach() / .item() "
                              "values, not under torch.no_grad())")
        weights = self.weighting(vec)
        try:
            (weights * vec).sum().backward()
        except RuntimeError as exc:
            if "second time" not in str(exc):
                raise
            raise ConfigError("HVBackward.backward: these losses were back-propagated already (their graph is "
                              "freed); compute the losses again for each step, and call backward once per step") \
                from None
        self.last_weights = weights.detach().cpu().numpy()
        return self.last_weights
