"""HVWeighting / reference_from_losses under dtypes and inputs of real training loops (issue 14, item 5).

Golden values by hand: ``w_i = s_i^{-1} / sum_j s_j^{-1}`` with ``s_i = max(r_i - l_i, rho)``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedhv.errors import FedHVError
from fedhv.weighting import HVBackward, HVWeighting, reference_from_losses


def test_float16_losses_at_the_floor_give_finite_weights() -> None:
    # r = [1, 3], l = [1.5, 1]: s = [max(-0.5, 1e-6), 2] -> 1/s = [1e6, 0.5] (1e6 overflows float16)
    w = HVWeighting([1.0, 3.0])(torch.tensor([1.5, 1.0], dtype=torch.float16))
    assert w.dtype == torch.float16 and bool(torch.isfinite(w).all())
    expected = [1e6 / (1e6 + 0.5), 0.5 / (1e6 + 0.5)]  # [1 - 5e-7, 5e-7]
    assert w.double().tolist() == pytest.approx(expected, abs=1e-6)


def test_integer_losses_do_not_truncate_the_reference() -> None:
    # r = [2.45, 1.05], l = [1, 1]: s = [1.45, 0.05] -> 1/s = [1/1.45, 20] -> w = [1/30, 29/30]
    w = HVWeighting([2.45, 1.05])(torch.tensor([1, 1]))
    assert w.is_floating_point()
    assert w.tolist() == pytest.approx([1 / 30, 29 / 30], abs=1e-6)


def test_casting_a_model_that_holds_the_weighting_keeps_the_reference_exact() -> None:
    model = nn.Sequential(nn.Linear(2, 2), HVWeighting([2.45, 1.05])).half()
    hv = model[1]
    assert hv.reference.dtype == torch.float64 and hv.reference.tolist() == [2.45, 1.05]
    assert model[0].weight.dtype == torch.float16  # the rest of the model was cast
    w = hv(torch.tensor([1.0, 1.0], dtype=torch.float64))
    assert w.tolist() == pytest.approx([1 / 30, 29 / 30], abs=1e-12)
    # state_dict round trip keeps float64 too
    fresh = HVWeighting([0.0, 0.0])
    fresh.load_state_dict(hv.state_dict())
    assert fresh.reference.tolist() == [2.45, 1.05]


def test_rho_clip_must_be_finite_and_is_passed_through_by_hvbackward() -> None:
    # rho = inf floors every slack at inf: 1/s = 0 and w = 0/0 = NaN; refuse it
    for make in (HVWeighting, HVBackward):
        with pytest.raises(FedHVError, match="rho_clip = inf must be finite"):
            make([1.0, 2.0], rho_clip=float("inf"))
    # r = [1, 3], l = [1.5, 1], rho = 0.5: s = [0.5, 2] -> w = [0.8, 0.2]; dL/dp = 0.8 * 1.5 + 0.2 * 1
    p = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    w = HVBackward([1.0, 3.0], rho_clip=0.5).backward([1.5 * p, p])
    np.testing.assert_allclose(w, [0.8, 0.2], atol=1e-15)
    assert abs(float(p.grad) - 1.4) < 1e-14  # type: ignore[arg-type]


def test_reference_from_the_losses_of_a_training_step() -> None:
    x = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    losses = [2 * x, x + 1.0]  # [1.0, 1.5], both require grad
    assert reference_from_losses(losses, margin=0.15) == pytest.approx([1.15, 1.65], abs=1e-12)
    assert reference_from_losses(torch.stack(losses), margin=0.0) == pytest.approx([1.0, 1.5], abs=1e-12)
    with pytest.raises(FedHVError, match="margin = inf"):
        reference_from_losses([1.0, 2.0], margin=float("inf"))
    with pytest.raises(FedHVError, match="losses = "):
        reference_from_losses([[1.0, 2.0], [1.0]])
