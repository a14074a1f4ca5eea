"""Interval estimates over seeds and verdicts against a reference method (``fedhv table --table intervals``).

A comparison of methods run on a few seeds reads each run's value ``x_{s}`` (one per seed ``s``, itself
the mean of the run's last ten scheduled evaluations by default) and reports, following Agarwal et al.,
"Deep Reinforcement Learning at the Edge of the Statistical Precipice" (NeurIPS 2021):

- the mean ``x̄ = (1/n) Σ_s x_s`` and the sample standard deviation;
- a 95 % *stratified* percentile-bootstrap confidence interval of the mean: each stratum (a setting)
  is resampled with replacement on its own, ``B = 10 000`` times, and the statistic is taken over the
  pooled resample (one stratum: the plain bootstrap over seeds); ``scipy.stats.bootstrap`` with one
  sample per stratum does exactly this, from a fixed generator so a table prints the same digits on
  every machine;
- with at least :data:`MIN_SEEDS_ROBUST` seeds, the interquartile mean (``scipy.stats.trim_mean`` with
  25 % cut from each end, rliable's ``aggregate_iqm``) and the probability of improvement
  ``P(X > Y) = (1/(n m)) Σ_{s,s'} [1(x_s > y_{s'}) + ½ 1(x_s = y_{s'})]`` over a reference ``Y``
  (rliable's definition: the Mann-Whitney ``U`` statistic over ``n m``; ``scipy.stats.mannwhitneyu``);
- a *verdict* against a reference method: a two-sided paired t-test over the seeds both methods ran
  (seeds are paired: the same seed draws the same initial model, clients and minibatches), its
  p-values adjusted over the methods of a table with Holm's step-down rule, "better" or "worse" when
  the adjusted p is below :data:`ALPHA`, "tied" otherwise. (With five seeds a Wilcoxon signed-rank
  test cannot reach p < 0.05 two-sided, hence the t-test; it assumes roughly normal differences.)

Ranks whose intervals overlap are ties: a method's *interval rank* is 1 plus the number of methods
whose whole interval lies above its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Confidence level of the intervals.
CONFIDENCE = 0.95
#: Bootstrap resamples.
RESAMPLES = 10_000
#: Seed of the bootstrap's generator (fixed: a table is reproducible to the digit).
BOOTSTRAP_SEED = 0
#: Level of the paired test (after Holm's adjustment).
ALPHA = 0.05
#: Seeds from which the IQM and the probability of improvement are shown (rliable's robust aggregates
#: need a handful of runs; with three seeds the IQM is the median).
MIN_SEEDS_ROBUST = 5


@dataclass(frozen=True)
class Interval:
    """A method's values over seeds and their interval estimate.

    Attributes
    ----------
    mean, std : float
        Mean and sample standard deviation (``std`` is None for one value).
    low, high : float or None
        The bootstrap confidence interval of the mean (None for one value).
    iqm : float or None
        The interquartile mean (with at least :data:`MIN_SEEDS_ROBUST` values).
    values : tuple of float
        The values, seed order.
    """

    mean: float
    std: float | None
    low: float | None
    high: float | None
    iqm: float | None
    values: tuple[float, ...]

    @property
    def n(self) -> int:
        """The number of values."""
        return len(self.values)


def _pooled_mean(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(np.concatenate(samples, axis=axis), axis=axis)


def bootstrap_interval(strata: Sequence[Sequence[float]]) -> tuple[float, float] | None:
    """The stratified percentile-bootstrap :data:`CONFIDENCE` interval of the pooled mean.

    Parameters
    ----------
    strata : sequence of sequences of float
        One sequence of values per stratum (one setting: one sequence, the values of its seeds).

    Returns
    -------
    (low, high), or None with fewer than two values in all.
    """
    from scipy import stats

    samples = tuple(np.asarray(s, dtype=np.float64) for s in strata if len(s))
    if sum(len(s) for s in samples) < 2:
        return None
    if all(np.all(s == s[0]) for s in samples) and len({float(s[0]) for s in samples}) == 1:
        value = float(samples[0][0])
        return value, value  # every resample has the same mean (scipy warns of degenerate data)
    res = stats.bootstrap(samples, _pooled_mean, n_resamples=RESAMPLES, confidence_level=CONFIDENCE,
                          method="percentile", vectorized=True, random_state=np.random.default_rng(BOOTSTRAP_SEED))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def iqm(values: Sequence[float]) -> float:
    """The interquartile mean: the mean of the middle 50 % (``scipy.stats.trim_mean(values, 0.25)``)."""
    from scipy import stats

    return float(stats.trim_mean(np.asarray(values, dtype=np.float64), 0.25))


def probability_of_improvement(x: Sequence[float], y: Sequence[float]) -> float:
    """``P(X > Y)`` with ties counted half: the Mann-Whitney ``U`` of ``x`` against ``y`` over ``n m``."""
    from scipy import stats

    u = stats.mannwhitneyu(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64),
                           alternative="two-sided").statistic
    return float(u) / (len(x) * len(y))


def interval(values: Sequence[float]) -> Interval:
    """:class:`Interval` of one stratum's values (one setting's seeds)."""
    vals = tuple(float(v) for v in values)
    if not vals:
        raise ValueError("interval of no values")
    std = float(np.std(vals, ddof=1)) if len(vals) > 1 else None
    ci = bootstrap_interval([vals])
    return Interval(float(np.mean(vals)), std, None if ci is None else ci[0], None if ci is None else ci[1],
                    iqm(vals) if len(vals) >= MIN_SEEDS_ROBUST else None, vals)


def paired_p(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Two-sided p-value of the paired t-test of ``x`` against ``y`` (same seeds, same order).

    None with fewer than two pairs. Differences that are all equal: p = 1 when they are zero, else 0
    (the t statistic is infinite).
    """
    from scipy import stats

    d = np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)
    if len(d) < 2:
        return None
    if np.all(d == d[0]):
        return 1.0 if d[0] == 0 else 0.0
    return float(stats.ttest_rel(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)).pvalue)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment: with the ``k`` p-values sorted, ``p_(i) -> max_{j <= i} min(1, (k - j + 1) p_(j))``
    (``None`` entries are left out of ``k`` and stay ``None``)."""
    present = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    k = len(present)
    for j, (p, i) in enumerate(present):
        running = max(running, min(1.0, (k - j) * p))
        out[i] = running
    return out


def verdict(diff: float, p_adjusted: float | None, higher_is_better: bool = True) -> str:
    """``"better"``, ``"worse"`` or ``"tied"`` from the mean difference and the adjusted p-value."""
    if p_adjusted is None or math.isnan(p_adjusted) or p_adjusted >= ALPHA or diff == 0:
        return "tied"
    return "better" if (diff > 0) == higher_is_better else "worse"


def interval_ranks(intervals: dict[str, tuple[float, float]], higher_is_better: bool = True) -> dict[str, int]:
    """``1 +`` the number of methods whose whole interval lies beyond (better than) the method's own."""
    out = {}
    for m, (lo, hi) in intervals.items():
        if higher_is_better:
            out[m] = 1 + sum(1 for o, (lo2, _) in intervals.items() if o != m and lo2 > hi)
        else:
            out[m] = 1 + sum(1 for o, (_, hi2) in intervals.items() if o != m and hi2 < lo)
    return out
