"""ResNet-18-GN's fused forward over model copies equals the per-copy model (issue 13).

``ResNet18GN.forward_batched`` folds ``n`` copies into the channel dimension (grouped
convolutions, GroupNorm with ``2n`` groups, ``bmm`` heads); in float64 it must equal
``functional_call`` of each copy to rounding, outputs and gradients, and the batched
engine built on it must train exactly as the sequential engine.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call
from torch.overrides import TorchFunctionMode

from fedhv.algorithms import FedHVAlgorithm
from fedhv.data.federated import FederatedData
from fedhv.models import ResNet18GN, default_init, get_flat
from fedhv.models.params import ParamLayout
from fedhv.objectives import MultiLabel
from fedhv.rng import torch_generator
from fedhv.sim.batched import BatchedEngine
from fedhv.sim.engine import SequentialEngine
from fedhv.sim.federation import SimFederation

GROUPS = ((0, 1, 2, 3, 4, 5, 6, 7), (8, 9, 10, 11, 12, 13, 14, 15))


class GroupNormCalls(TorchFunctionMode):
    """Records the ``num_groups`` of every ``F.group_norm`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: set[int] = set()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.group_norm:
            self.groups.add(int(args[1] if len(args) > 1 else kwargs["num_groups"]))
        return func(*args, **kwargs)


def _model() -> ResNet18GN:
    model = ResNet18GN((8, 8))
    default_init(model, torch_generator(0, "init"))
    return model.double()


def test_forward_batched_equals_each_copy_outputs_and_gradients() -> None:
    """n = 3 copies with different weights and different GroupNorm affine parameters
    (a GroupNorm that pooled the copies' channels, or mixed up their affine rows, fails).
    24x24 inputs (the last stage's map is 3x3, which ``avg_pool2d(3)`` covers) keep it fast."""
    model = _model()
    layout = ParamLayout.of(model)
    g = torch.Generator().manual_seed(0)
    theta = get_flat(model)
    n, b = 3, 2
    # Per-copy noise with a period (4099, prime) unrelated to any kernel shape: drawing
    # 3 x 11M normals would dominate the test's time.
    noise = torch.randn(n, 4099, generator=g, dtype=torch.float64).repeat(1, theta.numel() // 4099 + 1)
    stacked = theta + 0.05 * theta.abs().mean() * noise[:, :theta.numel()]
    for name, shape, lo in zip(layout.names, layout.shapes, layout.offsets):
        if len(shape) == 1 and not name.startswith("heads."):  # GroupNorm affine: random, per copy
            stacked[:, lo:lo + shape[0]] = torch.randn(n, shape[0], generator=g, dtype=torch.float64)
    x = torch.randn(n, b, 3, 24, 24, generator=g, dtype=torch.float64)
    cot = [torch.randn(n, b, 8, generator=g, dtype=torch.float64) for _ in range(2)]

    p = stacked.clone().requires_grad_(True)
    outs = model.forward_batched(layout.views(p), x, None)
    (grad,) = torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs, cot)), p)

    for i in range(n):
        pi = stacked[i].clone().requires_grad_(True)
        ref = functional_call(model, layout.views(pi), (x[i], None))
        (gi,) = torch.autograd.grad(sum((o * c[i]).sum() for o, c in zip(ref, cot)), pi)
        for o, r in zip(outs, ref):
            assert (o[i] - r).abs().max().item() < 1e-12
        assert (grad[i] - gi).abs().max().item() < 1e-12 * max(1.0, gi.abs().max().item())
        assert gi.abs().max().item() > 1e-3


def test_batched_engine_equals_sequential_on_resnet_float64() -> None:
    """One FedHV round, 2 clients, 2 local steps with momentum 0.9, batch 4 (CelebA-like
    multi-label data): the fused batched engine and the sequential one agree to 1e-10."""
    g = torch.Generator().manual_seed(1)
    clients, per_client = 4, 8
    n = clients * per_client
    data = FederatedData(
        task_names=("a", "b"), num_classes=(8, 8),
        train_x=torch.randn(n, 3, 24, 24, generator=g, dtype=torch.float64) * 0.25,
        train_y=(torch.rand(n, 16, generator=g) < 0.3).long(),
        parts=torch.randperm(n, generator=g).view(clients, per_client),
        eval_sets={}, augment=None, objective=MultiLabel(GROUPS),
    )
    theta0 = get_flat(_model()).clone()
    thetas, groups = {}, {}
    for name, cls in (("batched", BatchedEngine), ("sequential", SequentialEngine)):
        engine = cls(_model(), data, local_steps=2, batch_size=4, lr_local=0.3, momentum=0.9, seed=0)
        alg = FedHVAlgorithm(np.array([2.6, 2.6]), lr_global=1.0)
        with GroupNormCalls() as calls:
            res = alg.round(alg.init_state(2), theta0.clone(), SimFederation(engine, np.array([0, 2]), 0))
        thetas[name], groups[name] = res.theta, calls.groups
    assert (thetas["batched"] - thetas["sequential"]).abs().max().item() < 1e-10
    # The batched engine trains the 2 copies folded (GroupNorm over 2 x 2 groups), not via vmap.
    assert groups["batched"] == {2, 4} and groups["sequential"] == {2}
    assert (thetas["batched"] - theta0).abs().max().item() > 1e-3
