"""Tests that kill surviving mutants of ``fedhv.weighting`` (issue 11, docs/testing.md).

Independent oracles: hand-computed closed forms, a brute-force quadratic program over
every support of the simplex, and pinned defaults.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fedhv.weighting import hv_weights
from fedhv.weighting.minnorm import min_norm, min_norm_two
from fedhv.weighting.randsvd import compress, randomized_svd
from fedhv.weighting.simplex import project_simplex


def _brute_force_min_norm(g: np.ndarray) -> tuple[np.ndarray, float]:
    """``argmin_{lambda in simplex} lambda^T G lambda`` by enumerating supports ``S``.

    On a support the minimiser solves the KKT system ``[2 G_SS 1; 1^T 0] [lambda; mu] = [0; 1]``;
    the best non-negative solution over all ``S`` is the optimum (the problem is convex).
    """
    m = len(g)
    best: tuple[np.ndarray, float] | None = None
    for r in range(1, m + 1):
        for support in itertools.combinations(range(m), r):
            s = list(support)
            a = np.block([[2 * g[np.ix_(s, s)], np.ones((r, 1))], [np.ones((1, r)), np.zeros((1, 1))]])
            try:
                sol = np.linalg.solve(a, np.r_[np.zeros(r), 1.0])
            except np.linalg.LinAlgError:
                continue
            if (sol[:r] >= -1e-12).all():
                lam = np.zeros(m)
                lam[s] = sol[:r]
                value = float(lam @ g @ lam)
                if best is None or value < best[1] - 1e-12:
                    best = (lam, value)
    assert best is not None
    return best


# --------------------------------------------------------------------------- min_norm_two / min_norm


def test_reference_clip_tie_g12_equal_g11_gives_0999() -> None:
    """G12 = G11 = 1: the reference code's ``G12 >= G11`` test is inclusive (minnorm.py:54)."""
    np.testing.assert_array_equal(min_norm_two(np.array([[1.0, 1.0], [1.0, 2.0]]), reference_clip=True),
                                  [0.999, 1.0 - 0.999])


def test_reference_clip_interior_is_the_closed_form() -> None:
    """G = diag(2, 1): gamma = (G22 - G12) / (G11 + G22 - 2 G12) = 1 / 3 (minnorm.py:59)."""
    np.testing.assert_allclose(min_norm_two(np.array([[2.0, 0.0], [0.0, 1.0]]), reference_clip=True),
                               [1 / 3, 2 / 3], rtol=0, atol=1e-15)


def test_one_and_two_tasks_take_no_iterations() -> None:
    one = min_norm(np.array([[4.0]]))
    np.testing.assert_array_equal(one.weights, [1.0])
    assert one.norm_sq == 4.0 and one.iterations == 0
    two = min_norm(np.array([[2.0, 0.0], [0.0, 1.0]]))
    assert two.iterations == 0
    assert two.norm_sq == pytest.approx(2 / 9 * 1 + 4 / 9 * 0.5 * 2, abs=1e-15)  # 2/9 + 4/9 = 2/3


@pytest.mark.parametrize("factor", [1e-8, 1e6])
def test_wolfe_tolerance_is_relative_to_the_gram_scale(factor: float) -> None:
    """Stopping rule ``value - min grad <= tol * max|G|``: scaling G scales nothing else.

    (Not beyond ``max|G| ~ 1e8``: there ``lstsq``'s default ``rcond`` truncates the affine
    system's constraint rows; reported in docs/testing.md.)"""
    rng = np.random.default_rng(3)
    v = rng.standard_normal((4, 6)) + 0.5
    g = v @ v.T
    want, _ = _brute_force_min_norm(g)
    np.testing.assert_allclose(min_norm(factor * g).weights, want, rtol=0, atol=1e-7)
    np.testing.assert_allclose(min_norm(g).weights, want, rtol=0, atol=1e-7)


def test_wolfe_with_two_removals_in_one_major_iteration() -> None:
    """Six integer points in R^3 for which Wolfe's third major iteration drops two vertices
    of the corral in successive minor cycles (found by search); the result is the
    brute-force optimum ``0.50909 e_0 + 0.49091 e_4``."""
    v = np.array([[-4.0, -4.0, 2.0], [1.0, 7.0, 6.0], [-3.0, 4.0, -1.0], [-8.0, 1.0, -1.0],
                  [-1.0, 6.0, 1.0], [-11.0, -2.0, -3.0]])
    g = v @ v.T
    want, value = _brute_force_min_norm(g)
    got = min_norm(g)
    np.testing.assert_allclose(got.weights, want, rtol=0, atol=1e-12)
    assert got.norm_sq == pytest.approx(value, rel=1e-12)
    # hand value: points 0 and 4, G00 = 36, G44 = 38, G04 = -18:
    # gamma = (G44 - G04) / (G00 + G44 - 2 G04) = 56 / 110
    np.testing.assert_allclose(got.weights, [56 / 110, 0, 0, 0, 54 / 110, 0], rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- randomized SVD defaults


def _gen(seed: int = 11) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_randomized_svd_default_oversample_is_one_tenth() -> None:
    """rank 20: floor(0.1 * 20) = 2 extra columns (a different default draws another Omega)."""
    a = torch.randn(60, 50, generator=_gen(0), dtype=torch.float64)
    left, right = randomized_svd(a, 20, _gen())
    left2, right2 = randomized_svd(a, 20, _gen(), oversample=0.1, power_iterations=2)
    torch.testing.assert_close(left @ right.T, left2 @ right2.T, rtol=0, atol=1e-14)
    left3, right3 = randomized_svd(a, 20, _gen(), oversample=1.1)
    assert (left @ right.T - left3 @ right3.T).abs().max() > 1e-6  # the default is observable


def test_compress_default_oversample_is_one_tenth() -> None:
    g = torch.randn(800, 2, generator=_gen(1), dtype=torch.float64)  # near-square 40 x 40
    c, _ = compress(g, 10, _gen())
    c2, _ = compress(g, 10, _gen(), oversample=0.1, power_iterations=2)
    torch.testing.assert_close(c, c2, rtol=0, atol=1e-14)
    c3, _ = compress(g, 10, _gen(), oversample=1.1)
    assert (c - c3).abs().max() > 1e-6


# --------------------------------------------------------------------------- hv_weights / project_simplex


def test_slack_exactly_rho_clip_is_not_a_floor_activation() -> None:
    res = hv_weights(np.array([1.0, 2.0]), np.array([1.5, 2.5]), rho_clip=0.5)  # slack exactly 0.5
    np.testing.assert_array_equal(res.floor_active, [False, False])
    np.testing.assert_array_equal(res.weights, [0.5, 0.5])


def test_project_simplex_rejects_matrices_and_empty_input() -> None:
    with pytest.raises(ValueError, match=r"^expected a non-empty vector, got shape \(2, 2\)$"):
        project_simplex(np.eye(2))
    with pytest.raises(ValueError, match=r"^expected a non-empty vector, got shape \(0,\)$"):
        project_simplex(np.array([]))
    with pytest.raises(ValueError, match=r"^cannot project non-finite values \[ 1. nan\]$"):
        project_simplex(np.array([1.0, np.nan]))


def test_project_simplex_computes_in_float64() -> None:
    """A float32 input is projected in float64 (the weights FedCMOO and FSMGDA use)."""
    v = np.array([0.7, 0.1, 0.4], dtype=np.float32)
    out = project_simplex(v)
    assert out.dtype == np.float64
    # all three stay positive: tau = (sum v - 1) / 3, from the float64 values of the float32 inputs
    v64 = v.astype(np.float64)
    tau = (v64[0] + v64[1] + v64[2] - 1.0) / 3
    np.testing.assert_array_equal(out, np.maximum(v64 - tau, 0.0))


# --------------------------------------------------------------------------- survivors of the full run


def test_min_norm_two_ties_and_identical_vectors() -> None:
    # reference clip, G12 = G22 (and < G11): the inclusive ``G12 >= G22`` gives 0.001
    np.testing.assert_array_equal(min_norm_two(np.array([[2.0, 1.0], [1.0, 1.0]]), reference_clip=True),
                                  [0.001, 1.0 - 0.001])
    # identical vectors: denominator G11 + G22 - 2 G12 = 0 -> the documented 1/2, not 0/0
    np.testing.assert_array_equal(min_norm_two(np.array([[1.0, 1.0], [1.0, 1.0]])), [0.5, 0.5])


def test_wolfe_iteration_count_and_start_vertex() -> None:
    """v = (1,1,0), (1,0,0), (2,0,2): G = [[2,1,2],[1,1,2],[2,2,8]]. Wolfe starts at the
    vertex of smallest G_ii (e_1); there grad = G e_1 = (1, 1, 2) and value = 1, so the
    first major iteration stops (gap 0): one iteration, even with tol = 0 (the gap test is
    inclusive although grad's arg-min, index 0, is not in the corral)."""
    g = np.array([[2.0, 1.0, 2.0], [1.0, 1.0, 2.0], [2.0, 2.0, 8.0]])
    for tol in (1e-10, 0.0):
        res = min_norm(g, tol=tol)
        np.testing.assert_array_equal(res.weights, [0.0, 1.0, 0.0])
        assert res.iterations == 1 and res.norm_sq == 1.0
    cap = min_norm(g, max_iter=0)  # no major iteration: the start vertex, 0 iterations
    np.testing.assert_array_equal(cap.weights, [0.0, 1.0, 0.0])
    assert cap.iterations == 0


def test_wolfe_iteration_cap_is_max_iter() -> None:
    """The two-removal example needs 4 major iterations; ``max_iter`` = 1, 2 stop after 1, 2."""
    v = np.array([[-4.0, -4.0, 2.0], [1.0, 7.0, 6.0], [-3.0, 4.0, -1.0], [-8.0, 1.0, -1.0],
                  [-1.0, 6.0, 1.0], [-11.0, -2.0, -3.0]])
    g = v @ v.T
    assert [min_norm(g, max_iter=n).iterations for n in (1, 2, 1000)] == [1, 2, 4]


def test_wolfe_tolerance_at_tiny_scales() -> None:
    """max|G| ~ 2e-9: the stopping threshold is tol * max|G| (~2e-19), not tol * 1 (which
    stops at a vertex). The tolerance 1e-6 is loose because the affine solve loses accuracy
    at such scales (docs/testing.md, "bugs found")."""
    rng = np.random.default_rng(3)
    v = rng.standard_normal((4, 6)) + 0.5
    g = v @ v.T
    want, _ = _brute_force_min_norm(g)
    np.testing.assert_allclose(min_norm(1e-10 * g).weights, want, rtol=0, atol=1e-6)


def test_gram_is_checked_and_computed_in_float64() -> None:
    g = np.array([[1.1, 0.3, 0.2], [0.3, 0.9, 0.1], [0.2, 0.1, 1.3]])
    got = min_norm(g.astype(np.float32))
    want = min_norm(g.astype(np.float32).astype(np.float64))
    assert got.weights.dtype == np.float64
    np.testing.assert_array_equal(got.weights, want.weights)
    # a non-symmetric float32 Gram is symmetrised in float64: G12 = (0.1f + 0.7f) / 2 exactly
    g32 = np.array([[1.0, 0.1], [0.7, 2.0]], dtype=np.float32)
    b = (float(g32[0, 1]) + float(g32[1, 0])) / 2
    gamma = (2.0 - b) / (1.0 + 2.0 - 2 * b)
    np.testing.assert_array_equal(min_norm_two(g32), [gamma, 1.0 - gamma])
    with pytest.raises(ValueError, match=r"^Gram matrix has non-finite entries$"):
        min_norm(np.array([[1.0, np.inf], [np.inf, 1.0]]))


def test_compression_rank_and_power_iterations() -> None:
    from fedhv.weighting.randsvd import compression_rank

    assert compression_rank(4, 2) == 1  # floor(4 / (2 sqrt 8)) = 0 -> at least 1
    assert compression_rank(800, 2) == 10 and compression_rank(800, 2, extra=2.0) == 20
    g = torch.randn(800, 2, generator=_gen(2), dtype=torch.float64)
    c0, _ = compress(g, 10, _gen(), power_iterations=0)
    # no power iteration: Q = qr(A Omega), C = Q Q^T A (unarranged), drawn from the same Omega
    from fedhv.weighting.randsvd import rearrange, unarrange

    a = rearrange(g)
    omega = torch.randn(a.shape[1], 11, generator=_gen(), dtype=torch.float64)
    q, _ = torch.linalg.qr(a @ omega)
    u, s, vh = torch.linalg.svd(q.T @ a, full_matrices=False)
    want = unarrange(q @ (u[:, :10] * s[:10]) @ vh[:10], 800, 2)
    torch.testing.assert_close(c0, want, rtol=0, atol=1e-12)


def test_wolfe_step_to_the_first_zero_weight() -> None:
    """Five integer points in R^3 (found by search) where the minor cycle's step
    ``theta = min cur / (cur - alpha)`` matters: the optimum is (v_2 + 2 v_4) / 3 =
    (2/3, -2/3, 2/3), squared norm 4/3."""
    v = np.array([[0.0, -2.0, 0.0], [4.0, -2.0, 2.0], [-4.0, -2.0, 4.0], [3.0, -4.0, 3.0], [3.0, 0.0, -1.0]])
    g = v @ v.T
    want, value = _brute_force_min_norm(g)
    got = min_norm(g)
    np.testing.assert_allclose(want, [0, 0, 1 / 3, 0, 2 / 3], rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.weights, want, rtol=0, atol=1e-12)
    assert got.norm_sq == pytest.approx(4 / 3, rel=1e-12) and value == pytest.approx(4 / 3, rel=1e-12)
