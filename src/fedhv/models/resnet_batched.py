"""ResNet-18-GN over ``n`` stacked model copies at once: the folded layers of the batched engine's
forward (:func:`fedhv.models.resnet.resnet_batched_forward` composes them).

The ``n`` copies (one per client and weight row) are folded into the channel
dimension: copy ``i``'s batch ``x_i [B, 3, H, W]`` becomes channels
``[3i, 3i + 3)`` of one ``[B, 3n, H, W]`` tensor, and every layer keeps copy ``i``
in channels ``[iC, (i+1)C)`` of its ``C``-channel output:

* convolution: one grouped ``conv2d`` with ``groups = n`` and the copies' kernels
  stacked along the output channels (``[n, C_out, C_in, k, k] -> [n C_out, C_in, k, k]``);
  group ``i`` sees exactly copy ``i``'s input channels and kernel;
* GroupNorm: each copy normalises its ``C`` channels in :data:`~fedhv.models.resnet.GROUPS`
  ``= G`` groups of ``C/G`` channels,

  .. math::

      \\mathrm{GN}_i(h)_{b,c} = \\gamma_{i,c}\\,
      \\frac{h_{b,c} - \\mu_{b,g}}{\\sqrt{\\sigma^2_{b,g} + \\epsilon}} + \\beta_{i,c},
      \\qquad g = \\lfloor c / (C/G) \\rfloor,

  with mean and variance over the group's channels and all pixels of sample ``b``.
  On the folded tensor, ``F.group_norm(h, G n, γ.reshape(-1), β.reshape(-1))`` splits
  the ``nC`` channels into ``Gn`` groups of ``C/G``: folded group ``iG + g`` is channels
  ``[iC + g C/G, iC + (g+1) C/G)``, i.e. exactly copy ``i``'s group ``g``, and folded
  channel ``iC + c`` takes ``γ_{i,c}``, ``β_{i,c}``. (``G`` groups instead of ``Gn``
  would mix copies' statistics.)
* residual additions and ReLU are element-wise, so fold unchanged; ``avg_pool2d`` is
  per channel; the flattened ``[B, n·512]`` features unfold to ``[n, B, 512]`` and the
  heads are batched matrix products (:func:`~fedhv.models.functional.bmm_linear`).

Layouts (measured on the 2-core Sapphire Rapids CPU, fp32, fwd + bwd, docs/performance-history.md):
the stem convolution (3 input channels) runs copy by copy in ``channels_last`` and is
concatenated, as in the CIFAR CNN (a few % faster than grouped at 10 copies); the 32x32 to
8x8 stages use grouped ``channels_last`` convolutions (1.4-5x faster than a loop over the
copies); the 4x4 stage runs in NCHW, where oneDNN's grouped 512-channel convolutions were
~1.6x faster than in ``channels_last``. A whole forward + backward of 10 copies (batch 64,
32x32) took 21.6 s against 25.3 s all grouped ``channels_last`` and ~32 s with
``torch.func.vmap`` (loaded 2-core CPU).
The result equals the per-copy ``forward`` up to float rounding of the reduction order
(float64: ~1e-15; ``tests/unit/models/test_resnet_batched.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: Stages (0-based, in ``model.layers``) from which the folded maps are kept in NCHW
#: instead of ``channels_last`` (the 4x4, 512-channel stage).
NCHW_FROM_STAGE = 3


def grouped_conv(h: torch.Tensor, w: torch.Tensor, stride: int = 1, padding: int = 0) -> torch.Tensor:
    """``n`` copies' convolutions as one grouped convolution.

    Parameters
    ----------
    h : Tensor ``[B, n C_in, H, W]``
        Folded input: copy ``i`` in channels ``[i C_in, (i+1) C_in)``.
    w : Tensor ``[n, C_out, C_in, k, k]``
        Stacked kernels.

    Returns
    -------
    Tensor ``[B, n C_out, H', W']``
        Copy ``i``'s output in channels ``[i C_out, (i+1) C_out)``.
    """
    n = w.shape[0]
    return F.conv2d(h, w.reshape(-1, *w.shape[2:]), stride=stride, padding=padding, groups=n)


def grouped_norm(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, groups: int) -> torch.Tensor:
    """Per-copy ``GroupNorm(groups, C)`` on folded channels (module docstring).

    Parameters
    ----------
    h : Tensor ``[B, n C, H, W]``
    weight, bias : Tensor ``[n, C]``
        Each copy's affine parameters.
    groups : int
        Groups per copy (``G``); the folded call uses ``G n``.
    """
    return F.group_norm(h, groups * weight.shape[0], weight.reshape(-1), bias.reshape(-1))
