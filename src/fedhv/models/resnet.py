"""ResNet-18 with GroupNorm for CelebA5 (paper B.3; reference notes §2.3).

CIFAR-style stem (3x3 conv 3->64, stride 1, no bias, GroupNorm(2), ReLU, no max-pool);
BasicBlock stages [2, 2, 2, 2] with widths 64/128/256/512 and strides 1/2/2/2, every
normalisation GroupNorm with 2 groups, 1x1 conv + GroupNorm shortcuts when the shape
changes; then ``avg_pool2d(kernel 3)`` of the final 512x4x4 map, which (stride 3)
averages only its top-left 3x3 window, as in the reference code; 11,168,832 encoder
parameters. Head per task: linear 512 -> 8, sigmoid. The model has no dropout.

:meth:`ResNet18GN.forward_batched` evaluates ``n`` parameter copies at once for the
batched engine (:func:`resnet_batched_forward`, with the folded layers of
:mod:`fedhv.models.resnet_batched`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedhv.models.base import MultiTaskModel
from fedhv.models.functional import bmm_linear
from fedhv.models.resnet_batched import NCHW_FROM_STAGE, grouped_conv, grouped_norm

GROUPS = 2


class BasicBlock(nn.Module):
    """conv3x3-GN-ReLU-conv3x3-GN plus shortcut, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.gn1 = nn.GroupNorm(GROUPS, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.gn2 = nn.GroupNorm(GROUPS, cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(GROUPS, cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.gn1(self.conv1(x)))
        h = self.gn2(self.conv2(h))
        return F.relu(h + self.shortcut(x))


class SigmoidHead(nn.Module):
    """Linear 512 -> k, sigmoid."""

    def __init__(self, outputs: int) -> None:
        super().__init__()
        self.fc = nn.Linear(512, outputs)


class ResNet18GN(MultiTaskModel):
    """ResNet-18 (GroupNorm) encoder with one multi-label sigmoid head per task.

    Parameters
    ----------
    outputs : tuple of int
        Attributes per task (CelebA5: five groups of eight).
    """

    def __init__(self, outputs: tuple[int, ...] = (8, 8, 8, 8, 8)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.gn1 = nn.GroupNorm(GROUPS, 64)
        layers = []
        cin = 64
        for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(cin, width, stride), BasicBlock(width, width, 1)))
            cin = width
        self.layers = nn.Sequential(*layers)
        self.heads = nn.ModuleList(SigmoidHead(k) for k in outputs)

    def forward(self, x: torch.Tensor, masks: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        h = self.layers(F.relu(self.gn1(self.conv1(x))))
        z = F.avg_pool2d(h, 3).flatten(1)
        out = []
        for head in self.heads:
            assert isinstance(head, SigmoidHead)
            out.append(torch.sigmoid(head.fc(z)))
        return out

    def forward_batched(
        self, params: dict[str, torch.Tensor], x: torch.Tensor, masks: dict[str, torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """``n`` stacked parameter sets on ``x [n, B, 3, H, W]`` at once (copies folded into
        channels: grouped convolutions, GroupNorm with ``2n`` groups, ``bmm`` heads); see
        :func:`resnet_batched_forward`."""
        return resnet_batched_forward(self, params, x, masks)


def resnet_batched_forward(
    model: ResNet18GN,
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    masks: dict[str, torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Evaluate ``n`` stacked parameter sets of ``model`` on ``n`` batches at once.

    Parameters
    ----------
    model : ResNet18GN
        Supplies the architecture (its own parameters are not used).
    params : dict
        ``{name: [n, *shape]}`` stacked parameters (``model.named_parameters()`` names).
    x : Tensor ``[n, B, 3, H, W]``
        Copy ``i``'s batch is ``x[i]``.
    masks : dict or None
        Unused (the model has no dropout); accepted for the common signature.

    Returns
    -------
    list of Tensor ``[n, B, k_t]``
        Per-task sigmoid outputs; row ``i`` equals ``forward(x[i])`` with copy ``i``'s
        parameters.
    """
    n, b = x.shape[:2]
    w1 = params["conv1.weight"]
    # Stem: copy by copy in channels_last (3 input channels), concatenated along channels.
    h = torch.cat([F.conv2d(x[i].contiguous(memory_format=torch.channels_last), w1[i], padding=1)
                   for i in range(n)], 1)
    # In-place ReLUs: GroupNorm's backward needs its input, not its output, and the sum
    # of the residual add is saved by nothing, so neither is needed after the ReLU.
    h = grouped_norm(h, params["gn1.weight"], params["gn1.bias"], GROUPS).relu_()
    for s, stage in enumerate(model.layers):
        assert isinstance(stage, nn.Sequential)
        if s == NCHW_FROM_STAGE:
            h = h.contiguous()
        for j, block in enumerate(stage):
            assert isinstance(block, BasicBlock)
            p = f"layers.{s}.{j}."
            stride = block.conv1.stride[0]
            o = grouped_conv(h, params[p + "conv1.weight"], stride, 1)
            o = grouped_norm(o, params[p + "gn1.weight"], params[p + "gn1.bias"], GROUPS).relu_()
            o = grouped_norm(grouped_conv(o, params[p + "conv2.weight"], 1, 1),
                             params[p + "gn2.weight"], params[p + "gn2.bias"], GROUPS)
            if len(block.shortcut):
                h = grouped_norm(grouped_conv(h, params[p + "shortcut.0.weight"], stride, 0),
                                 params[p + "shortcut.1.weight"], params[p + "shortcut.1.bias"], GROUPS)
            h = (o + h).relu_()
    # avg_pool2d(3) keeps the top-left 3x3 window of the 4x4 map, as ResNet18GN.forward.
    z = F.avg_pool2d(h, 3).reshape(b, n, -1).transpose(0, 1)  # [n, B, 512]
    return [torch.sigmoid(bmm_linear(z, params[f"heads.{t}.fc.weight"], params[f"heads.{t}.fc.bias"]))
            for t in range(len(model.heads))]
