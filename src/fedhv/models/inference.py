"""Fast inference forwards (no autograd, no dropout) for the built-in CNNs on the CPU.

Objective reports (every sampled client's losses at the broadcast ``theta^t``) and test
evaluation are pure inference passes of one model over many samples. The models' own
``forward`` runs them with dense NCHW tensors: oneDNN convolves each layer into its
blocked ``nChw16c`` layout and reorders back to NCHW, and the 2x2 max-pool of a 10-channel
LeNet map is four strided slices (:func:`fedhv.models.functional.max_pool2`). Here the encoder
stays in oneDNN's blocked layout (``Tensor.to_mkldnn``) from the first convolution to the
last pooling: ``torch.mkldnn_convolution`` -> ``max_pool2d`` -> in-place ReLU, one reorder
in and one out, in chunks of :data:`CHUNK` samples so the widest activation stays in the
core's L2 cache. The linear layers and heads are the model's own modules.

LeNet whose first layer runs the compiled kernel (:mod:`fedhv.models.native`) needs none
of this: that kernel writes only the pooled map, channels last, and the module's own
forward is then the fastest, in chunks of :data:`NATIVE_CHUNK`. The oneDNN path serves the
CIFAR CNN, and LeNet where the kernel is unavailable or disabled.

The maths is the model's: for a 2x2 max-pool, ``relu(pool(h)) = pool(relu(h))`` exactly
(ReLU is monotone), so the ReLU runs after the pooling on a quarter of the elements;
the convolutions are the same oneDNN kernels, so the outputs agree with ``model(x)`` to
float32 round-off (bit for bit on the machine this was measured on; tested to ``1e-5``).

:func:`inference_forward` returns the fast forward only where it applies: a
:class:`~fedhv.models.lenet.LeNetMTL` or :class:`~fedhv.models.cifar_cnn.CifarCNN`
whose ``forward`` is not overridden, float32 parameters and inputs on the CPU, and the
compiled kernels (LeNet) or oneDNN available and enabled. Everything else (float64 runs,
bf16 autocast wrappers, GPUs, other models) keeps ``model(x)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedhv.models import native
from fedhv.models.cifar_cnn import CifarCNN, CifarHead
from fedhv.models.lenet import Head, LeNetMTL

#: Samples per oneDNN pass of LeNet (first-layer output 512 x 10 x 28 x 28 floats = 16 MiB);
#: 256-1024 were within 5 % of each other with 2 threads on this project's CPU, 128 and
#: 2,500 slower (docs/performance-history.md, "Report pass and evaluation").
CHUNK = 512
#: Samples per pass of LeNet's own forward where it runs the compiled kernels
#: (:mod:`fedhv.models.native`; then that forward is the fast one). 10,000 MultiMNIST test
#: samples, 2 threads, median of 8: 53.6 ms at 1,024 and 1,536, 60.7 ms at 512, 54.1 ms at
#: 2,500; the oneDNN path below took 72 ms.
NATIVE_CHUNK = 1024
#: The same for the CIFAR CNN (first-layer output 64 x 32 x 32 floats a sample; 256 was
#: the fastest of 32-256, 3.9x the plain forward's 2,500-sample batches).
CIFAR_CHUNK = 256

Forward = Callable[[torch.Tensor], list[torch.Tensor]]

_STATE = {"enabled": True}


def plain_forward() -> contextlib.AbstractContextManager[None]:
    """Within the block :func:`inference_forward` returns ``None``: every pass runs ``model(x)``.

    For timing (``perf/round_time.py`` times both paths in one process) and for
    FLOP counting (``torch.utils.flop_counter`` counts ``aten.convolution``, not oneDNN's
    ``mkldnn_convolution``).
    """
    return native.switched_off(_STATE)


def _conv_pool_relu(h: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """oneDNN (blocked-layout) tensor ``h`` -> ``relu(max_pool2d(conv(h), 2))``, still blocked."""
    pad = conv.padding
    assert isinstance(pad, tuple)
    h = torch.mkldnn_convolution(h, conv.weight, conv.bias, list(pad), list(conv.stride), list(conv.dilation),
                                 conv.groups)
    return torch.relu_(F.max_pool2d(h, 2))


def _lenet(model: LeNetMTL, x: torch.Tensor) -> list[torch.Tensor]:
    """:meth:`LeNetMTL.forward` without dropout, encoder in oneDNN's layout."""
    h = _conv_pool_relu(_conv_pool_relu(x.contiguous().to_mkldnn(), model.conv1), model.conv2)
    z = F.relu(model.fc(h.to_dense().flatten(1)))
    out = []
    for head in model.heads:
        assert isinstance(head, Head)
        out.append(F.log_softmax(head.fc2(F.relu(head.fc1(z))), dim=-1))
    return out


def _cifar(model: CifarCNN, x: torch.Tensor) -> list[torch.Tensor]:
    """:meth:`CifarCNN.forward` without dropout, encoder in oneDNN's layout."""
    h = _conv_pool_relu(_conv_pool_relu(x.contiguous().to_mkldnn(), model.conv1), model.conv2)
    z = F.relu(model.fc2(F.relu(model.fc1(h.to_dense().flatten(1)))))
    out = []
    for head in model.heads:
        assert isinstance(head, CifarHead)
        out.append(F.log_softmax(head.fc2(head.fc1(z)), dim=-1))
    return out


def inference_forward(model: nn.Module, x: torch.Tensor) -> tuple[Forward, int] | None:
    """The fast eval forward of ``model`` for inputs like ``x`` and the chunk to call it with, or ``None``.

    The forward maps a chunk ``[b, C, H, W]`` (best ``b`` <= the returned chunk size) to
    the per-task outputs ``[b, C_i]`` that ``model(chunk)`` returns.

    ``None`` means: use ``model(x)`` (not a built-in CNN, a subclass with its own
    ``forward``, not float32, not on the CPU, oneDNN unavailable / disabled with
    ``torch.backends.mkldnn.flags(enabled=False)``, or inside :func:`plain_forward`). The fast forward applies no dropout
    whatever the module's mode, as ``model(x)`` without masks does.
    """
    if not _STATE["enabled"] or x.device.type != "cpu" or x.dtype != torch.float32 or x.ndim != 4:
        return None
    first = next(model.parameters(), None)
    if first is None or first.dtype != torch.float32 or first.device.type != "cpu":
        return None
    lenet = type(model).forward is LeNetMTL.forward and isinstance(model, LeNetMTL)
    if lenet and native.enabled() and native.available():
        return model, NATIVE_CHUNK
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return None
    if lenet:
        return (lambda xb: _lenet(model, xb)), CHUNK
    if type(model).forward is CifarCNN.forward and isinstance(model, CifarCNN):
        return (lambda xb: _cifar(model, xb)), CIFAR_CHUNK
    return None
