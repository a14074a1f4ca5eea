"""How a client trains locally: optimizer, steps or epochs, gradient clipping.

The paper's local update is ``K`` steps of SGD (with momentum, restarted every round) on
``sum_i w_i l_i``; that stays the default. :class:`LocalTraining` adds what a user of
PyTorch / Flower expects:

- **optimizer**: any of :data:`OPTIMIZERS` (``torch.optim`` classes whose update is
  elementwise, so one optimizer over the batched engine's ``[n, d]`` copies is exactly
  ``n`` independent optimizers), with its keyword options (``weight_decay``, ``betas``, …);
  its state restarts every round, as the paper's momentum buffer does;
- **local epochs** instead of steps: client ``c`` with ``S_c`` samples takes
  ``K_c = epochs * max(1, floor(S_c / B))`` steps (one batch per epoch for a client smaller
  than the batch, :mod:`fedhv.sim.plan`);
- **gradient clipping** by norm, per client: ``g <- g * min(1, c / (||g|| + 1e-6))`` over
  all of a copy's parameters (``torch.nn.utils.clip_grad_norm_``'s rule), before the
  optimizer step.

Aggregation weighted by sample count is the server's (:mod:`fedhv.algorithms.base`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fedhv.config.schema import OPTIMIZER_NAMES
from fedhv.errors import ConfigError

#: ``torch.optim`` classes a client may use, by their config names (elementwise updates only:
#: LBFGS needs a closure and whole-model line searches, so it cannot run per model copy).
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad, "adamax": torch.optim.Adamax, "nadam": torch.optim.NAdam,
    "radam": torch.optim.RAdam,
}
assert tuple(OPTIMIZERS) == OPTIMIZER_NAMES


def optimizer_name(optimizer: str | type) -> str:
    """The config name of ``optimizer`` (a name or one of the :data:`OPTIMIZERS` classes)."""
    if isinstance(optimizer, str):
        name = optimizer.lower()
        if name in OPTIMIZERS:
            return name
    else:
        for name, cls in OPTIMIZERS.items():
            if optimizer is cls:
                return name
    shown = optimizer if isinstance(optimizer, str) else getattr(optimizer, "__name__", repr(optimizer))
    raise ConfigError(f"optimizer = {shown!r} is not supported; use one of {', '.join(OPTIMIZERS)} (a name or the "
                      "torch.optim class: optimizers with elementwise updates)")


@dataclass(frozen=True)
class LocalTraining:
    """A client's local optimisation (defaults: the paper's SGD, ``local_steps`` steps, no clipping).

    Attributes
    ----------
    optimizer : str
        A key of :data:`OPTIMIZERS`.
    options : tuple of (str, value)
        Keyword options of the optimizer (``lr`` is ``lr_local``; SGD's ``momentum`` is the
        engine's ``momentum``).
    local_epochs : int
        ``0``: ``local_steps`` steps per round; ``E > 0``: ``E`` passes over the client's data.
    clip_grad_norm : float
        ``0``: no clipping; ``c > 0``: clip each copy's gradient to norm ``c``.
    """

    optimizer: str = "sgd"
    options: tuple[tuple[str, Any], ...] = ()
    local_epochs: int = 0
    clip_grad_norm: float = 0.0

    @classmethod
    def of(cls, optimizer: str | type = "sgd", options: Mapping[str, Any] | None = None, local_epochs: int | None = None,
           clip_grad_norm: float | None = None, momentum: float = 0.0) -> LocalTraining:
        """Checked construction from user values (``None``: the default); ``momentum`` is the
        engine's (SGD's), for the check that the options fit it."""
        name = optimizer_name(optimizer)
        opts = dict(options or {})
        for bad in ("lr", "params", "momentum"):
            if bad in opts and not (bad == "momentum" and name != "sgd"):
                raise ConfigError(f"optimizer_options['{bad}'] is set elsewhere: "
                                  + ("lr_local" if bad == "lr" else "the model's parameters" if bad == "params"
                                     else "momentum") + " does that")
        epochs = 0 if local_epochs is None else local_epochs
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
            raise ConfigError(f"local_epochs = {local_epochs!r} must be an integer >= 1 (or None: use local_steps)")
        clip = 0.0 if clip_grad_norm is None else float(clip_grad_norm)
        if not math.isfinite(clip) or clip < 0:
            raise ConfigError(f"clip_grad_norm = {clip_grad_norm!r} must be a finite number > 0 (or None: no clipping)")
        local = cls(name, tuple(sorted(opts.items())), epochs, clip)
        local.make([torch.zeros(2, requires_grad=True)], 0.1, momentum)  # bad options fail here, not in round 1
        return local

    @property
    def plain_sgd(self) -> bool:
        """The paper's update (SGD without options): the engines' hand-written path."""
        return self.optimizer == "sgd" and not self.options

    def steps(self, samples: int, batch_size: int, local_steps: int) -> int:
        """Local steps of a client with ``samples`` samples."""
        if not self.local_epochs:
            return local_steps
        return self.local_epochs * max(1, samples // batch_size)

    def make(self, params: Iterable[torch.Tensor], lr: float, momentum: float) -> torch.optim.Optimizer:
        """A fresh optimizer over ``params`` (every round starts one)."""
        cls: Callable[..., torch.optim.Optimizer] = OPTIMIZERS[self.optimizer]  # each takes lr= (the base class does not)
        opts = dict(self.options)
        if self.optimizer == "sgd":
            opts["momentum"] = momentum
        elif momentum:
            raise ConfigError(f"momentum = {momentum} applies to optimizer = \"sgd\" only; set the momentum of "
                              f"{self.optimizer} through its options (e.g. betas) and momentum = 0")
        try:
            return cls(list(params), lr=lr, **opts)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"optimizer = {self.optimizer!r} with options {dict(self.options)}: {exc}") from None

    def as_dict(self) -> dict[str, Any]:
        """What the run directory records (``config.toml`` ``[train]``)."""
        return {"optimizer": self.optimizer, "optimizer_options": dict(self.options),
                "local_epochs": self.local_epochs, "clip_grad_norm": self.clip_grad_norm}


def clip_rows(grad: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Each row of ``grad [n, d]`` scaled to norm at most ``max_norm`` (``clip_grad_norm_``'s rule)."""
    norms = torch.linalg.vector_norm(grad, dim=-1, keepdim=True)
    return grad * torch.clamp(max_norm / (norms + 1e-6), max=1.0)
