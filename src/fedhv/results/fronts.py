"""Front indicators of final loss vectors, through moocore (issue 41's indicator layer).

A front sweep leaves, per method and seed, one final test-loss vector ``l in R^m`` per direction. With
``P`` the non-dominated subset of one method's vectors for one seed (minimisation), and ``Z`` the
non-dominated union of every method's and seed's vectors (the best front found, the reference set):

- ``HV(P; r)``: the Lebesgue measure of ``{z : p <= z <= r for some p in P}`` at the evaluation reference
  ``r`` (the paper's ``3 * 1_m``; a single point gives ``prod_i max(r_i - l_i, 0)``, as Table 8);
- ``IGD+(P; Z) = mean_{z in Z} min_{p in P} || max(p - z, 0) ||_2`` (Ishibuchi et al., 2015): how far the
  front is from the best one, counting only the directions in which it is worse;
- ``eps+(P; Z) = max_{z in Z} min_{p in P} max_i (p_i - z_i)``: the smallest shift that makes ``P``
  weakly dominate ``Z``.

The computations are moocore's (``moocore.hypervolume``, ``igd_plus``, ``epsilon_additive``,
``filter_dominated``; López-Ibáñez et al., a maintained library of exactly these indicators): ``pip install
'fedhv[fronts]'``. The Das–Dennis directions of a sweep are :func:`das_dennis`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from fedhv.errors import ConfigError

#: What to install for the indicators.
FRONTS_EXTRA = "pip install 'fedhv[fronts]'"


def _moocore() -> Any:
    try:
        import moocore
    except ImportError as exc:
        raise ConfigError(f"the front indicators need moocore, which is not installed: {FRONTS_EXTRA}") from exc
    return moocore


def _points(points: Any, what: str = "points") -> np.ndarray:
    p = np.asarray(points, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] == 0 or p.shape[1] == 0 or not np.isfinite(p).all():
        raise ValueError(f"{what} must be a non-empty [n, m] array of finite numbers, got shape {p.shape}")
    return p


def nondominated(points: Any) -> np.ndarray:
    """The non-dominated rows of ``points [n, m]`` (minimisation), duplicates kept once, in input order."""
    p = _points(points)
    keep = _moocore().is_nondominated(p, keep_weakly=False)
    return p[np.asarray(keep, dtype=bool)]


#: The most directions a lattice may have (issue 52): each is a training run per method, seed and margin, so 10,000
#: is far beyond any sweep (docs/fronts.md runs 5); ``--front 100000000`` built 10^8 rows in Python until
#: memory ran out.
MAX_DIRECTIONS = 10_000


def max_divisions(m: int) -> int:
    """The largest ``h`` whose lattice of ``m`` tasks has at most :data:`MAX_DIRECTIONS` directions."""
    h = 1
    while math.comb(h + m, m - 1) <= MAX_DIRECTIONS:
        h += 1
    return h


def das_dennis(m: int, h: int, interior: bool = False) -> np.ndarray:
    """The simplex-lattice directions ``u`` with entries ``k / h`` summing to 1 (Das and Dennis, 1998).

    ``C(h + m - 1, m - 1)`` directions: ``h + 1`` for ``m = 2``, 35 for ``m = 5, h = 3``; in lexicographic
    order of ``h u`` from ``(h, 0, ..., 0)`` down. ``interior``: the same count of strictly positive
    directions ``(k + 1) / (h + m)`` (a front sweep's: a zero entry would put a task's reference at its
    calibration maximum and give linear scalarisation an infinite weight ``1/u_i``).

    Raises
    ------
    ConfigError
        When ``m < 2`` or ``h < 1`` (one line naming the value).
    """
    if isinstance(m, bool) or not isinstance(m, int) or m < 2:
        raise ConfigError(f"m = {m!r}: a front needs at least 2 tasks")
    if isinstance(h, bool) or not isinstance(h, int) or h < 1:
        raise ConfigError(f"h = {h!r}: the lattice needs h >= 1 divisions (m = 2: h + 1 directions)")
    count = math.comb(h + m - 1, m - 1)
    if count > MAX_DIRECTIONS:
        raise ConfigError(f"h = {h} divisions of {m} tasks make {count:,} directions, over fedhv's bound of "
                          f"{MAX_DIRECTIONS:,} (each is a run per method and seed); lower h, e.g. h = "
                          f"{max_divisions(m)}")
    rows = []
    for bars in combinations(range(h + m - 1), m - 1):  # stars and bars
        edges = (-1, *bars, h + m - 1)
        rows.append([edges[i + 1] - edges[i] - 1 for i in range(m)])
    k = np.asarray(sorted(rows, reverse=True), dtype=np.float64)
    return (k + 1) / (h + m) if interior else k / h


@dataclass(frozen=True)
class FrontScore:
    """The indicators of one front (see the module docstring).

    Attributes
    ----------
    points : int
        Non-dominated points of the front.
    hv : float
        Hypervolume at the evaluation reference.
    igd_plus, eps_add : float
        IGD+ and the additive epsilon indicator against the reference set.
    """

    points: int
    hv: float
    igd_plus: float
    eps_add: float


def score_front(points: Any, reference_set: Any, eval_reference: Any) -> FrontScore:
    """:class:`FrontScore` of the non-dominated subset of ``points`` against ``reference_set``."""
    mc = _moocore()
    front = nondominated(points)
    z = nondominated(_points(reference_set, "reference_set"))
    r = np.asarray(eval_reference, dtype=np.float64)
    if r.shape != (front.shape[1],) or z.shape[1] != front.shape[1]:
        raise ValueError(f"points have {front.shape[1]} objectives, the reference set {z.shape[1]} and the "
                         f"evaluation reference {r.shape}")
    inside = front[(front < r).all(axis=1)]
    hv = float(mc.hypervolume(inside, ref=r)) if len(inside) else 0.0
    return FrontScore(len(front), hv, float(mc.igd_plus(front, ref=z)), float(mc.epsilon_additive(front, ref=z)))


def attainment(fronts: Any, percentiles: Any = (0, 50, 100)) -> dict[float, np.ndarray]:
    """The empirical attainment surfaces of several fronts (one per seed; minimisation), through moocore.

    The ``p``-% surface bounds the region of the loss space that at least ``p`` % of the fronts weakly
    dominate (López-Ibáñez et al., 2010): ``0`` -- some seed reached it (the best), ``50`` -- the median,
    ``100`` -- every seed did (the worst). Returns ``{p: points [k, m]}`` (``m <= 3``; a surface no
    point reaches is left out).
    """
    sets = [_points(f, "fronts[i]") for f in fronts]
    if not sets:
        raise ValueError("attainment needs at least one front")
    m = sets[0].shape[1]
    if m > 3 or any(s.shape[1] != m for s in sets):
        raise ValueError(f"attainment surfaces need fronts of one dimension m <= 3, got {[s.shape[1] for s in sets]}")
    points = np.vstack(sets)
    ids = np.concatenate([np.full(len(s), i + 1) for i, s in enumerate(sets)])
    out = _moocore().eaf(points, ids, percentiles=list(percentiles))
    surfaces = {}
    for p in percentiles:
        rows = out[np.isclose(out[:, -1], p)][:, :-1]
        if len(rows):
            surfaces[float(p)] = rows
    return surfaces
