"""Small functional pieces shared by the models."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedhv.models import native


def masked_dropout(h: torch.Tensor, mask: torch.Tensor | None, p: float) -> torch.Tensor:
    """Inverted dropout with a caller-supplied keep-mask: ``h * mask / (1 - p)``; ``None`` = identity."""
    if mask is None:
        return h
    return h * mask.to(h.dtype) * (1.0 / (1.0 - p))


class _BatchedLinear(torch.autograd.Function):
    """``y = h w^T + b`` per copy, with the weight gradient formed in the weight's own layout.

    Autograd's ``baddbmm`` backward forms the gradient of ``w^T`` as ``h^T g`` (``[C, in, out]``)
    and transposes it, so its ``[C, out, in]`` copy is materialised later (for CIFAR's
    ``fc1``, 10 x 384 x 4096 floats a step: 36 ms of a 0.58 s step). Here
    ``dL/dw = g^T h`` (``[C, out, in]``, contiguous), ``dL/dh = g w`` and ``dL/db = sum_B g``;
    the products run in ``g``'s dtype (bf16 under autocast, as autograd would) and the
    engine casts each gradient to its input's dtype.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def,override]
        h, w, _ = inputs
        ctx.save_for_backward(h, w)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[no-untyped-def,override]
        h, w = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad
        gh = torch.bmm(g, w.to(g.dtype)) if need_h else None
        gw = torch.bmm(g.transpose(1, 2), h.to(g.dtype)) if need_w else None
        gb = g.sum(1) if need_b else None
        return gh, gw, gb


def bmm_linear(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-copy linear layer: ``h [C, B, in] @ w[C, out, in]^T + b[C, out]`` -> ``[C, B, out]``.

    Differentiable in all three arguments (:class:`_BatchedLinear`: the weight gradient is
    formed as ``[C, out, in]`` directly).
    """
    return _BatchedLinear.apply(h, w, b)


def max_pool2(h: torch.Tensor) -> torch.Tensor:
    """2x2 max pooling, stride 2 (even sizes; odd trailing rows/cols dropped).

    With autograd recording it is ``F.max_pool2d`` (gradient to the first maximum,
    as in PyTorch); without, the same maxima are taken from four strided slices,
    which is several times faster on CPU for these small feature maps.
    """
    if torch.is_grad_enabled() and h.requires_grad:
        return F.max_pool2d(h, 2)
    hh, ww = h.shape[-2] // 2 * 2, h.shape[-1] // 2 * 2
    h = h[..., :hh, :ww]
    return torch.maximum(
        torch.maximum(h[..., 0::2, 0::2], h[..., 0::2, 1::2]),
        torch.maximum(h[..., 1::2, 0::2], h[..., 1::2, 1::2]),
    )


def conv_pool_relu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, padding: int, groups: int = 1
) -> torch.Tensor:
    """``relu(max_pool2(conv2d(x, weight, bias)))``, computed as ``relu(max_pool2(conv2d(x, weight)) + bias)``.

    A per-channel constant commutes with the window maximum, ``max_k (h_k + b) = max_k h_k + b``,
    so the bias is added to a quarter of the elements, and its gradient is summed over a
    quarter of them, instead of inside the convolution (whose oneDNN backward reduces the bias
    gradient over the full-resolution map: measured ~30 ms of a 0.5 s CIFAR10-MNIST training step
    and ~2 ms of a 25 ms MultiMNIST one). In floating point the forward is unchanged (rounding is
    monotone); the pooled gradient can take another window position only where two different
    ``h_k`` round to the same ``h_k + b``. ``bias`` is ``[groups * out]`` (or ``[out]``).

    LeNet's first layer (one input channel per group, 3x3, padding 1, float32/float64 on the
    CPU) runs the compiled fused kernel of :mod:`fedhv.models.native` instead, which writes only
    the pooled map (channels last) and takes any input strides with contiguous rows.
    """
    if native.applies(x, weight, bias, padding, groups):
        return native.conv1_pool_relu(x, weight, bias)
    return _pool_bias_relu(F.conv2d(x, weight, None, padding=padding, groups=groups), bias)


def _pool_bias_relu(h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``relu(max_pool2(h) + bias)``; the bias in the map's dtype (bf16 under autocast, as a
    convolution's own bias would be)."""
    return F.relu(max_pool2(h) + bias.to(h.dtype).view(-1, 1, 1))


def conv_pool_relu_flat(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, padding: int, groups: int = 1
) -> torch.Tensor:
    """:func:`conv_pool_relu` per group, flattened: ``[groups, B, out * H' * W']``.

    Row ``b`` of group ``g`` is ``conv_pool_relu(x, ...)[b, g*out:(g+1)*out].flatten()`` in
    ``nn.Flatten``'s (channel, row, col) order: the input of the per-copy linear layer that
    follows a model's last convolution. Where the convolution's output is a channels-last CPU
    map, the compiled kernel (:func:`fedhv.models.native.pool_bias_relu_flat`) pools, adds the
    bias, applies the ReLU and writes this layout in one pass (and its backward writes the
    map's gradient without a zero-fill); otherwise PyTorch's ops and a reshape.
    """
    if native.applies(x, weight, bias, padding, groups):
        h = native.conv1_pool_relu(x, weight, bias)
    else:
        h = F.conv2d(x, weight, None, padding=padding, groups=groups)
        if native.pool_applies(h, bias, groups):
            return native.pool_bias_relu_flat(h, bias, groups)
        h = _pool_bias_relu(h, bias)
    return h.reshape(h.shape[0], groups, -1).transpose(0, 1)
