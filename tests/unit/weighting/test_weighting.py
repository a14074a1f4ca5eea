from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedhv.weighting import hv_weights


def test_golden_values() -> None:
    np.testing.assert_allclose(hv_weights(np.array([1.0, 2.0]), np.array([3.0, 3.0])).weights, [1 / 3, 2 / 3])
    # Paper Table 6 MultiMNIST reference and a report near the initial loss ln(10).
    res = hv_weights(np.array([2.302585, 1.5]), np.array([2.458940, 2.453542]))
    s = np.array([2.458940 - 2.302585, 2.453542 - 1.5])
    np.testing.assert_allclose(res.weights, (1 / s) / (1 / s).sum(), rtol=1e-12)
    np.testing.assert_allclose(res.weights, [0.8591265676, 0.1408734324], rtol=1e-9)
    # Floor: a report above the reference gets slack rho_clip.
    clipped = hv_weights(np.array([3.5, 1.0, 2.0]), np.array([3.0, 3.0, 3.0]), rho_clip=1e-6)
    assert clipped.floor_active.tolist() == [True, False, False]
    inv = np.array([1e6, 0.5, 1.0])
    np.testing.assert_allclose(clipped.weights, inv / inv.sum(), rtol=1e-12)
    assert clipped.raw_slack[0] == pytest.approx(-0.5)


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="rho_clip"):
        hv_weights(np.ones(2), np.ones(2) * 3, rho_clip=0.0)
    with pytest.raises(ValueError, match="shape"):
        hv_weights(np.ones(3), np.ones(2) * 3)


reports = st.lists(st.floats(0.0, 5.0), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(reports, st.floats(1e-8, 1e-1), st.floats(0.1, 3.0))
def test_properties(z: list[float], rho: float, margin: float) -> None:
    z_arr = np.array(z)
    r = z_arr.max() + margin + np.arange(len(z)) * 0.01
    w = hv_weights(z_arr, r, rho).weights
    assert np.all(w > 0) and w.sum() == pytest.approx(1.0)
    perm = np.random.default_rng(len(z)).permutation(len(z))
    np.testing.assert_allclose(hv_weights(z_arr[perm], r[perm], rho).weights, w[perm], rtol=1e-10)
    slack = r - z_arr
    # Smaller slack -> larger weight (monotone), and invariance to scaling all slacks.
    order = np.argsort(slack)
    assert np.all(np.diff(w[order]) <= 1e-12)
    scaled = hv_weights(np.zeros(len(z)), 2.0 * slack, rho * 2.0).weights
    np.testing.assert_allclose(scaled, w, rtol=1e-9)
