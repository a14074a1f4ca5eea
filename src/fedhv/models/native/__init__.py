r"""fedhv's compiled CPU kernels for the CNNs' convolution blocks (built at first use).

**conv1**: LeNet's first layer fused, a 3x3 convolution with one input channel per group
(padding 1), 2x2 max-pool, bias and ReLU. For group ``c`` (a model copy in the batched engine;
``c = 0`` only in the module forward), output channel ``k`` and pooled position ``(i, j)``:

.. math::

    y_{b,ck,i,j} = \max\Big(0,\; b_{ck} + \max_{(d,e)\in\{0,1\}^2}
        \sum_{u,v=0}^{2} w_{ck,u,v}\, \tilde x_{b,c,2i+d+u,\,2j+e+v}\Big),

``x~`` the input zero-padded by one pixel: :func:`fedhv.models.functional.conv_pool_relu`'s
function. A recording forward also writes, per output, the window position of the first
maximum (PyTorch's ``max_pool2d`` convention) or "inactive" where ``y <= 0``; the backward,
for an upstream gradient ``g``, is

.. math::

    \frac{\partial L}{\partial w_{ck,u,v}} = \sum_{b,i,j} g_{b,ck,i,j}\,[y_{b,ck,i,j} > 0]\,
        \tilde x_{b,c,2i+d^*+u,\,2j+e^*+v}, \qquad
    \frac{\partial L}{\partial b_{ck}} = \sum_{b,i,j} g_{b,ck,i,j}\,[y_{b,ck,i,j} > 0],

``(d*, e*)`` the stored window position; the input gets no gradient (it is data). oneDNN
materialises the 28 x 28 map (10 channels a sample) only to pool three quarters of it away:
its forward, the pooling, the pooling's zero-filled backward scatter and the ReLU backward
were most of a MultiMNIST training step. The kernel keeps a pooled position in registers and
writes only the pooled map, channels last, which the next convolution reads as is
(``conv1.cpp``: lanes are a group's ``K <= 16`` channels when recording; without autograd the
lanes are 16 pooled columns, which keeps 14 of 16 lanes busy on a 28-pixel row).

**pool**: ``relu(max_pool2(h) + b)`` of a channels-last map ``h [B, G*K, H, W]`` (the output of
a model's last convolution), written per group and flattened, ``[G, B, K*H/2*W/2]`` in
``nn.Flatten``'s order: the input of the per-copy linear layer, without the reshape copy. Its
backward writes every element of ``dL/dh`` (the window maximum gets the gradient, the others
0), so no zero-fill precedes it (``pool.cpp``).

**Build.** The C++ sources (``common.h``, ``conv1.cpp``, ``pool.cpp``; plain C ABI, no torch
headers) are compiled with the system's C++ compiler (``$CXX`` or ``c++``; ``-O3
-march=native -fopenmp``, about 2 s) into ``$FEDHV_CACHE/kernels`` (else
``~/.cache/fedhv/kernels``; a private temporary directory where that is read-only), keyed by
the sources, the flags, the compiler's version and the CPU's feature flags, and loaded with
:mod:`ctypes` (:mod:`fedhv.models.native.build`). Their threads are PyTorch's OpenMP threads
(``torch.get_num_threads()``). Where no compiler is found, one warning is issued and every
call takes the PyTorch path, as it does for GPU and meta tensors, float16/bf16, autocast,
``torch.func`` transforms, inputs that require a gradient (conv1), with ``FEDHV_NATIVE=0`` in
the environment, and inside :func:`disabled`.

**Numerics.** Same functions as the PyTorch path: forward values equal to round-off (in
practice bit for bit on the machines measured), weight and bias gradients summed in another
order (``tests/unit/models/test_native.py`` compares both with the paper-order layer in float64). Sums
over samples run in fixed blocks added in order, so results do not depend on the thread count.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

import torch

from fedhv.models.native.build import load_library, native_switch

_STATE: dict[str, object] = {"enabled": native_switch(os.environ.get("FEDHV_NATIVE"))}
_DTYPES = {torch.float32: "f32", torch.float64: "f64"}
#: Window codes (0..3, or -1 where the ReLU is inactive) as wide as the values (conv1.cpp).
_CODES = {torch.float32: torch.int32, torch.float64: torch.int64}
_LANES = 16
#: Kernel calls in this process (benchmarks tell from it whether a model uses the kernel).
CALLS = {"forward": 0, "backward": 0, "pool_forward": 0, "pool_backward": 0}


@contextlib.contextmanager
def switched_off(state: dict[str, object]) -> Iterator[None]:
    """``state["enabled"] = False`` within the block, restored after it (also on errors)."""
    before = state["enabled"]
    state["enabled"] = False
    try:
        yield
    finally:
        state["enabled"] = before


def disabled() -> contextlib.AbstractContextManager[None]:
    """Within the block every call takes the PyTorch path (benchmarks time both in one process)."""
    return switched_off(_STATE)


def enabled() -> bool:
    """Whether calls may take the kernel (not inside :func:`disabled`, no ``FEDHV_NATIVE=0``)."""
    return bool(_STATE["enabled"])


def available() -> bool:
    """Whether the compiled kernel is loaded (builds it on the first call)."""
    return load_library() is not None


def applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, padding: int, groups: int) -> bool:
    """Whether :func:`conv1_pool_relu` can run this ``conv_pool_relu`` call.

    It can for CPU float32/float64 tensors outside autocast and ``torch.func``, a 3x3 kernel with one
    input channel per group and ``K <= 16`` output channels per group, padding 1, even ``H``, ``W``,
    rows of each plane contiguous, an input without gradient, and the kernel built.
    """
    if not _STATE["enabled"] or x.dtype not in _DTYPES or x.device.type != "cpu" or x.requires_grad:
        return False
    if weight.dtype != x.dtype or bias.dtype != x.dtype or weight.device.type != "cpu" or bias.device.type != "cpu":
        return False
    if x.ndim != 4 or weight.ndim != 4 or tuple(weight.shape[1:]) != (1, 3, 3) or padding != 1:
        return False
    c, h, w = x.shape[1:]
    if c != groups or weight.shape[0] % groups or weight.shape[0] // groups > _LANES or h % 2 or w % 2:
        return False
    if bias.shape != (weight.shape[0],) or x.stride(3) != 1 or x.stride(2) != w:
        return False
    if torch.is_autocast_enabled("cpu") or any(
        torch._C._functorch.is_functorch_wrapped_tensor(t) for t in (x, weight, bias)  # type: ignore[attr-defined]
    ):
        return False
    return available()


def _codes_only_forward(ctx, codes: torch.Tensor | None) -> None:  # type: ignore[no-untyped-def]
    """The window codes (a kernel's second output) take no gradient, and none is materialised."""
    if codes is not None:
        ctx.mark_non_differentiable(codes)
    ctx.set_materialize_grads(False)


def _ptr(t: torch.Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(None if t is None else t.data_ptr())


def _dims(x: torch.Tensor, out_per_group: int) -> list[ctypes.c_int64 | ctypes.c_int]:
    b, c, h, w = x.shape
    return [ctypes.c_int64(v) for v in (b, c, h, w, out_per_group)] + [ctypes.c_int(torch.get_num_threads())]


class _Conv1PoolReLU(torch.autograd.Function):
    """Autograd wrapper of the compiled kernel; see the module docstring for the maths."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, record: bool):  # type: ignore[override]
        lib = load_library()
        assert lib is not None
        CALLS["forward"] += 1
        b, c, h, w = x.shape
        k = weight.shape[0] // c
        # [B, H/2, W/2, C*K] storage seen as [B, C*K, H/2, W/2]: a channels-last tensor.
        y = torch.empty((b, h // 2, w // 2, c * k), dtype=x.dtype).permute(0, 3, 1, 2)
        idx = torch.empty((b, h // 2, w // 2, c * k), dtype=_CODES[x.dtype]) if record else None
        wc, bc = weight.detach().contiguous(), bias.detach().contiguous()
        fn = getattr(lib, f"fedhv_conv1_forward_{_DTYPES[x.dtype]}")
        fn(_ptr(x), ctypes.c_int64(x.stride(0)), ctypes.c_int64(x.stride(1)), _ptr(wc), _ptr(bc), _ptr(y), _ptr(idx),
           *_dims(x, k))
        return y, idx

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def,override]
        x, weight, _bias, _record = inputs
        idx = output[1]
        _codes_only_forward(ctx, idx)
        ctx.k = weight.shape[0] // x.shape[1]
        ctx.save_for_backward(x, idx)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: torch.Tensor, _gidx: torch.Tensor | None):  # type: ignore[no-untyped-def,override]
        if g is None:  # y does not reach the loss (grads are not materialised: see setup_context)
            return None, None, None, None
        lib = load_library()
        assert lib is not None
        CALLS["backward"] += 1
        x, idx = ctx.saved_tensors
        _need_x, need_w, need_b, _ = ctx.needs_input_grad
        g = g.permute(0, 2, 3, 1).contiguous()  # [B, H/2, W/2, C*K]; a view where g is channels last
        gw = torch.empty((x.shape[1] * ctx.k, 1, 3, 3), dtype=x.dtype)
        gb = torch.empty(x.shape[1] * ctx.k, dtype=x.dtype)
        fn = getattr(lib, f"fedhv_conv1_backward_{_DTYPES[x.dtype]}")
        fn(_ptr(x), ctypes.c_int64(x.stride(0)), ctypes.c_int64(x.stride(1)), _ptr(g), _ptr(idx), _ptr(gw), _ptr(gb),
           *_dims(x, ctx.k))
        return None, gw if need_w else None, gb if need_b else None, None


def pool_applies(h: torch.Tensor, bias: torch.Tensor, groups: int) -> bool:
    """Whether :func:`pool_bias_relu_flat` can run on the map ``h``.

    It can for a channels-last CPU float32/float64 map ``[B, G*K, H, W]`` with even ``H``, ``W``
    and a matching ``bias [G*K]``, outside autocast and ``torch.func``, the kernel built.
    """
    if not _STATE["enabled"] or h.dtype not in _DTYPES or h.device.type != "cpu" or h.ndim != 4:
        return False
    if bias.dtype != h.dtype or bias.device.type != "cpu" or bias.shape != (h.shape[1],) or h.shape[1] % groups:
        return False
    if h.shape[2] % 2 or h.shape[3] % 2 or not h.permute(0, 2, 3, 1).is_contiguous():
        return False
    if torch.is_autocast_enabled("cpu") or any(
        torch._C._functorch.is_functorch_wrapped_tensor(t) for t in (h, bias)  # type: ignore[attr-defined]
    ):
        return False
    return available()


class _PoolBiasReLU(torch.autograd.Function):
    """``relu(max_pool2(h) + bias)`` of a channels-last map, written as ``[G, B, K*H/2*W/2]``."""

    @staticmethod
    def forward(h: torch.Tensor, bias: torch.Tensor, groups: int, record: bool):  # type: ignore[override]
        lib = load_library()
        assert lib is not None
        CALLS["pool_forward"] += 1
        b, gk, hh, ww = h.shape
        k = gk // groups
        out = torch.empty((groups, b, k * (hh // 2) * (ww // 2)), dtype=h.dtype)
        idx = torch.empty((b, hh // 2, ww // 2, gk), dtype=_CODES[h.dtype]) if record else None
        getattr(lib, f"fedhv_pool_forward_{_DTYPES[h.dtype]}")(
            _ptr(h), _ptr(bias.detach().contiguous()), _ptr(out), _ptr(idx),
            *[ctypes.c_int64(v) for v in (b, groups, k, hh, ww)], ctypes.c_int(torch.get_num_threads()))
        return out, idx

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def,override]
        h, _bias, groups, _record = inputs
        idx = output[1]
        _codes_only_forward(ctx, idx)
        ctx.shape, ctx.groups = tuple(h.shape), groups
        ctx.save_for_backward(idx)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: torch.Tensor | None, _gidx: torch.Tensor | None):  # type: ignore[no-untyped-def,override]
        if g is None:
            return None, None, None, None
        lib = load_library()
        assert lib is not None
        CALLS["pool_backward"] += 1
        (idx,) = ctx.saved_tensors
        b, gk, hh, ww = ctx.shape
        g = g.contiguous()
        gh = torch.empty((b, hh, ww, gk), dtype=g.dtype)  # every element is written
        gb = torch.empty(gk, dtype=g.dtype) if ctx.needs_input_grad[1] else None
        getattr(lib, f"fedhv_pool_backward_{_DTYPES[g.dtype]}")(
            _ptr(g), _ptr(idx), _ptr(gh), _ptr(gb),
            *[ctypes.c_int64(v) for v in (b, ctx.groups, gk // ctx.groups, hh, ww)],
            ctypes.c_int(torch.get_num_threads()))
        return gh.permute(0, 3, 1, 2), gb, None, None


def pool_bias_relu_flat(h: torch.Tensor, bias: torch.Tensor, groups: int) -> torch.Tensor:
    """``relu(max_pool2(h) + bias)`` per group, flattened: ``[G, B, K * H/2 * W/2]``.

    Parameters
    ----------
    h : Tensor ``[B, G * K, H, W]``, channels last
    bias : Tensor ``[G * K]``
    groups : int

    Returns
    -------
    Tensor ``[G, B, K * H/2 * W/2]`` (contiguous; features in ``nn.Flatten``'s (channel, row,
    col) order), the gradient flowing to ``h`` and ``bias``. Call only where :func:`pool_applies`.
    """
    record = torch.is_grad_enabled() and (h.requires_grad or bias.requires_grad)
    out, _idx = _PoolBiasReLU.apply(h, bias, groups, record)
    return out


def conv1_pool_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``relu(max_pool2(conv2d(x, weight, padding=1, groups=C)) + bias)`` by the compiled kernel.

    Parameters
    ----------
    x : Tensor ``[B, C, H, W]``
        One input plane per group ``C``; any strides with contiguous rows (no copy is made).
    weight : Tensor ``[C * K, 1, 3, 3]``
    bias : Tensor ``[C * K]``

    Returns
    -------
    Tensor ``[B, C * K, H / 2, W / 2]``, channels last. Call only where :func:`applies`.
    """
    record = torch.is_grad_enabled() and (weight.requires_grad or bias.requires_grad)
    y, _idx = _Conv1PoolReLU.apply(x, weight, bias, record)
    return y
