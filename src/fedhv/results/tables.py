"""The paper's result tables from run directories (Tables 1, 7, 8, 9, 10, 11, 12, 13) and the
diagnostics tables (``fairness``, ``theory``: :mod:`fedhv.results.tables_extra`).

Every number is computed from the files of finished runs: final metrics (Tables 1, 8, 9,
10) from the last scheduled test evaluation in ``metrics.jsonl`` as in paper B.5
(:attr:`~fedhv.results.collect.Run.reported`; ``--statistic final``: the evaluation after
the last round, ``--statistic last10``: the mean of the last ten scheduled ones; ``--split val``:
the validation set's), Table 11 from the last ten scheduled evaluations in ``metrics.jsonl``. Values are
mean ± sample standard deviation over the seeds found; best / second-best marks are
ranked on the unrounded means. With ``paper=True`` each row is followed by the paper's
published value (``paper_tables.json``) and our difference to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from fedhv.results.collect import (
    Run,
    Stat,
    evaluation_note,
    group,
    method_label,
    ordered_methods,
    ordered_settings,
    setting_label,
    variant_order,
)
from fedhv.results.paper_data import paper_stat, paper_value, setting_differences
from fedhv.results.table_model import Cell, Record, Table, rank
from fedhv.results.tables_extra import table12, table_fairness, table_theory
from fedhv.results.tables_field import table_ranks
from fedhv.results.tables_front import table_front, table_margin
from fedhv.results.tables_intervals import REFERENCES, table_intervals

TABLES: tuple[str, ...] = ("1", "8", "9", "11", "7", "10", "12", "13", "fairness", "theory")
#: Tables made only when named (``--table ranks``), not by ``--table all``: the field comparison and the fronts.
EXTRA_TABLES: tuple[str, ...] = ("ranks", "intervals", "front", "margin")
#: The methods the paper ranks in Tables 9 and 11 (it has no Uniform column there).
PAPER_RANKED: tuple[str, ...] = ("fsmgda", "fedcmoo", "fedhv")
#: Label of the difference row that replaces Δ when the runs' setting is not the paper's.
NO_DELTA = "Δ n/a: setting differs"


@dataclass(frozen=True)
class Metric:
    """A per-run scalar: name (paper data key), column label, getter, direction, decimals."""

    key: str
    label: str
    get: Callable[[Run], float | None]
    higher_is_better: bool
    digits: int = 2


def _summary(key: str) -> Callable[[Run], float | None]:
    """``key`` of the evaluation a final-result table reports (:attr:`Run.reported`: paper B.5's
    last scheduled one unless ``--statistic`` says otherwise)."""
    return lambda run: run.reported.get(key)


def _last10(run: Run) -> float | None:
    """Table 11's value: MeanAcc averaged over the last ten scheduled evaluations."""
    return run.evaluation("last10").get("mean_acc")


MEAN_ACC = Metric("mean_acc", "MeanAcc ↑", _summary("mean_acc"), True)
WORST_ACC = Metric("worst_acc", "WorstAcc ↑", _summary("worst_acc"), True)
MEAN_LOSS = Metric("mean_loss", "MeanLoss ↓", _summary("mean_loss"), False, 4)
HV = Metric("hv", "HV ↑", _summary("hv"), True, 3)
LAST10 = Metric("last10_mean_acc", "MeanAcc, last 10 evals ↑", _last10, True)


def _stat(runs: Sequence[Run], get: Callable[[Run], float | None]) -> Stat | None:
    return Stat.of(v for v in (get(r) for r in runs) if v is not None)


def _diff_cell(ours: Cell, theirs: Cell) -> Cell:
    if ours.stat is None or theirs.stat is None:
        return Cell(text="")
    return Cell(text=f"{ours.stat.mean - theirs.stat.mean:+.{ours.digits}f}")


def _with_paper(table: Table, labels: list[str], ours: list[Cell], theirs: list[Cell] | None,
                differs: Sequence[str] = ()) -> None:
    """Our row, then (with ``theirs``) the paper's row and our difference to it.

    When ``differs`` lists how the runs' setting differs from the paper's, the difference
    row says so (:data:`NO_DELTA`) instead of showing numbers that compare unlike runs.
    """
    table.add(labels, ours)
    if theirs is not None and any(c.stat is not None or c.text for c in theirs):
        pad = [""] * (len(labels) - 1)
        table.add([*pad, "paper"], theirs)
        if differs:
            table.add([*pad, NO_DELTA], [Cell(text="n/a") for _ in ours])
        else:
            table.add([*pad, "Δ (ours − paper)"], [_diff_cell(o, t) for o, t in zip(ours, theirs)])


def _paper_check(table: Table, runs: Sequence[Run], setting: str, paper: bool, ignore: Sequence[str] = (),
                 overrides: dict[str, Any] | None = None) -> list[str]:
    """With ``paper``: how ``runs`` differ from the paper's ``setting``, noted in ``table`` and warned."""
    if not paper:
        return []
    differs = setting_differences(runs, setting, ignore, overrides)
    if differs:
        what = "; ".join(differs)
        table.note(f"{setting_label(setting)}: no Δ to the paper: these runs differ from the paper's setting "
                   f"({what}); the paper row is for reference only.")
        warning = (f"--paper: {setting}: the runs differ from the paper's setting ({what}); Δ rows are not shown, "
                   "run the preset unchanged to compare")
        if warning not in table.warnings:
            table.warnings.append(warning)
    return differs


def _record(table: Table, setting: str, method: str, metric: str, ours: Cell, theirs: Cell | None = None) -> None:
    table.records.append(Record(setting, method, metric, ours.stat, None if theirs is None else theirs.stat))


def _rank_note(present: Sequence[str], ranked: Sequence[str] = PAPER_RANKED) -> str:
    """What the best / second-best marks of a table rank among, given the methods present."""
    among = [m for m in present if m in ranked]
    paper = ", ".join(method_label(m) for m in ranked[:-1]) + f" and {method_label(ranked[-1])}"
    if len(among) >= 2:
        names = ", ".join(method_label(m) for m in among)
        rest = [method_label(m) for m in present if m not in ranked]
        unranked = f"; {', '.join(rest)} not ranked" if rest else ""
        return (f"Bold: best, underlined: second best among {names} (the paper ranks {paper}){unranked}, "
                "on unrounded means.")
    have = f"only {method_label(among[0])} of them" if among else "none of them"
    return f"No best / second-best marks: the paper ranks {paper}, and these runs have {have}."


#: Above this many methods a settings-by-methods table is drawn transposed (one row per method, a column per
#: setting and metric), unless the paper's rows are asked for: 23 methods x 2 metrics do not fit one row.
WIDE_METHODS = 6


def _by_setting_and_method(key: str, title: str, runs: Sequence[Run], metrics: Sequence[Metric],
                           paper: bool, methods_ranked: Sequence[str] | None = None) -> Table:
    """Rows = settings; columns = methods x metrics; ranks per metric among ``methods_ranked``.
    More than :data:`WIDE_METHODS` methods (without ``paper``): rows = methods, columns = settings x metrics."""
    groups = group(runs)
    settings = ordered_settings({s for s, _, _ in groups})
    methods = ordered_methods({m for _, _, m in groups})
    long = len(methods) > WIDE_METHODS and not paper
    if long:
        header = [f"{setting_label(s)} {x.label}" for s in settings for x in metrics]
        table = Table(key, title, ["Method"], header)
    else:
        header = [f"{method_label(m)} {x.label}" if len(metrics) > 1 else method_label(m) for m in methods
                  for x in metrics]
        table = Table(key, title, ["Setting"], header)
    by_setting: list[list[Cell]] = []
    for setting in settings:
        cells = []
        for m in methods:
            rs = groups.get((setting, None, m), [])
            cells += [Cell(_stat(rs, x.get), digits=x.digits) for x in metrics]
        for j, x in enumerate(metrics):
            candidates = [cells[i * len(metrics) + j] for i, m in enumerate(methods)
                          if methods_ranked is None or m in methods_ranked]
            rank(candidates, x.higher_is_better)
        theirs = [Cell(paper_stat(f"table{key}", setting, m, x.key), digits=x.digits)
                  for m in methods for x in metrics]
        for i, (m, x) in enumerate((m, x) for m in methods for x in metrics):
            if groups.get((setting, None, m)):
                _record(table, setting, m, x.key, cells[i], theirs[i])
        by_setting.append(cells)
        if not long:
            differs = _paper_check(table, [r for (s, _, _), g in groups.items() if s == setting for r in g], setting,
                                   paper)
            _with_paper(table, [setting_label(setting)], cells, theirs if paper else None, differs)
    if long:
        k = len(metrics)
        for i, m in enumerate(methods):
            table.add([method_label(m)], [cells[i * k + j] for cells in by_setting for j in range(k)])
    return table


def table1(runs: Sequence[Run], paper: bool = False) -> Table:
    t = _by_setting_and_method("1", "Table 1: final MeanAcc and WorstAcc (%), mean ± sample std over seeds",
                               runs, [MEAN_ACC, WORST_ACC], paper)
    t.notes.append("Bold: best, underlined: second best among the methods shown, ranked on unrounded means.")
    t.note(evaluation_note([r for r in runs if r.variant is None]))
    return t


def _hv_offsets(runs: Sequence[Run]) -> list[str]:
    """The HV offsets the runs' ``summary.json`` record (``eval.hv_reference``), each once; runs written before
    the offset was configurable used the paper's 3 for every task."""
    seen: list[str] = []
    for r in runs:
        ref = r.summary.get("hv_reference")
        numbers = isinstance(ref, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in ref)
        text = "3·1" if not numbers or all(v == 3 for v in ref) else "[" + ", ".join(f"{v:g}" for v in ref) + "]"
        if text not in seen:
            seen.append(text)
    return seen or ["3·1"]


def table8(runs: Sequence[Run], paper: bool = False) -> Table:
    offsets = _hv_offsets(runs)
    t = _by_setting_and_method("8", f"Table 8: final MeanLoss and HV (r_eval = {' / '.join(offsets)}), mean ± "
                               "sample std over seeds", runs, [MEAN_LOSS, HV], paper)
    if offsets == ["3·1"]:
        t.notes.append("HV uses the common evaluation reference 3·1_m, not FedHV's training reference.")
    else:
        t.notes.append(f"HV = Π max(r_eval,i − ℓ_i, 0) with each run's eval.hv_reference ({', '.join(offsets)}; "
                       "summary.json hv_reference), not FedHV's training reference.")
    t.note(evaluation_note([r for r in runs if r.variant is None]))
    return t


def table11(runs: Sequence[Run], paper: bool = False) -> Table:
    """MeanAcc over the last ten scheduled evaluations; title and notes say how many the runs have."""
    counts = sorted({len(r.last_scheduled(10)) for r in runs if r.variant is None}) or [0]
    n = "ten" if counts[0] >= 10 else f"{counts[0]}–{counts[-1]}" if counts[0] != counts[-1] else str(counts[0])
    t = _by_setting_and_method("11", f"Table 11: MeanAcc averaged over the final {n} scheduled test evaluations",
                               runs, [LAST10], paper, methods_ranked=PAPER_RANKED)
    if n != "ten":
        t.note(f"These runs have only {n} scheduled test evaluations, so each value averages {n} evaluations, "
               "not the paper's final ten.")
    t.note("Scheduled evaluations are rounds that are multiples of eval.test_period.")
    t.note(_rank_note(ordered_methods({r.method for r in runs if r.variant is None})))
    return t


def _task_value(key: str, i: int) -> Callable[[Run], float | None]:
    def get(run: Run) -> float | None:
        values = run.reported.get(key) or []
        return values[i] if i < len(values) else None

    return get


def table9(runs: Sequence[Run], paper: bool = False) -> list[Table]:
    """One table per setting: per-task accuracy and loss by method."""
    groups = group(runs)
    out = []
    for setting in ordered_settings({s for s, _, _ in groups}):
        methods = ordered_methods({m for s, _, m in groups if s == setting})
        tasks = next(iter(groups[(setting, None, methods[0])])).summary.get("tasks") or []
        header = [f"{t} acc ↑" for t in tasks] + [f"{t} loss ↓" for t in tasks]
        table = Table("9", f"Table 9: per-task test accuracy (%) and loss, {setting_label(setting)}",
                      ["Method"], header, slug=setting)
        differs = _paper_check(table, [r for m in methods for r in groups[(setting, None, m)]], setting, paper)
        columns: list[list[Cell]] = [[] for _ in header]
        for m in methods:
            rs = groups[(setting, None, m)]
            cells = [Cell(_stat(rs, _task_value("task_acc", i))) for i in range(len(tasks))]
            cells += [Cell(_stat(rs, _task_value("task_loss", i)), digits=3) for i in range(len(tasks))]
            if m in PAPER_RANKED:
                for j, c in enumerate(cells):
                    columns[j].append(c)
            theirs = [Cell(paper_stat("table9", setting, m, "task_acc", i)) for i in range(len(tasks))]
            theirs += [Cell(paper_stat("table9", setting, m, "task_loss", i), digits=3) for i in range(len(tasks))]
            names = [f"task_acc[{t}]" for t in tasks] + [f"task_loss[{t}]" for t in tasks]
            for name, ours, their in zip(names, cells, theirs):
                _record(table, setting, m, name, ours, their)
            _with_paper(table, [method_label(m)], cells, theirs if paper else None, differs)
        for j, col in enumerate(columns):
            rank(col, j < len(tasks))
        table.note(_rank_note(methods))
        table.note(evaluation_note([r for m in methods for r in groups[(setting, None, m)]]))
        out.append(table)
    return out


ABLATION_LABELS = {"report_batches": "B_rep", "clients_per_round": "M", "local_steps": "K"}


def _table7_cells(rs: Sequence[Run]) -> list[Cell]:
    """Reference, min report slack, min stabilised slack, floor activations (count / checks and %), seeds."""
    slacks = [r.summary["min_report_slack"] for r in rs if r.summary.get("min_report_slack") is not None]
    active = sum(int(r.summary.get("floor_activations") or 0) for r in rs)
    checks = sum(int(r.summary.get("floor_checks") or 0) for r in rs)
    rho = [float(r.config_value("fedhv.rho_clip", 1e-6)) for r in rs]
    # the weight map uses max(r_i - F_i^t, rho_clip): its smallest value over rounds, tasks and seeds
    stabilised = [max(s, c) for s, c in zip(slacks, rho)]
    ref = rs[0].summary.get("reference") or []
    rate = f" ({100 * active / checks:.2g} %)" if checks and active else ""
    return [Cell(text="(" + ", ".join(f"{v:.4f}" if v is not None else "–" for v in ref) + ")"),
            Cell(text=f"{min(slacks):.4f}" if slacks else "–"),
            Cell(text=f"{min(stabilised):.4g}" if stabilised else "–"),
            Cell(text=f"{active}/{checks}{rate}"), Cell(text=str(len(rs)))]


def table7(runs: Sequence[Run], paper: bool = False) -> Table:
    """FedHV reference diagnostics: minimum report slack, minimum stabilised slack and floor activations
    over all seeds, for the standard runs and (paper C.7) each FedHV ablation variant."""
    groups = group(runs)
    table = Table("7", "Table 7: FedHV reference diagnostics over all adaptive rounds and seeds", ["Setting"],
                  ["reference r", "min report slack", "min stabilised slack", "floor activations", "seeds"])
    for setting in ordered_settings({s for s, _, m in groups if m == "fedhv"}):
        rs = groups[(setting, None, "fedhv")]
        cells = _table7_cells(rs)
        ref_p = paper_value("table6", setting)
        slack_p = paper_value("table7", setting, "min_report_slack")
        floor_p = str(paper_value("table7", setting, "floor_activations") or "")
        _table7_records(table, setting, rs, ref_p, slack_p, floor_p)
        table.add([setting_label(setting)], cells)
        if paper:
            _paper_check(table, rs, setting, paper)
            table.add(["paper (Tables 6, 7)"],
                      [Cell(text="(" + ", ".join(f"{v:.4f}" for v in ref_p) + ")" if ref_p else "–"),
                       Cell(text=f"{slack_p:.4f}" if slack_p is not None else "–"), Cell(text="–"),
                       Cell(text=floor_p or "–"), Cell(text="3")])
    variants = group(runs, with_variants=True)
    for setting, variant, _ in sorted((k for k in variants if k[2] == "fedhv"),
                                      key=lambda k: (ordered_settings([k[0]]), str(k[1][0]), variant_order(k[1]))):
        rs = variants[(setting, variant, "fedhv")]
        name = f"{ABLATION_LABELS.get(variant[0].split('.')[-1], variant[0].split('.')[-1])} = {variant[1]}"
        cells = _table7_cells(rs)
        table.add([f"{setting_label(setting)}, {name}"], cells)
        where = f"{setting}/{variant[0].split('.')[-1]}={variant[1]}"
        _table7_records(table, where, rs, None, None, "")
        if paper and setting == "cifar10-mnist-b" and variant == ("train.local_steps", 1):
            table.add(["paper C.7 (K = 1)"], [Cell(text="–"), Cell(text="–"), Cell(text="1e-06"),
                                              Cell(text="≈ 0.2 %"), Cell(text="3")])
    table.notes.append("Minimum report slack: min over rounds, tasks and seeds of r_i − F_i^t (server-averaged report); "
                       "minimum stabilised slack: min of max(r_i − F_i^t, ρ_clip), the slack the weight map uses "
                       "(paper C.7). Rows 'setting, X = v' are FedHV ablation variants (fedhv grid --ablation).")
    return table


def _table7_records(table: Table, setting: str, rs: Sequence[Run], ref_p: Any, slack_p: Any, floor_p: str) -> None:
    """Table 7 in long form: reference per task, minimum slack, floor activations and checks."""
    tasks = rs[0].summary.get("tasks") or []
    refs = [r.summary.get("reference") or [] for r in rs]
    for i, task in enumerate(tasks):
        theirs = Stat(float(ref_p[i]), None, 3) if isinstance(ref_p, list) and i < len(ref_p) else None
        table.records.append(Record(setting, "fedhv", f"reference[{task}]",
                                    Stat.of(ref[i] if i < len(ref) else None for ref in refs), theirs))
    slacks = [float(r.summary["min_report_slack"]) for r in rs if r.summary.get("min_report_slack") is not None]
    table.records.append(Record(setting, "fedhv", "min_report_slack",
                                Stat(min(slacks), None, len(slacks)) if slacks else None,
                                None if slack_p is None else Stat(float(slack_p), None, 3)))
    stabilised = [max(float(r.summary["min_report_slack"]), float(r.config_value("fedhv.rho_clip", 1e-6)))
                  for r in rs if r.summary.get("min_report_slack") is not None]
    table.records.append(Record(setting, "fedhv", "min_stabilised_slack",
                                Stat(min(stabilised), None, len(stabilised)) if stabilised else None))
    count, _, total = floor_p.partition("/")
    for name, key, their in (("floor_activations", "floor_activations", count), ("floor_checks", "floor_checks", total)):
        ours = Stat(float(sum(int(r.summary.get(key) or 0) for r in rs)), None, len(rs))
        table.records.append(Record(setting, "fedhv", name, ours,
                                    Stat(float(their), None, 3) if their.strip().isdigit() else None))


def table10(runs: Sequence[Run], paper: bool = False) -> Table:
    """FedHV ablation sweeps (runs made with ``fedhv grid --ablation``)."""
    groups = group(runs, with_variants=True)
    standard = group(runs)
    table = Table("10", "Table 10: FedHV ablations, mean ± sample std over seeds", ["Setting", "Ablation", "Variant"],
                  [MEAN_ACC.label, MEAN_LOSS.label])
    keys = sorted({(s, v[0]) for s, v, m in groups if m == "fedhv" and v is not None},
                  key=lambda k: (ordered_settings([k[0]]), k[1]))
    missing = []
    for setting, param in keys:
        name = param.split(".")[-1]
        variants = [v for s, v, m in groups if s == setting and m == "fedhv" and v is not None and v[0] == param]
        # The baseline: the setting's standard FedHV runs, at their configured value of the parameter
        # (a row of its own unless a variant has that value); without them the sweep stands alone.
        base_runs = standard.get((setting, None, "fedhv"), [])
        base = (param, base_runs[0].config_value(param)) if base_runs else None
        if base is None:
            missing.append(f"{setting_label(setting)} ({name})")
        elif base not in variants:
            variants.append(base)
        variants.sort(key=variant_order)
        col_acc, col_loss = [], []
        for variant in variants:
            is_base = variant == base and (setting, variant, "fedhv") not in groups
            rs = base_runs if is_base else groups[(setting, variant, "fedhv")]
            cells = [Cell(_stat(rs, MEAN_ACC.get)), Cell(_stat(rs, MEAN_LOSS.get), digits=4)]
            col_acc.append(cells[0])
            col_loss.append(cells[1])
            if is_base:
                table.add([setting_label(setting), ABLATION_LABELS.get(name, name), f"{variant[1]} (baseline)"],
                          cells)
                for metric, ours in zip(("mean_acc", "mean_loss"), cells):
                    _record(table, f"{setting}/{name}={variant[1]} (baseline)", "fedhv", metric, ours, None)
                continue
            theirs = None
            if setting == "cifar10-mnist-b":  # the paper's ablations are on this setting only
                theirs = [Cell(paper_stat("table10", name, str(variant[1]), "mean_acc")),
                          Cell(paper_stat("table10", name, str(variant[1]), "mean_loss"), digits=4)]
            where = f"{setting}/{name}={variant[1]}"
            their_cells: list[Cell | None] = list(theirs) if theirs else [None, None]
            for metric, ours, their in zip(("mean_acc", "mean_loss"), cells, their_cells):
                _record(table, where, "fedhv", metric, ours, their)
            differs = _paper_check(table, rs, setting, paper and theirs is not None, ignore=(param,))
            _with_paper(table, [setting_label(setting), ABLATION_LABELS.get(name, name), str(variant[1])], cells,
                        theirs if paper else None, differs)
        rank(col_acc, True)
        rank(col_loss, False)
    table.notes.append("Ranks within each sweep. The paper's ablations (and so its values, with --paper) are for "
                       "CIFAR10–MNIST α = 0.30 (cifar10-mnist-b) only.")
    if missing:
        table.notes.append("No baseline (the standard FedHV runs of the setting, at their configured value) among "
                           f"these runs for: {', '.join(missing)}; those sweeps are shown without one (run the "
                           "setting's standard FedHV seeds into the same directory, e.g. fedhv grid SETTING "
                           "--methods fedhv).")
    table.note(evaluation_note([r for (_, v, m), rs in groups.items() if m == "fedhv" and v is not None for r in rs]))
    return table


def _mb(value: float | None) -> float | None:
    return None if value is None else value / 1e6


def table13(runs: Sequence[Run], paper: bool = False) -> list[Table]:
    """Wall-clock and payloads per setting; FedHV's totals include its calibration."""
    groups = group(runs)
    out = []
    for setting in ordered_settings({s for s, _, _ in groups}):
        methods = ordered_methods({m for s, _, m in groups if s == setting})
        table = Table("13", f"Table 13: end-to-end cost, {setting_label(setting)}", ["Method"], [
            "total wall-clock (s)", "calibration (s)", "MB down / up per client per round",
            "MB down / up per round, all M clients", "GB down / up in total",
        ], slug=setting)
        # Table 13 reports 300 adaptive rounds of cifar10-mnist-b (its caption), not Table 4's 500.
        differs = _paper_check(table, [r for m in methods for r in groups[(setting, None, m)]], setting,
                               paper and setting == "cifar10-mnist-b", overrides={"rounds": 300})
        time_cells = []
        for m in methods:
            rs = groups[(setting, None, m)]
            e2e = [r.summary.get("end_to_end") or {} for r in rs]
            total = Cell(Stat.of(x.get("wall_clock_s") for x in e2e), digits=1)
            time_cells.append(total)
            cal = Stat.of((r.summary.get("calibration") or {}).get("seconds") for r in rs)
            s0 = rs[0].summary
            per_client = (_mb(s0.get("bytes_down_per_client_round")), _mb(s0.get("bytes_up_per_client_round")))
            clients = int(rs[0].config_value("train.clients_per_round", 0) or 0)
            gb = (Stat.of((x.get("bytes_down") or 0) / 1e9 for x in e2e), Stat.of((x.get("bytes_up") or 0) / 1e9
                                                                                  for x in e2e))
            cells = [
                total,
                Cell(cal, digits=1) if cal is not None else Cell(text="–"),
                Cell(text=" / ".join(f"{v:.3f}" for v in per_client if v is not None)),
                Cell(text=" / ".join(f"{v * clients:.2f}" for v in per_client if v is not None)),
                Cell(text=" / ".join(f"{g.mean:.2f}" for g in gb if g is not None)),
            ]
            theirs = None
            down = up = None
            if setting == "cifar10-mnist-b" and paper_value("table13", m) is not None:
                down = paper_value("table13", m, "downlink_mb_per_client")
                up = paper_value("table13", m, "uplink_mb_per_client")
                theirs = [Cell(paper_stat("table13", m, "total_wall_clock_s"), digits=2), Cell(text=""),
                          Cell(text=""), Cell(text=f"{down} / {up}"), Cell(text="")]
            _table13_records(table, setting, m, rs, clients, total, cal, down, up,
                             theirs[0] if theirs else None)
            _with_paper(table, [method_label(m)], cells, theirs if paper else None, differs)
        rank(time_cells, False)
        table.notes.append("FedHV's wall-clock and totals include its calibration. The paper's Table 13 "
                           "'per client' MB equal one round summed over the M = 10 clients (10 × 6.906 MB); "
                           "compare them with the 'all M clients' column. Paper: CIFAR10–MNIST α = 0.30, 300 rounds.")
        out.append(table)
    return out


def _table13_records(table: Table, setting: str, method: str, rs: Sequence[Run], clients: int, total: Cell,
                     cal: Stat | None, down: Any, up: Any, their_total: Cell | None) -> None:
    """Table 13 in long form (MB per client per round and per round over the M clients, GB totals)."""
    _record(table, setting, method, "total_wall_clock_s", total, their_total)
    table.records.append(Record(setting, method, "calibration_s", cal))
    e2e = [r.summary.get("end_to_end") or {} for r in rs]
    for way, paper_mb in (("down", down), ("up", up)):
        per_client = Stat.of(_mb(r.summary.get(f"bytes_{way}_per_client_round")) for r in rs)
        per_round = Stat.of(None if v is None else v * clients for v in (per_client.values if per_client else ()))
        table.records += [
            Record(setting, method, f"mb_{way}_per_client_round", per_client),
            Record(setting, method, f"mb_{way}_per_round_all_clients", per_round,
                   None if paper_mb is None else Stat(float(paper_mb), None, 3)),
            Record(setting, method, f"gb_{way}_total", Stat.of((x.get(f"bytes_{way}") or 0) / 1e9 for x in e2e)),
        ]


def build_tables(runs: Sequence[Run], which: Sequence[str] = TABLES, paper: bool = False,
                 references: Sequence[str] = REFERENCES) -> list[Table]:
    """The requested tables that have data; ``references``: the methods the ``intervals`` table's verdicts
    compare with."""
    builders: dict[str, Callable[[Sequence[Run], bool], Any]] = {
        "1": table1, "8": table8, "9": table9, "11": table11, "7": table7, "10": table10, "13": table13,
        "12": table12, "fairness": table_fairness, "theory": table_theory, "ranks": table_ranks,
        "intervals": partial(table_intervals, references=references), "front": table_front, "margin": table_margin,
    }
    out: list[Table] = []
    for key in which:
        built = builders[key](runs, paper)
        for t in built if isinstance(built, list) else [built]:
            if t.rows:
                out.append(t)
    return out
