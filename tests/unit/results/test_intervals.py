"""Interval estimates and verdicts (``fedhv table --table intervals``), each statistic against an independent
oracle worked out by hand or restated in numpy; the per-run statistic (mean of the last ten scheduled
evaluations) and the validation split on hand-made run directories."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from fedhv.results.collect import find_runs, method_label
from fedhv.results.intervals import (
    bootstrap_interval,
    holm,
    interval,
    interval_ranks,
    iqm,
    paired_p,
    probability_of_improvement,
    verdict,
)
from fedhv.results.tables import build_tables


def test_the_bootstrap_of_two_values_spans_them() -> None:
    """Resampling {a, b}: the mean is a (1/4), (a+b)/2 (1/2) or b (1/4); the 2.5 % and 97.5 % quantiles are a, b."""
    low, high = bootstrap_interval([[3.0, 5.0]])  # type: ignore[misc]
    assert (low, high) == pytest.approx((3.0, 5.0))


def test_the_bootstrap_is_stratified() -> None:
    """Strata {0, 1} and {10, 10}: pooled means (x1 + x2 + 20) / 4 lie in [5, 5.5]; an unstratified bootstrap of
    the four values would reach 0 and 10."""
    low, high = bootstrap_interval([[0.0, 1.0], [10.0, 10.0]])  # type: ignore[misc]
    assert 5.0 <= low and high <= 5.5 and high > low
    assert bootstrap_interval([[1.0]]) is None
    assert bootstrap_interval([[2.0, 2.0, 2.0]]) == (2.0, 2.0)


def test_the_bootstrap_matches_an_exact_enumeration() -> None:
    """For three values the resampled mean takes 10 values with known probabilities (multinomial); the interval's
    ends are the exact 2.5 % / 97.5 % quantiles of that distribution within the Monte-Carlo error."""
    x = np.array([70.0, 72.0, 77.0])
    means, probs = [], []
    for counts in itertools.product(range(4), repeat=3):
        if sum(counts) != 3:
            continue
        p = math.factorial(3) / np.prod([math.factorial(c) for c in counts]) / 27
        means.append(float(np.dot(counts, x) / 3))
        probs.append(p)
    order = np.argsort(means)
    cdf = np.cumsum(np.asarray(probs)[order])
    sorted_means = np.asarray(means)[order]
    q_low = sorted_means[np.searchsorted(cdf, 0.025)]
    q_high = sorted_means[np.searchsorted(cdf, 0.975)]
    low, high = bootstrap_interval([x.tolist()])  # type: ignore[misc]
    assert low == pytest.approx(q_low, abs=0.34) and high == pytest.approx(q_high, abs=0.34)


def test_iqm_is_the_mean_of_the_middle_half() -> None:
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx(np.mean([3, 4, 5, 6]))
    assert interval([1.0, 2.0, 3.0]).iqm is None  # under five seeds
    assert interval([1.0, 2.0, 3.0, 4.0, 100.0]).iqm == pytest.approx(3.0)  # trims one from each end


def test_probability_of_improvement_counts_pairs() -> None:
    x, y = [1.0, 3.0, 5.0, 5.0], [2.0, 5.0, 0.0]
    brute = np.mean([(a > b) + 0.5 * (a == b) for a in x for b in y])
    assert probability_of_improvement(x, y) == pytest.approx(brute, abs=1e-12)


def test_the_paired_test_is_the_t_test_of_the_differences() -> None:
    x, y = [86.1, 86.5, 85.9, 86.8, 86.0], [85.7, 86.4, 85.2, 86.1, 85.9]
    d = np.subtract(x, y)
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    assert paired_p(x, y) == pytest.approx(2 * stats.t.sf(abs(t), len(d) - 1), rel=1e-12)
    # unpaired would be another number: the pairing matters
    assert paired_p(x, y) != pytest.approx(stats.ttest_ind(x, y).pvalue, rel=1e-3)
    assert paired_p([1.0, 2.0], [1.0, 2.0]) == 1.0 and paired_p([2.0, 3.0], [1.0, 2.0]) == 0.0
    assert paired_p([1.0], [2.0]) is None


def test_holm_steps_down() -> None:
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> monotone 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, None, 0.9]) == [pytest.approx(1.0), None, pytest.approx(1.0)]


def test_verdicts_and_interval_ranks() -> None:
    assert verdict(0.4, 0.01) == "better" and verdict(-0.4, 0.01) == "worse" and verdict(0.4, 0.2) == "tied"
    assert verdict(0.4, None) == "tied"
    ranks = interval_ranks({"a": (90.0, 91.0), "b": (90.5, 92.0), "c": (85.0, 89.0), "d": (84.0, 85.5)})
    assert ranks == {"a": 1, "b": 1, "c": 3, "d": 3}  # a, b overlap; c, d lie below both; c and d overlap


def _write_run(root: Path, method: str, seed: int, worst: list[float], val_shift: float = 0.0,
               rounds: int = 36) -> None:
    """A run with test evaluations every 3 rounds (rounds 3..36 scheduled) plus the final one."""
    folder = root / method / f"s{seed}"
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(f'setting = "multimnist"\nmethod = "{method}"\nseed = {seed}\nrounds = '
                                        f"{rounds}\n[eval]\ntest_period = 3\n")
    lines = []
    for i, r in enumerate(range(3, rounds + 1, 3)):
        w = worst[i % len(worst)]
        val = {"mean_acc": w + 5 + val_shift, "worst_acc": w + val_shift, "hv": 1.0}
        lines.append({"round": r, "mean_acc": w + 5, "worst_acc": w, "hv": 1.0, "weights": [0.7, 0.7], "val": val})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    last = lines[-1]
    (folder / "summary.json").write_text(json.dumps({"setting": "multimnist", "method": method, "seed": seed,
                                                     "rounds": rounds, "mean_acc": last["mean_acc"],
                                                     "worst_acc": last["worst_acc"], "hv": 1.0}))


def test_the_table_reads_the_mean_of_the_last_ten_evaluations_and_the_validation_set(tmp_path: Path) -> None:
    # 12 scheduled evaluations cycling 70, 80: the last ten average 75, the last one reads 80
    for seed in (0, 1, 2, 3, 4):
        _write_run(tmp_path, "fedhv", seed, [70.0 + seed, 80.0 + seed])
        _write_run(tmp_path, "uniform", seed, [60.0 + seed, 70.0 + seed], val_shift=1.0)
    runs, _ = find_runs(tmp_path)
    (table,) = build_tables(runs, ["intervals"])
    got = {labels[0]: [c.plain() for c in row] for labels, row in zip(table.labels, table.rows)}
    assert list(got) == ["FedHV", "Uniform"]
    head = table.header
    assert got["FedHV"][head.index("WorstAcc ↑")] == "77.00 ± 1.58"  # mean over seeds of 75 + seed
    assert got["Uniform"][head.index("vs FedHV")] == "worse / worse"  # every seed 10 lower: infinite t
    assert got["FedHV"][head.index("P(WorstAcc > FedHV)")] == "–"
    assert got["Uniform"][head.index("P(WorstAcc > FedHV)")] == "0.00"
    assert got["Uniform"][head.index("IQM WorstAcc")] == "67.00"
    assert got["Uniform"][head.index("interval rank")] == "2 / 2"
    assert got["FedHV"][head.index("Σw")] == "1.40"
    assert any("last ten scheduled test evaluations (rounds 9–36 of 36" in n for n in table.notes)
    (scheduled,) = build_tables(find_runs(tmp_path, statistic="scheduled")[0], ["intervals"])
    row = dict(zip(scheduled.header, scheduled.rows[0]))
    assert row["WorstAcc ↑"].plain() == "82.00 ± 1.58"  # round 36 reads 80 + seed
    (val,) = build_tables(find_runs(tmp_path, split="val")[0], ["intervals"])
    rows = {labels[0]: dict(zip(val.header, row)) for labels, row in zip(val.labels, val.rows)}
    assert rows["Uniform"]["WorstAcc ↑"].plain() == "68.00 ± 1.58" and "validation set" in val.title


def test_the_interval_figure_draws_each_method_s_mean_and_interval(tmp_path: Path) -> None:
    plt = pytest.importorskip("matplotlib.pyplot")
    pytest.importorskip("autorank")
    from fedhv.results.plots_intervals import interval_figures

    for seed in (0, 1, 2, 3, 4):
        _write_run(tmp_path, "fedhv", seed, [70.0 + seed, 80.0 + 2 * seed])
        _write_run(tmp_path, "uniform", seed, [60.0 + seed, 70.0 + seed])
        _write_run(tmp_path, "dwa", seed, [65.0 + seed, 75.0 - seed])
    runs, _ = find_runs(tmp_path)
    figures = dict(interval_figures(runs))
    try:
        assert list(figures) == ["intervals-multimnist", "critical-difference"]
        worst = figures["intervals-multimnist"].axes[1]
        lines = worst.get_lines()
        bars, dots = lines[0::2], lines[1::2]
        assert [d.get_label() for d in dots] == ["Uniform", method_label("dwa"), "FedHV"]  # worst first, at the bottom
        fedhv_values = [75.0 + 1.5 * s for s in range(5)]  # last ten of 12 cycling 70+s, 80+2s
        expected = interval(fedhv_values)
        assert dots[2].get_xdata()[0] == pytest.approx(expected.mean)
        assert list(bars[2].get_xdata()) == pytest.approx([expected.low, expected.high])
        cd = figures["critical-difference"].axes[0].get_title()
        assert "over 5 blocks" in cd and "Friedman" in cd
    finally:
        for fig in figures.values():
            plt.close(fig)
