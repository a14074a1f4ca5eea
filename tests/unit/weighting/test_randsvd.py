from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhv.algorithms.fedcmoo import FedCMOOAlgorithm, FedCMOOConfig, find_weights
from fedhv.models.params import TaskSlices
from fedhv.weighting.randsvd import compress, compression_rank, near_square_shape, randomized_svd, rearrange, unarrange

from helpers import ScriptedFederation


@pytest.mark.parametrize(
    ("d", "m", "shape", "rank"),
    [  # encoder sizes of the paper's models (reference notes §4.2)
        (28_515, 2, (238, 240), 59),
        (1_685_888, 2, (1836, 1838), 459),
        (11_168_832, 5, (7472, 7475), 747),
    ],
)
def test_shapes_and_ranks_match_reference(d: int, m: int, shape: tuple[int, int], rank: int) -> None:
    assert near_square_shape(d, m) == shape
    assert compression_rank(d, m) == rank


def test_rearrange_round_trip() -> None:
    g = torch.randn(1001, 3, dtype=torch.float64)
    a = rearrange(g)
    assert a.shape == near_square_shape(1001, 3)
    assert torch.equal(unarrange(a, 1001, 3), g)
    assert torch.equal(a[:, :3], g[: a.shape[0]])  # first block = first s rows


def test_randomized_svd_exact_on_low_rank_and_seeded() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(60, 5, generator=gen, dtype=torch.float64) @ torch.randn(5, 70, generator=gen, dtype=torch.float64)
    left, right = randomized_svd(a, 5, torch.Generator().manual_seed(1))
    torch.testing.assert_close(left @ right.T, a, rtol=1e-9, atol=1e-9)
    l2, _ = randomized_svd(a, 5, torch.Generator().manual_seed(1))
    assert torch.equal(left, l2)
    # A rank-3 sketch of a full-rank matrix is close to the best rank-3 approximation.
    b = torch.randn(40, 40, generator=gen, dtype=torch.float64)
    lo, ro = randomized_svd(b, 3, torch.Generator().manual_seed(2))
    s = torch.linalg.svdvals(b)
    err = torch.linalg.matrix_norm(b - lo @ ro.T, ord=2)
    assert err <= 1.5 * s[3]


def test_find_weights_behaviour() -> None:
    gg = np.diag([4.0, 1.0])
    w = find_weights(gg, np.array([0.5, 0.5]))
    assert np.all(w >= 0) and w.sum() == pytest.approx(1.0)
    assert w[1] > w[0]  # weight moves to the smaller-norm task
    # The step budget lr * steps = 1 moves the weights only partly (no converged min-norm).
    assert w[1] < 0.8
    # Golden: with the normalised Gram, projected steps keep the sum and move by
    # lr * (GG w)_1 - mean each step; one step from uniform:
    n = np.mean(np.sqrt(np.diag(gg) + 1e-4))
    g = gg / n**2
    one = find_weights(gg, np.array([0.5, 0.5]), steps=1)
    grad = g @ np.array([0.5, 0.5])
    np.testing.assert_allclose(one, np.array([0.5, 0.5]) - 1e-3 * (grad - grad.mean()), rtol=1e-12)
    # Warm start matters.
    assert not np.allclose(find_weights(gg, np.array([0.9, 0.1])), w)


@pytest.mark.parametrize("m", [2, 3, 5, 8])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_find_weights_small_m_loop_equals_numpy_loop(m: int, momentum: float) -> None:
    """The Python-float loop used up to ``SMALL_M`` tasks takes the NumPy loop's steps (oracle: the
    NumPy loop with :func:`project_simplex`, forced by a larger ``SMALL_M`` bound of 0)."""
    import fedhv.algorithms.fedcmoo as fc

    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, m + 3))
    gg, start = a @ a.T, rng.dirichlet(np.ones(m))
    fast = find_weights(gg, start, lr=0.05, steps=300, momentum=momentum)
    before = fc.SMALL_M
    fc.SMALL_M = 0
    try:
        slow = find_weights(gg, start, lr=0.05, steps=300, momentum=momentum)
    finally:
        fc.SMALL_M = before
    np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-13)
    assert np.abs(fast - start).max() > 1e-2 and (fast == 0).any() == (slow == 0).any()
    with pytest.raises(ValueError, match="non-finite"):
        find_weights(gg, start, lr=np.inf, steps=3)


@pytest.mark.parametrize("estimator", ["randsvd", "randsvd-direct"])
def test_gram_estimate_is_exact_for_lossless_sketches(estimator: str) -> None:
    """With a rank covering the rearranged matrix, C_k = G_k and both estimators give B^T B / |S|."""
    k, m, d = 4, 2, 50
    gen = torch.Generator().manual_seed(0)
    grads = torch.randn(k, m, d, generator=gen, dtype=torch.float64)
    slices = TaskSlices(torch.arange(d), (torch.zeros(0, dtype=torch.long),) * m)
    alg = FedCMOOAlgorithm(slices, 1.0, config=FedCMOOConfig(estimator=estimator, extra_upload=4.0))  # rank 10 = full for 10 x 10
    fed = ScriptedFederation(np.arange(k), [])
    gg = alg.gram_estimate(grads, np.arange(k), 0, fed)
    b = grads.sum(0)  # [m, d]
    np.testing.assert_allclose(gg, (b @ b.T).numpy() / k, rtol=1e-8, atol=1e-8)
    assert fed.up > 0


def test_compress_reconstruction_shape() -> None:
    g = torch.randn(500, 2)
    c, (left, right) = compress(g, compression_rank(500, 2), torch.Generator().manual_seed(0))
    assert c.shape == g.shape and left.shape[1] == right.shape[1] == compression_rank(500, 2)


def test_short_wide_matrix_sketch_is_capped_by_its_rows() -> None:
    """A 3 x 20 matrix asked for rank 5: the sketch has q = min(rank + floor(0.1 rank), rows, cols) = 3
    columns, so the factors reproduce the matrix exactly and the generator advances by exactly
    20 x 3 float64 normals (later sketches drawn from the same stream stay where they were)."""
    a = torch.randn(3, 20, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    left, right = randomized_svd(a, 5, gen)
    assert left.shape == (3, 3) and right.shape == (20, 3)
    torch.testing.assert_close(left @ right.T, a, rtol=0, atol=1e-12)
    ref = torch.Generator().manual_seed(0)
    torch.randn(20, 3, generator=ref, dtype=torch.float64)
    assert torch.equal(torch.randn(4, generator=gen), torch.randn(4, generator=ref))


def test_randomized_svd_equals_the_reference_svd_truncation() -> None:
    """``L R^T`` is the reference code's rank-r truncation ``Q U_r S_r V_r^T`` of ``B = Q^T A``,
    computed here with ``torch.linalg.svd`` from the same test matrix (float64; the code takes
    ``U_r`` from ``eigh(B B^T)`` instead)."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(60, 70, generator=g, dtype=torch.float64) @ torch.diag(torch.linspace(3, 0.01, 70,
                                                                                       dtype=torch.float64))
    rank, seed = 20, 17  # q = 22 > rank: the truncation drops two directions
    left, right = randomized_svd(a, rank, torch.Generator().manual_seed(seed))
    q = rank + int(0.1 * rank)
    omega = torch.randn(70, q, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    qmat, _ = torch.linalg.qr(a @ omega)
    for _ in range(2):
        z, _ = torch.linalg.qr(a.T @ qmat)
        qmat, _ = torch.linalg.qr(a @ z)
    u, s, vh = torch.linalg.svd(qmat.T @ a, full_matrices=False)
    reference = qmat @ (u[:, :rank] * s[:rank]) @ vh[:rank]
    torch.testing.assert_close(left @ right.T, reference, rtol=0, atol=1e-10)
    assert left.shape == (60, rank) and right.shape == (70, rank)
    torch.testing.assert_close(left.T @ left, torch.eye(rank, dtype=torch.float64), rtol=0, atol=1e-12)
