"""The interface every multi-task model implements."""

from __future__ import annotations

import torch
from torch import nn


class MultiTaskModel(nn.Module):
    """A shared encoder with one head per task.

    Subclasses set ``dropout`` (probability) and implement :meth:`dropout_sites` and
    ``forward(x, masks) -> list of [B, C_i] log-probabilities``. Dropout is applied
    with caller-supplied keep-masks (``None`` = evaluation), never with the model's
    own random numbers. Parameters whose names start with ``head_prefix`` belong to
    the task heads; the rest form the shared encoder.
    """

    dropout: float = 0.0
    head_prefix: str = "heads."

    def dropout_sites(self) -> dict[str, int]:
        """Dropout sites and their feature sizes (empty when the model has none)."""
        return {}

    def dropout_rates(self) -> dict[str, float]:
        """Each dropout site's drop probability (default: ``dropout`` at every site); the plans
        draw each site's keep-mask with its own probability (:mod:`fedhv.sim.plan`)."""
        return {site: self.dropout for site in self.dropout_sites()}

    def forward(self, x: torch.Tensor, masks: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        raise NotImplementedError

    def user_state_dict(self) -> dict[str, torch.Tensor]:
        """What ``model.pt`` stores: the ``state_dict`` of the model the user builds (here: this one)."""
        return self.state_dict()
