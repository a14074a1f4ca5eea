"""Reduced-precision forward passes (``precision = "bf16"``).

With ``"bf16"`` the models' forward passes run under ``torch.autocast(device_type,
dtype=torch.bfloat16)``: convolutions and matrix products take bfloat16 inputs (AMX on
recent x86 CPUs, tensor cores on GPUs) and the outputs are cast back to the run's
``dtype`` (float32) before any loss is formed. Everything else stays in float32: the
parameters (autocast casts a bfloat16 copy per op), the losses, the gradients (autograd
returns them in the leaf's dtype), the SGD and momentum updates, and all server maths.

What changes numerically: each autocast op rounds its inputs to bfloat16 (8 significant
bits, unit roundoff ``u = 2^-8``), so a forward output carries a relative error of a few
``u`` per layer. On the CPU, ``log_softmax`` and ``sigmoid`` also run in bfloat16 under
autocast (on CUDA they run in float32), so a per-sample log-likelihood is exact only to
about ``u |log p|``.

``"fp32"`` is the identity: :func:`autocast` is a null context and :func:`amp_module`
returns the model itself, so fp32 runs are unchanged bit for bit.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The forward-pass context of ``precision`` on ``device`` (a null context for ``"fp32"``)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    raise ValueError(f"precision = {precision!r} is not supported; choose fp32 or bf16")


def to_dtype(outputs: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """Model outputs in ``dtype`` (no copy for outputs already in it)."""
    return [o.to(dtype) for o in outputs]


class AutocastModule(nn.Module):
    """``model`` whose forward runs under :func:`autocast` and returns ``dtype`` outputs.

    Shares ``model``'s parameters and training mode (``train()`` / ``eval()`` on the wrapper
    reach the model), so it can be handed to :func:`fedhv.metrics.evaluate.evaluate_tasks`.
    """

    def __init__(self, model: nn.Module, precision: str) -> None:
        super().__init__()
        self.model = model
        self.precision = precision
        first = next(model.parameters())
        self.out_dtype, self.device = first.dtype, first.device
        self.train(model.training)

    def forward(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        with autocast(self.precision, self.device):
            out = self.model(*args, **kwargs)
        return to_dtype(out, self.out_dtype)


def amp_module(model: nn.Module, precision: str) -> nn.Module:
    """``model`` itself for ``"fp32"``, else an :class:`AutocastModule` around it."""
    return model if precision == "fp32" else AutocastModule(model, precision)
