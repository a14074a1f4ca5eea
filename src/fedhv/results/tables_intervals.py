"""The comparison with interval estimates (``fedhv table --table intervals``): every method of a setting with
its 95 % bootstrap interval, its verdicts against reference methods and its interval rank.

Per setting (and configuration, as the ``ranks`` table) the rows are methods; each run contributes one
value per metric under the comparison's statistic (:data:`~fedhv.results.collect.COMPARISON_STATISTIC`: the
mean of the last ten scheduled evaluations, unless ``--statistic`` says otherwise) on the chosen set
(``--split``, test by default). The columns (:mod:`fedhv.results.intervals` gives the definitions):

- MeanAcc and WorstAcc: mean ± sample std over seeds, and the 95 % percentile-bootstrap interval;
- with at least five seeds: the IQM and the probability of improvement over the first reference present;
- ``vs <reference>``: the verdict on MeanAcc / WorstAcc (better, tied, worse) of a two-sided paired t-test
  over common seeds, Holm-adjusted over the methods of the table, at level 0.05;
- interval rank on MeanAcc / WorstAcc (1 + the methods whose whole interval lies above);
- ``Σw``: the method's effective step, the mean over evaluations of the sum of the logged task weights, where
  some method's is not 1 (a rule whose weights sum to 1.4 takes 40 % larger steps at the same rates).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from fedhv.results.collect import (
    COMPARISON_STATISTIC,
    Run,
    Stat,
    evaluation_note,
    group,
    method_label,
    ordered_methods,
    ordered_settings,
    setting_label,
)
from fedhv.results.intervals import (
    ALPHA,
    CONFIDENCE,
    MIN_SEEDS_ROBUST,
    RESAMPLES,
    Interval,
    holm,
    interval,
    interval_ranks,
    paired_p,
    probability_of_improvement,
    verdict,
)
from fedhv.results.table_model import Cell, Record, Table

#: The reference methods of the verdicts, by default (those present).
REFERENCES: tuple[str, ...] = ("fedhv", "uniform")
#: (key, label) of the metrics compared; higher is better for both.
METRICS: tuple[tuple[str, str], ...] = (("mean_acc", "MeanAcc"), ("worst_acc", "WorstAcc"))


def _effective_step(run: Run) -> float | None:
    """The mean over the run's evaluations of ``Σ_i w_i`` (the logged weights of the round)."""
    sums = [sum(e["weights"]) for e in run.metrics if isinstance(e.get("weights"), list) and e["weights"]
            and all(isinstance(w, (int, float)) for w in e["weights"])]
    return statistics.fmean(sums) if sums else None


def _ci(iv: Interval | None) -> str:
    if iv is None or iv.low is None or iv.high is None:
        return "–"
    return f"[{iv.low:.2f}, {iv.high:.2f}]"


def table_intervals(runs: Sequence[Run], paper: bool = False,
                    references: Sequence[str] = REFERENCES) -> list[Table]:
    """One interval table per setting (module docstring); ``paper`` is not used (no paper values)."""
    groups = group(runs)
    out = []
    for setting in ordered_settings({s for s, _, _ in groups}):
        methods = ordered_methods({m for s, _, m in groups if s == setting})
        refs = [r for r in dict.fromkeys(references) if r in methods]
        by_seed = {m: {key: {r.seed: v for r in groups[(setting, None, m)] if (v := r.compared(key)) is not None}
                       for key, _ in METRICS} for m in methods}
        ivs = {m: {key: interval(list(vals.values())) if vals else None for key, vals in by_seed[m].items()}
               for m in methods}
        robust = any(iv is not None and iv.n >= MIN_SEEDS_ROBUST for m in methods for iv in ivs[m].values())
        verdicts = {ref: _verdicts(by_seed, methods, ref) for ref in refs}
        ranks = {key: interval_ranks({m: (ivs[m][key].low, ivs[m][key].high) for m in methods  # type: ignore[misc]
                                      if ivs[m][key] is not None and ivs[m][key].low is not None})  # type: ignore[union-attr]
                 for key, _ in METRICS}
        steps = {m: Stat.of(_effective_step(r) for r in groups[(setting, None, m)]) for m in methods}
        show_step = any(s is not None and abs(s.mean - 1.0) > 5e-3 for s in steps.values())
        header = [h for key, label in METRICS for h in (f"{label} ↑", "95 % CI")]
        if robust:
            header += [f"IQM {label}" for _, label in METRICS]
            if refs:
                header += [f"P({label} > {method_label(refs[0])})" for _, label in METRICS]
        header += [f"vs {method_label(ref)}" for ref in refs] + ["interval rank"] + (["Σw"] if show_step else [])
        header += ["seeds"]
        split = {"test": "test", "val": "validation"}[next(iter({r.split for r in runs}), "test")]
        table = Table("intervals", f"Interval estimates, {setting_label(setting)} ({split} set): mean ± std over "
                      f"seeds, {CONFIDENCE:.0%} bootstrap CI, verdicts against "
                      f"{' and '.join(method_label(r) for r in refs) or 'no reference present'}",
                      ["Method"], header, slug=setting)

        order = {m: (statistics.fmean(ranks[key].get(m, len(methods) + 1) for key, _ in METRICS),
                     -sum(iv.mean if (iv := ivs[m][key]) is not None else float("-inf") for key, _ in METRICS))
                 for m in methods}
        for m in sorted(methods, key=order.__getitem__):
            row: list[Cell] = []
            for key, _ in METRICS:
                iv = ivs[m][key]
                stat = None if iv is None else Stat(iv.mean, iv.std, iv.n, iv.values)
                row += [Cell(stat), Cell(text=_ci(iv))]
                table.records.append(Record(setting, m, key, stat))
                if iv is not None and iv.low is not None:
                    table.records.append(Record(setting, m, f"{key}_ci_low", Stat(iv.low, None, iv.n)))
                    table.records.append(Record(setting, m, f"{key}_ci_high", Stat(iv.high, None, iv.n)))
            if robust:
                for key, _ in METRICS:
                    iv = ivs[m][key]
                    row.append(Cell(text="–" if iv is None or iv.iqm is None else f"{iv.iqm:.2f}"))
                if refs:
                    for key, _ in METRICS:
                        x, y = list(by_seed[m][key].values()), list(by_seed[refs[0]][key].values())
                        enough = len(x) >= MIN_SEEDS_ROBUST and len(y) >= MIN_SEEDS_ROBUST and m != refs[0]
                        row.append(Cell(text=f"{probability_of_improvement(x, y):.2f}" if enough else "–"))
            for ref in refs:
                row.append(Cell(text="reference" if m == ref else " / ".join(verdicts[ref][m])))
            row.append(Cell(text=" / ".join(str(ranks[key].get(m, "–")) for key, _ in METRICS)))
            if show_step:
                row.append(Cell(text="–" if steps[m] is None else f"{steps[m].mean:.2f}"))  # type: ignore[union-attr]
            row.append(Cell(text=str(max((ivs[m][k].n for k, _ in METRICS if ivs[m][k] is not None), default=0))))  # type: ignore[union-attr]
            table.add([method_label(m)], row)
        table.note(f"Intervals: {CONFIDENCE:.0%} percentile bootstrap of the mean over seeds ({RESAMPLES} resamples, "
                   "scipy.stats.bootstrap, fixed generator). Verdicts (MeanAcc / WorstAcc): two-sided paired t-test "
                   f"over the seeds both methods ran, Holm-adjusted over the {len(methods) - 1} other methods, better "
                   f"or worse at adjusted p < {ALPHA}, tied otherwise. Interval rank: 1 + the methods whose whole "
                   "interval lies above (overlapping intervals tie).")
        if not robust:
            table.note(f"IQM and probability of improvement are shown from {MIN_SEEDS_ROBUST} seeds on.")
        if show_step:
            table.note("Σw: the effective step, the mean over evaluations of the sum of the round's task weights "
                       "(1 for weights on the simplex).")
        table.note(evaluation_note([r for m in methods for r in groups[(setting, None, m)]], COMPARISON_STATISTIC))
        out.append(table)
    return out


def _verdicts(by_seed: dict[str, dict[str, dict[int, float]]], methods: Sequence[str],
              ref: str) -> dict[str, list[str]]:
    """Per method, its verdict on each metric against ``ref`` (Holm over the methods, per metric)."""
    out: dict[str, list[str]] = {m: [] for m in methods}
    others = [m for m in methods if m != ref]
    for key, _ in METRICS:
        diffs, ps = [], []
        for m in others:
            common = sorted(set(by_seed[m][key]) & set(by_seed[ref][key]))
            x = [by_seed[m][key][s] for s in common]
            y = [by_seed[ref][key][s] for s in common]
            diffs.append(statistics.fmean(x) - statistics.fmean(y) if common else 0.0)
            ps.append(paired_p(x, y))
        for m, d, p in zip(others, diffs, holm(ps)):
            out[m].append(verdict(d, p))
    return out
