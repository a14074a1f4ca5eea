"""The field comparison (``fedhv table --table ranks``): every method of a setting, ranked.

Per setting (and per configuration when runs of one setting differ, e.g. an ``eta_g`` sensitivity sweep):
rows are methods, ordered by their mean rank; columns MeanAcc, WorstAcc and HV (mean ± sample std over
seeds, the evaluation Table 1 reports), the method's rank on MeanAcc and on WorstAcc (1 = best, by the
unrounded means; ties share the average rank), the mean of the two ranks, and the learning rates the runs
used (``eta_g / eta_l``; a method without rates of its own takes those of the method it shares its
trajectory with, ``Method.rates_from``).

With the server learning-rate sweep in the same folder (``fedhv grid ... --seeds 0 --ablation server-lr``:
each method's own ``eta_g`` times 0.5 and 2), a second table per setting gives each method's MeanAcc,
WorstAcc and mean rank at ``x0.5``, ``x1`` (the grid's own seed-0 run) and ``x2``, the ranks taken among the
methods at that factor: whether a ranking survives a factor of two in ``eta_g``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
from fedhv.results.table_model import Cell, Record, Table, rank


def _summary(key: str) -> Callable[[Run], float | None]:
    """``key`` of the run's evaluation under the comparison's statistic (:meth:`Run.compared`)."""
    return lambda run: run.compared(key)


#: (key, column label, getter, higher is better, decimals)
COLUMNS: tuple[tuple[str, str, Callable[[Run], float | None], bool, int], ...] = (
    ("mean_acc", "MeanAcc ↑", _summary("mean_acc"), True, 2),
    ("worst_acc", "WorstAcc ↑", _summary("worst_acc"), True, 2),
    ("hv", "HV ↑", _summary("hv"), True, 3),
)


def ranks(means: dict[str, float], higher_is_better: bool) -> dict[str, float]:
    """Competition ranks ``1 .. n`` of ``means`` (1 = best); tied methods share the average of their places."""
    order = sorted(means, key=lambda m: -means[m] if higher_is_better else means[m])
    out: dict[str, float] = {}
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and means[order[j + 1]] == means[order[i]]:
            j += 1
        for m in order[i:j + 1]:
            out[m] = (i + j) / 2 + 1
        i = j + 1
    return out


def _rates(runs: Sequence[Run]) -> str:
    pairs = {(r.config_value("train.lr_global"), r.config_value("train.lr_local")) for r in runs}
    return ", ".join(f"{g:g} / {lo:g}" for g, lo in sorted(pairs, key=str) if g is not None and lo is not None) or "–"


#: The variant name of the server learning-rate sweep (``fedhv.experiment.grid.RELATIVE_SWEEPS``).
FACTOR = "lr_global_factor"


def _mean_ranks(values: dict[str, tuple[float | None, float | None]]) -> dict[str, float]:
    """Mean of the MeanAcc and WorstAcc ranks among the methods with both values."""
    both = {m: v for m, v in values.items() if v[0] is not None and v[1] is not None}
    first = ranks({m: v[0] for m, v in both.items()}, True)  # type: ignore[misc]
    second = ranks({m: v[1] for m, v in both.items()}, True)  # type: ignore[misc]
    return {m: (first[m] + second[m]) / 2 for m in both}


def table_sensitivity(runs: Sequence[Run]) -> list[Table]:
    """Per setting with sweep runs: MeanAcc, WorstAcc and mean rank at ``eta_g`` x0.5, x1 (seed 0) and x2."""
    swept = [r for r in runs if r.variant is not None and r.variant[0] == FACTOR]
    out = []
    for setting in ordered_settings({r.setting for r in swept}):
        at: dict[float, dict[str, tuple[float | None, float | None]]] = {}
        for r in runs:
            if r.setting != setting or r.seed != 0:
                continue
            if r.variant is None:
                factor = 1.0
            elif r.variant[0] == FACTOR:
                factor = float(r.variant[1])
            else:
                continue
            at.setdefault(factor, {})[r.method] = (_summary("mean_acc")(r), _summary("worst_acc")(r))
        factors = sorted(at)
        methods = ordered_methods({m for r in swept if r.setting == setting for m in [r.method]})
        place = {f: _mean_ranks(at[f]) for f in factors}
        header = [f"{what} ×{f:g}" for what in ("MeanAcc", "WorstAcc", "mean rank") for f in factors]
        table = Table("ranks", f"Server learning rate η_g × factor (seed 0), {setting_label(setting)}", ["Method"],
                      header, slug=f"{setting}-eta")
        for m in methods:
            cells = [Cell(Stat.of([at[f].get(m, (None, None))[k]])) for k in (0, 1) for f in factors]
            cells += [Cell(text="–" if m not in place[f] else f"{place[f][m]:g}") for f in factors]
            table.add([method_label(m)], cells)
            for f in factors:
                table.records.append(Record(setting, m, f"mean_rank_x{f:g}",
                                            None if m not in place[f] else Stat(place[f][m], None, 1)))
        table.note(evaluation_note(swept, COMPARISON_STATISTIC))
        table.notes.append("Each method at its own η_g (×1, the comparison grid's seed-0 run) and at half and twice "
                           "it (fedhv grid --seeds 0 --ablation server-lr); ranks among the methods at each factor.")
        out.append(table)
    return out


def table_ranks(runs: Sequence[Run], paper: bool = False) -> list[Table]:
    """One ranking table per setting, and the learning-rate sensitivity where its runs are present
    (see the module docstring); ``paper`` is not used (no paper values)."""
    groups = group(runs)
    out = []
    for setting in ordered_settings({s for s, _, _ in groups}):
        methods = ordered_methods({m for s, _, m in groups if s == setting})
        stats = {m: {key: Stat.of(get(r) for r in groups[(setting, None, m)]) for key, _, get, _, _ in COLUMNS}
                 for m in methods}
        place: dict[str, dict[str, float]] = {}
        for key, _, _, higher, _ in COLUMNS[:2]:
            means = {m: s[key].mean for m, s in stats.items() if s[key] is not None}  # type: ignore[union-attr]
            place[key] = ranks(means, higher)
        mean_rank = {m: (place["mean_acc"][m] + place["worst_acc"][m]) / 2 for m in methods
                     if m in place["mean_acc"] and m in place["worst_acc"]}
        table = Table("ranks", f"Every method ranked, {setting_label(setting)}: MeanAcc, WorstAcc (%) and HV, mean ± "
                      "sample std over seeds", ["Method"],
                      [label for _, label, _, _, _ in COLUMNS] + ["rank MeanAcc", "rank WorstAcc", "mean rank",
                                                                 "seeds", "η_g / η_l"], slug=setting)
        cells_by_column: dict[str, list[Cell]] = {key: [] for key, _, _, _, _ in COLUMNS}
        for m in sorted(methods, key=lambda m: (mean_rank.get(m, float("inf")), methods.index(m))):
            rs = groups[(setting, None, m)]
            row = [Cell(stats[m][key], digits=digits) for key, _, _, _, digits in COLUMNS]
            for (key, _, _, _, _), cell in zip(COLUMNS, row):
                cells_by_column[key].append(cell)
                table.records.append(Record(setting, m, key, cell.stat))
            for key in ("mean_acc", "worst_acc"):
                r = place[key].get(m)
                table.records.append(Record(setting, m, f"rank_{key}", None if r is None else Stat(r, None, 1)))
            row += [Cell(text="–" if m not in place[k] else f"{place[k][m]:g}") for k in ("mean_acc", "worst_acc")]
            row += [Cell(text="–" if m not in mean_rank else f"{mean_rank[m]:g}"), Cell(text=str(len(rs))),
                    Cell(text=_rates(rs))]
            table.add([method_label(m)], row)
        for key, _, _, higher, _ in COLUMNS:
            rank(cells_by_column[key], higher)
        table.notes.append(f"{len(methods)} methods; rows by mean rank (the mean of the MeanAcc and WorstAcc ranks, "
                           "1 = best, ties share the average place). Bold: best, underlined: second best. "
                           "Learning rates: a method without [lr.<method>] in the setting takes those of the method "
                           "whose trajectory it shares (loss-only methods FedHV's, FSMGDA-exchange methods FSMGDA's, "
                           "FedCMOO-exchange methods FedCMOO's; Method.rates_from).")
        table.note(evaluation_note([r for m in methods for r in groups[(setting, None, m)]], COMPARISON_STATISTIC))
        out.append(table)
    return out + table_sensitivity(runs)
