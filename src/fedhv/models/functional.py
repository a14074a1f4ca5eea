"""Small functional pieces shared by the models."""

from __future__ import annotations

import torch


def masked_dropout(h: torch.Tensor, mask: torch.Tensor | None, p: float) -> torch.Tensor:
    """Inverted dropout with a caller-supplied keep-mask: ``h * mask / (1 - p)``; ``None`` = identity."""
    if mask is None:
        return h
    return h * mask.to(h.dtype) * (1.0 / (1.0 - p))


def bmm_linear(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-copy linear layer: ``h [C, B, in] @ w[C, out, in]^T + b[C, out]`` -> ``[C, B, out]``."""
    return torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))
