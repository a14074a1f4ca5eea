from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedhv.weighting import min_norm, min_norm_two, project_simplex


def test_simplex_projection_golden() -> None:
    np.testing.assert_allclose(project_simplex(np.array([0.8, 0.6])), [0.6, 0.4])
    np.testing.assert_allclose(project_simplex(np.array([2.0, 0.0, -1.0])), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(project_simplex(np.array([0.2, 0.3, 0.5])), [0.2, 0.3, 0.5])
    np.testing.assert_allclose(project_simplex(np.array([1.0, 1.0, 1.0])), [1 / 3] * 3)


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.integers(1, 8), elements=st.floats(-10, 10)))
def test_simplex_projection_properties(v: np.ndarray) -> None:
    w = project_simplex(v)
    assert np.all(w >= 0) and w.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(project_simplex(w), w, atol=1e-12)  # idempotent
    # Optimality: no random simplex point is closer to v.
    rng = np.random.default_rng(len(v))
    for _ in range(20):
        p = rng.dirichlet(np.ones(len(v)))
        assert np.linalg.norm(w - v) <= np.linalg.norm(p - v) + 1e-9


def test_two_task_golden_values() -> None:
    v1, v2 = np.array([1.0, 0.0]), np.array([0.0, 2.0])
    g = np.array([[v1 @ v1, v1 @ v2], [v1 @ v2, v2 @ v2]])
    # gamma = (4 - 0) / (1 + 4 - 0) = 0.8: min-norm point 0.8 v1 + 0.2 v2 = (0.8, 0.4).
    np.testing.assert_allclose(min_norm_two(g), [0.8, 0.2])
    # v2 = 2 v1: the min-norm point is v1 itself -> [1, 0]; the reference clips to 0.999.
    g2 = np.array([[1.0, 2.0], [2.0, 4.0]])
    np.testing.assert_allclose(min_norm_two(g2), [1.0, 0.0])
    np.testing.assert_allclose(min_norm_two(g2, reference_clip=True), [0.999, 0.001])
    np.testing.assert_allclose(min_norm_two(g2[::-1, ::-1], reference_clip=True), [0.001, 0.999])


def test_three_task_golden_value() -> None:
    # Three unit vectors at 120 degrees in the plane: the origin is in their hull.
    ang = np.deg2rad([90, 210, 330])
    v = np.stack([np.cos(ang), np.sin(ang)], 1)
    res = min_norm(v @ v.T)
    np.testing.assert_allclose(res.weights, [1 / 3] * 3, atol=1e-9)
    assert res.norm_sq < 1e-12
    # e1, e2, e3 in R^3: min-norm point is the centroid, norm^2 = 1/3.
    res = min_norm(np.eye(3))
    np.testing.assert_allclose(res.weights, [1 / 3] * 3, atol=1e-9)
    assert res.norm_sq == pytest.approx(1 / 3)


def _kkt(g: np.ndarray, lam: np.ndarray, tol: float) -> None:
    grad = g @ lam
    val = lam @ g @ lam
    scale = max(1.0, np.abs(g).max())
    assert np.all(grad >= val - tol * scale)  # no vertex improves
    assert np.all(np.abs(grad[lam > 1e-6] - val) <= tol * scale)  # active set is level


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 6), st.integers(2, 12), st.integers(0, 2**31 - 1))
def test_min_norm_properties(m: int, dim: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(m, dim)) + rng.normal(size=dim)  # correlated vectors
    g = v @ v.T
    res = min_norm(g, max_iter=5000, tol=1e-14)
    lam = res.weights
    assert np.all(lam >= 0) and lam.sum() == pytest.approx(1.0)
    _kkt(g, lam, 1e-5)
    # Better than every vertex and random simplex points.
    assert res.norm_sq <= np.diag(g).min() + 1e-9
    for p in rng.dirichlet(np.ones(m), 20):
        assert res.norm_sq <= p @ g @ p + 1e-9
    # Permutation equivariance and scale invariance of the weights.
    perm = rng.permutation(m)
    res_p = min_norm(g[np.ix_(perm, perm)], max_iter=5000, tol=1e-14)
    assert res_p.norm_sq == pytest.approx(res.norm_sq, rel=1e-5, abs=1e-9)
    res_s = min_norm(7.0 * g, max_iter=5000, tol=1e-14)
    assert res_s.norm_sq == pytest.approx(7.0 * res.norm_sq, rel=1e-5, abs=1e-9)


def test_iteration_cap_is_respected() -> None:
    rng = np.random.default_rng(0)
    v = rng.normal(size=(5, 50))
    assert min_norm(v @ v.T, max_iter=3).iterations <= 3


def test_bad_gram_rejected() -> None:
    with pytest.raises(ValueError, match="square"):
        min_norm(np.ones((2, 3)))
    with pytest.raises(ValueError, match="non-finite"):
        min_norm(np.array([[1.0, np.nan], [np.nan, 1.0]]))


@pytest.mark.parametrize("factor", [1e-12, 1e-6, 1e8])
@pytest.mark.parametrize("seed", range(4))
def test_min_norm_weights_are_scale_invariant_for_three_or_more_tasks(factor: float, seed: int) -> None:
    # Gradients of tiny or huge magnitude (late training, exploding loss) must get the same
    # weights: the min-norm problem over the simplex is invariant to G -> c G, c > 0.
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(4, 6))
    g = v @ v.T
    base = min_norm(g)
    scaled = min_norm(factor * g)
    np.testing.assert_allclose(scaled.weights, base.weights, atol=1e-9)
    assert scaled.norm_sq == pytest.approx(factor * base.norm_sq, rel=1e-9)
