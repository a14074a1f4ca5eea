"""CNN for CIFAR10-MNIST (paper B.3; reference notes §2.2).

Encoder (3x32x32): conv 3->64 (3x3, pad 1) -> ReLU -> max-pool 2 -> conv 64->64
(3x3, pad 1) -> ReLU -> max-pool 2 -> flatten 4096 -> linear 4096->384 -> ReLU ->
dropout 0.5 -> linear 384->192 -> ReLU -> dropout 0.5 (1,685,888 parameters).
Head per task: linear 192->100 -> linear 100->10 with no non-linearity in between (as
in the reference code), then log-softmax (20,310 parameters).

Every ``ReLU -> max-pool 2`` is computed as ``max-pool 2 -> ReLU``: the two commute
exactly (ReLU is monotone), and so do their gradients (the pooled gradient goes to the
window's first maximum of ``h`` or of ``relu(h)``; where the two differ, every value of
the window is <= 0 and ReLU's gradient is 0 either way). The ReLU and its backward then
touch a quarter of the elements, and so does each convolution's bias, added after the
pooling (:func:`~fedhv.models.functional.conv_pool_relu`). Both the module forward and
:func:`cifar_batched_forward` run the convolutions through :func:`conv_features`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedhv.models.base import MultiTaskModel
from fedhv.models.functional import bmm_linear, conv_pool_relu, conv_pool_relu_flat, masked_dropout


def conv_features(
    x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor
) -> torch.Tensor:
    """The two convolution blocks of one copy: ``x [B, 3, 32, 32]`` -> flattened ``[B, 4096]``.

    ``x`` is copied into channels-last layout first: oneDNN's convolutions and their
    backward run faster on it (a sequential-engine step of 10 copies x 128: 0.81 s NCHW,
    0.47-0.54 s channels-last). The copy is a permute, not ``contiguous(memory_format=...)``,
    because ``torch.func.vmap`` cannot query memory formats. The flattening follows
    ``nn.Flatten``'s (channel, row, col) order.
    """
    h = x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    h = conv_pool_relu(h, w1, b1, 1)
    return conv_pool_relu_flat(h, w2, b2, 1)[0]


class CifarHead(nn.Module):
    """Factorised linear head 192 -> 100 -> C."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(192, 100)
        self.fc2 = nn.Linear(100, classes)


class CifarCNN(MultiTaskModel):
    """Shared two-convolution encoder with one factorised linear head per task."""

    def __init__(self, num_classes: tuple[int, ...] = (10, 10), dropout: float = 0.5) -> None:
        super().__init__()
        self.dropout = dropout
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1)
        self.conv2 = nn.Conv2d(64, 64, 3, padding=1)
        self.fc1 = nn.Linear(4096, 384)
        self.fc2 = nn.Linear(384, 192)
        self.heads = nn.ModuleList(CifarHead(c) for c in num_classes)

    def dropout_sites(self) -> dict[str, int]:
        return {"fc1": 384, "fc2": 192}

    def forward(self, x: torch.Tensor, masks: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        h = conv_features(x, self.conv1.weight, self.conv1.bias, self.conv2.weight, self.conv2.bias)
        h = masked_dropout(F.relu(self.fc1(h)), None if masks is None else masks["fc1"], self.dropout)
        z = masked_dropout(F.relu(self.fc2(h)), None if masks is None else masks["fc2"], self.dropout)
        out = []
        for head in self.heads:
            assert isinstance(head, CifarHead)
            out.append(F.log_softmax(head.fc2(head.fc1(z)), dim=-1))
        return out

    def forward_batched(
        self, params: dict[str, torch.Tensor], x: torch.Tensor, masks: dict[str, torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """``n`` stacked parameter sets at once; see :func:`cifar_batched_forward`."""
        return cifar_batched_forward(self, params, x, masks)


def cifar_batched_forward(
    model: CifarCNN, params: dict[str, torch.Tensor], x: torch.Tensor, masks: dict[str, torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """Evaluate ``n`` stacked parameter sets on ``n`` batches ``x [n, B, 3, 32, 32]``.

    Both convolutions run copy by copy in channels-last layout (with their pooling and
    ReLU), and the copies meet at the flattened features ``[n, B, 4096]``; the linear
    layers are batched matrix products. Per copy, oneDNN's 64-channel convolutions are
    as fast as one grouped convolution over the copies, and the copy loop saves the
    concatenation of the first layer's maps and the grouped backward's layout copies:
    a CIFAR10-MNIST training step (10 copies x 128) took 0.52 s against 0.64 s with
    ``conv2`` grouped (``docs/performance-history.md``, stop 15).
    """
    n = x.shape[0]
    w1, b1 = params["conv1.weight"], params["conv1.bias"]
    w2, b2 = params["conv2.weight"], params["conv2.bias"]
    h = torch.stack([conv_features(x[i], w1[i], b1[i], w2[i], b2[i]) for i in range(n)])  # [n, B, 4096]
    h = masked_dropout(F.relu(bmm_linear(h, params["fc1.weight"], params["fc1.bias"])),
              None if masks is None else masks["fc1"], model.dropout)
    z = masked_dropout(F.relu(bmm_linear(h, params["fc2.weight"], params["fc2.bias"])),
              None if masks is None else masks["fc2"], model.dropout)
    out = []
    for i in range(len(model.heads)):
        p = f"heads.{i}."
        hh = bmm_linear(z, params[p + "fc1.weight"], params[p + "fc1.bias"])
        out.append(F.log_softmax(bmm_linear(hh, params[p + "fc2.weight"], params[p + "fc2.bias"]), dim=-1))
    return out

