"""Pieces of the client computation shared by all engines."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rotate(x: torch.Tensor, degrees: torch.Tensor, mode: str = "bilinear") -> torch.Tensor:
    """Rotate each image of ``x`` ``[n, C, H, W]`` by ``degrees[n]``.

    ``grid_sample`` (``mode`` bilinear or nearest) with zero padding (in normalised
    space) and ``align_corners=False``, as in the reference code's preprocessing.
    """
    rad = degrees.to(x.dtype) * (math.pi / 180.0)
    cos, sin = torch.cos(rad), torch.sin(rad)
    zero = torch.zeros_like(cos)
    affine = torch.stack([torch.stack([cos, -sin, zero], -1), torch.stack([sin, cos, zero], -1)], -2)
    grid = F.affine_grid(affine, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode=mode, padding_mode="zeros", align_corners=False)


