"""LeNet-style multi-task model for MultiMNIST and MNIST-FMNIST (paper B.3;
reference notes §2.1).

Encoder (input 1x28x28): conv 1->10 (3x3, pad 1) -> max-pool 2 -> ReLU ->
conv 10->15 (3x3) -> max-pool 2 -> ReLU -> flatten 540 -> linear 540->50 -> ReLU ->
dropout 0.5 (28,515 parameters). Head per task: linear 50->50 -> ReLU -> dropout 0.5
-> linear 50->10 -> log-softmax (3,060 parameters).

The biases of both convolutions are added after the pooling, in the module forward
and in :func:`batched_forward` alike (:func:`~fedhv.models.functional.conv_pool_relu`). On
the CPU (float32 / float64, no autocast) the first block is one compiled kernel and the
second block's pooling another, which writes the flattened features per copy
(:mod:`fedhv.models.native`); elsewhere PyTorch's layers compute the same function.

Dropout never draws its own random numbers: the caller passes keep-masks
(``{site: bool [B, features]}``) or ``None`` for evaluation, so that the batched and
the sequential engines apply identical masks.

:func:`batched_forward` evaluates ``C`` independent copies of the model (one per
client) in lockstep by folding the clients into the channel dimension: grouped
convolutions (``groups=C``) and batched matrix products.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedhv.models import native
from fedhv.models.base import MultiTaskModel
from fedhv.models.functional import bmm_linear, conv_pool_relu, conv_pool_relu_flat, masked_dropout

DROPOUT_P = 0.5
FEATURES = 50


class Head(nn.Module):
    """Task head: linear 50->50, ReLU, dropout, linear 50->C."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, FEATURES)
        self.fc2 = nn.Linear(FEATURES, classes)


class LeNetMTL(MultiTaskModel):
    """Shared LeNet encoder with one classification head per task.

    Parameters
    ----------
    num_classes : sequence of int
        Classes per task; ``m = len(num_classes)`` heads.
    """

    def __init__(self, num_classes: tuple[int, ...] = (10, 10), dropout: float = DROPOUT_P) -> None:
        super().__init__()
        self.dropout = dropout
        self.conv1 = nn.Conv2d(1, 10, 3, padding=1)
        self.conv2 = nn.Conv2d(10, 15, 3)
        self.fc = nn.Linear(540, FEATURES)
        self.heads = nn.ModuleList(Head(c) for c in num_classes)

    def dropout_sites(self) -> dict[str, int]:
        """Dropout sites and their feature sizes."""
        sites = {"encoder": FEATURES}
        sites.update({f"head{i}": FEATURES for i in range(len(self.heads))})
        return sites

    def encode(self, x: torch.Tensor, masks: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        h = conv_pool_relu(x, self.conv1.weight, self.conv1.bias, 1)
        h = conv_pool_relu_flat(h, self.conv2.weight, self.conv2.bias, 0)[0]
        h = F.relu(self.fc(h))
        return masked_dropout(h, None if masks is None else masks["encoder"], self.dropout)

    def forward(self, x: torch.Tensor, masks: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Per-task log-probabilities ``[B, C_i]`` for images ``x`` ``[B, 1, 28, 28]``."""
        z = self.encode(x, masks)
        out = []
        for i, head in enumerate(self.heads):
            assert isinstance(head, Head)
            h = F.relu(head.fc1(z))
            h = masked_dropout(h, None if masks is None else masks[f"head{i}"], self.dropout)
            out.append(F.log_softmax(head.fc2(h), dim=-1))
        return out

    def forward_batched(
        self, params: dict[str, torch.Tensor], x: torch.Tensor, masks: dict[str, torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """Evaluate ``C`` stacked parameter sets at once; see :func:`batched_forward`."""
        return batched_forward(self, params, x, masks)


def batched_forward(
    model: LeNetMTL,
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    masks: dict[str, torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Evaluate ``C`` parameter sets of ``model`` on ``C`` batches at once.

    Parameters
    ----------
    model : LeNetMTL
        Supplies the architecture (its own parameters are not used).
    params : dict
        ``{name: [C, *shape]}`` stacked parameters.
    x : Tensor ``[C, B, 1, 28, 28]``
    masks : dict or None
        ``{site: [C, B, features]}`` keep-masks, or ``None`` (no dropout).

    Returns
    -------
    list of Tensor ``[C, B, C_i]``
        Per-task log-probabilities.
    """
    c, b = x.shape[:2]
    h = x.transpose(0, 1).reshape(b, c * x.shape[2], *x.shape[3:])
    w1, b1 = params["conv1.weight"], params["conv1.bias"]
    w1, b1 = w1.reshape(-1, *w1.shape[2:]), b1.reshape(-1)
    if not native.applies(h, w1, b1, 1, c):  # the compiled kernel reads the planes where they are
        h = h.contiguous(memory_format=torch.channels_last)
    h = conv_pool_relu(h, w1, b1, 1, groups=c)
    w2, b2 = params["conv2.weight"], params["conv2.bias"]
    # [C, B, 540] in (channel, row, col) order as nn.Flatten does.
    h = conv_pool_relu_flat(h, w2.reshape(-1, *w2.shape[2:]), b2.reshape(-1), 0, groups=c)
    z = F.relu(bmm_linear(h, params["fc.weight"], params["fc.bias"]))
    z = masked_dropout(z, None if masks is None else masks["encoder"], model.dropout)
    out = []
    for i in range(len(model.heads)):
        p = f"heads.{i}."
        h = F.relu(bmm_linear(z, params[p + "fc1.weight"], params[p + "fc1.bias"]))
        h = masked_dropout(h, None if masks is None else masks[f"head{i}"], model.dropout)
        out.append(F.log_softmax(bmm_linear(h, params[p + "fc2.weight"], params[p + "fc2.bias"]), dim=-1))
    return out

