"""Front indicators (moocore) against oracles written here: hypervolume by inclusion–exclusion of boxes,
IGD+ and the additive epsilon from their definitions in numpy, the non-dominated filter by pairwise
comparison, and the Das–Dennis lattice against a brute-force enumeration."""

from __future__ import annotations

from itertools import combinations, product
from math import comb

import numpy as np
import pytest

from fedhv.errors import ConfigError
from fedhv.results.fronts import das_dennis, nondominated, score_front

RNG = np.random.default_rng(3)


def hv_oracle(points: np.ndarray, r: np.ndarray) -> float:
    """Inclusion–exclusion over the boxes [p, r]: the union's volume (exact, fine for a few points)."""
    total = 0.0
    for k in range(1, len(points) + 1):
        for subset in combinations(points, k):
            corner = np.max(subset, axis=0)
            total += (-1) ** (k + 1) * float(np.prod(np.clip(r - corner, 0, None)))
    return total


def nd_oracle(points: np.ndarray) -> np.ndarray:
    keep = []
    for i, p in enumerate(points):
        dominated = any((q <= p).all() and (q < p).any() for q in points)
        duplicate = any((points[j] == p).all() for j in range(i))
        if not dominated and not duplicate:
            keep.append(p)
    return np.asarray(keep)


@pytest.mark.parametrize("m", [2, 3])
def test_indicators_against_their_definitions(m: int) -> None:
    for _ in range(5):
        pts = RNG.uniform(0.2, 2.5, size=(7, m))
        pts[3] = pts[1]  # a duplicate
        ref_set = RNG.uniform(0.1, 2.0, size=(6, m))
        r = np.full(m, 3.0)
        front = nd_oracle(pts)
        z = nd_oracle(ref_set)
        got = score_front(pts, ref_set, r)
        assert got.points == len(front)
        np.testing.assert_array_equal(nondominated(pts), front)
        assert got.hv == pytest.approx(hv_oracle(front, r), rel=1e-12)
        igd = np.mean([min(np.linalg.norm(np.maximum(p - q, 0)) for p in front) for q in z])
        eps = max(min(np.max(p - q) for p in front) for q in z)
        assert got.igd_plus == pytest.approx(igd, rel=1e-12)
        assert got.eps_add == pytest.approx(eps, rel=1e-12)


def test_a_single_point_is_tables_8_hv_and_points_beyond_the_reference_count_nothing() -> None:
    assert score_front([[1.0, 2.5]], [[1.0, 2.5]], [3.0, 3.0]).hv == pytest.approx(2.0 * 0.5)
    beyond = score_front([[1.0, 3.5], [4.0, 0.5]], [[1.0, 1.0]], [3.0, 3.0])
    assert beyond.hv == 0.0 and beyond.points == 2
    assert score_front([[1.0, 1.0]], [[1.0, 1.0]], [3.0, 3.0]).igd_plus == 0.0  # the reference front itself


@pytest.mark.parametrize(("m", "h"), [(2, 1), (2, 6), (3, 4), (5, 3)])
def test_das_dennis_is_the_whole_simplex_lattice(m: int, h: int) -> None:
    u = das_dennis(m, h)
    brute = sorted(k for k in product(range(h + 1), repeat=m) if sum(k) == h)
    assert len(u) == comb(h + m - 1, m - 1) == len(brute)
    assert sorted(tuple(int(v) for v in np.rint(row * h)) for row in u) == brute
    np.testing.assert_allclose(u.sum(1), 1.0, rtol=1e-15)
    assert len(das_dennis(5, 3)) == 35 and len(das_dennis(2, 4)) == 5


@pytest.mark.parametrize(("m", "h", "message"), [(1, 3, "m = 1: a front needs at least 2 tasks"),
                                                 (2, 0, "h = 0: the lattice needs h >= 1")])
def test_das_dennis_refuses_a_lattice_it_cannot_serve(m: int, h: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        das_dennis(m, h)
