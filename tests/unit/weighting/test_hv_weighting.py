"""HVWeighting / HVBackward / reference_from_losses: hand-computed golden values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhv.errors import FedHVError
from fedhv.weighting import HVBackward, HVWeighting, reference_from_losses


def test_weights_golden_values_and_floor() -> None:
    # r - l = [2, 1] -> 1/s = [0.5, 1] -> w = [1/3, 2/3]
    w = HVWeighting([3.0, 3.0])(torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert torch.allclose(w, torch.tensor([1 / 3, 2 / 3], dtype=torch.float64), atol=1e-15)
    # slack [-0.5 -> floor 0.5, 2] -> 1/s = [2, 0.5] -> w = [0.8, 0.2]
    w = HVWeighting([1.0, 3.0], rho_clip=0.5)(torch.tensor([1.5, 1.0], dtype=torch.float64))
    assert torch.allclose(w, torch.tensor([0.8, 0.2], dtype=torch.float64), atol=1e-15)
    # batched rows: slack [3, 2, 1] -> 1/s = [1/3, 1/2, 1] (sum 11/6) -> [2/11, 3/11, 6/11]
    rows = HVWeighting([4.0, 4.0, 4.0])(torch.tensor([[1.0, 2.0, 3.0], [3.0, 3.0, 3.0]]))
    assert torch.allclose(rows, torch.tensor([[2 / 11, 3 / 11, 6 / 11], [1 / 3, 1 / 3, 1 / 3]]), atol=1e-6)


def test_no_gradient_through_the_weights() -> None:
    losses = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    hv = HVWeighting([3.0, 3.0])
    assert not hv(losses).requires_grad
    hv.weighted_loss(losses).backward()
    # dL/dl = w exactly (w treated as a constant)
    assert torch.allclose(losses.grad, torch.tensor([1 / 3, 2 / 3], dtype=torch.float64), atol=1e-15)


def test_libmtl_style_backward_golden_gradient() -> None:
    p = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    weighting = HVBackward([2.0, 5.0])
    # l = [p^2, 3p] = [1, 3]; slack [1, 2] -> w = [2/3, 1/3]; dL/dp = 2/3 * 2p + 1/3 * 3 = 7/3
    w = weighting.backward([p**2, 3 * p])
    np.testing.assert_allclose(w, [2 / 3, 1 / 3], atol=1e-15)
    assert p.grad is not None and abs(float(p.grad) - 7 / 3) < 1e-14
    np.testing.assert_allclose(weighting.last_weights, w)


def test_reference_recipe_and_bad_input() -> None:
    np.testing.assert_allclose(reference_from_losses([[2.3, 0.7], [2.0, 0.9]]), [2.45, 1.05], atol=1e-12)
    np.testing.assert_allclose(reference_from_losses(torch.tensor([1.0, 2.0]), margin=0.5), [1.5, 2.5])
    with pytest.raises(FedHVError, match="rho_clip = 0"):
        HVWeighting([1.0], rho_clip=0.0)
    with pytest.raises(FedHVError, match="reference"):
        HVWeighting([1.0, float("nan")])
    with pytest.raises(FedHVError, match="losses have shape"):
        HVWeighting([1.0, 2.0])(torch.ones(3))
    with pytest.raises(FedHVError, match="margin"):
        reference_from_losses([1.0], margin=-1)
