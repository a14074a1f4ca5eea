"""The paper's result tables from run directories (Tables 1, 7, 8, 9, 10, 11, 13).

Every number is computed from the files of finished runs: final metrics from
``summary.json``, the last ten scheduled evaluations from ``metrics.jsonl``. Values are
mean ± sample standard deviation over the seeds found; best / second-best marks are
ranked on the unrounded means. With ``paper=True`` each row is followed by the paper's
published value (``paper_tables.json``) and our difference to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fedhv.results.collect import (
    Run,
    Stat,
    group,
    method_label,
    ordered_methods,
    ordered_settings,
    setting_label,
)
from fedhv.results.paper_data import paper_stat, paper_value
from fedhv.results.table_model import Cell, Table, rank

TABLES: tuple[str, ...] = ("1", "8", "9", "11", "7", "10", "13")


@dataclass(frozen=True)
class Metric:
    """A per-run scalar: name (paper data key), column label, getter, direction, decimals."""

    key: str
    label: str
    get: Callable[[Run], float | None]
    higher_is_better: bool
    digits: int = 2


def _summary(key: str) -> Callable[[Run], float | None]:
    return lambda run: run.summary.get(key)


def _last10(run: Run) -> float | None:
    entries = [e["mean_acc"] for e in run.last_scheduled(10) if e.get("mean_acc") is not None]
    return sum(entries) / len(entries) if entries else None


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


def _with_paper(table: Table, labels: list[str], ours: list[Cell], theirs: list[Cell] | None) -> None:
    table.add(labels, ours)
    if theirs is not None and any(c.stat is not None or c.text for c in theirs):
        table.add([*[""] * (len(labels) - 1), "paper"], theirs)
        table.add([*[""] * (len(labels) - 1), "Δ (ours − paper)"], [_diff_cell(o, t) for o, t in zip(ours, theirs)])


def _by_setting_and_method(key: str, title: str, runs: Sequence[Run], metrics: Sequence[Metric],
                           paper: bool, methods_ranked: Sequence[str] | None = None) -> Table:
    """Rows = settings; columns = methods x metrics; ranks per metric among ``methods_ranked``."""
    groups = group(runs)
    settings = ordered_settings({s for s, _, _ in groups})
    methods = ordered_methods({m for _, _, m in groups})
    header = [f"{method_label(m)} {x.label}" if len(metrics) > 1 else method_label(m) for m in methods
              for x in metrics]
    table = Table(key, title, ["Setting"], header)
    for setting in settings:
        cells = []
        for m in methods:
            rs = groups.get((setting, None, m), [])
            cells += [Cell(_stat(rs, x.get), digits=x.digits) for x in metrics]
        for j, x in enumerate(metrics):
            candidates = [cells[i * len(metrics) + j] for i, m in enumerate(methods)
                          if methods_ranked is None or m in methods_ranked]
            rank(candidates, x.higher_is_better)
        theirs = None
        if paper:
            theirs = [Cell(paper_stat(f"table{key}", setting, m, x.key), digits=x.digits)
                      for m in methods for x in metrics]
        _with_paper(table, [setting_label(setting)], cells, theirs)
    return table


def table1(runs: Sequence[Run], paper: bool = False) -> Table:
    t = _by_setting_and_method("1", "Table 1: final MeanAcc and WorstAcc (%), mean ± sample std over seeds",
                               runs, [MEAN_ACC, WORST_ACC], paper)
    t.notes.append("Bold: best, underlined: second best among the methods shown, ranked on unrounded means.")
    return t


def table8(runs: Sequence[Run], paper: bool = False) -> Table:
    t = _by_setting_and_method("8", "Table 8: final MeanLoss and HV (r_eval = 3·1), mean ± sample std over seeds",
                               runs, [MEAN_LOSS, HV], paper)
    t.notes.append("HV uses the common evaluation reference 3·1_m, not FedHV's training reference.")
    return t


def table11(runs: Sequence[Run], paper: bool = False) -> Table:
    t = _by_setting_and_method("11", "Table 11: MeanAcc averaged over the final ten scheduled test evaluations",
                               runs, [LAST10], paper, methods_ranked=("fsmgda", "fedcmoo", "fedhv"))
    t.notes.append("Scheduled evaluations are rounds that are multiples of eval.test_period; ranks among FSMGDA, "
                   "FedCMOO and FedHV as in the paper.")
    return t


def _task_value(key: str, i: int) -> Callable[[Run], float | None]:
    def get(run: Run) -> float | None:
        values = run.summary.get(key) or []
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
                      ["Method"], header)
        columns: list[list[Cell]] = [[] for _ in header]
        for m in methods:
            rs = groups[(setting, None, m)]
            cells = [Cell(_stat(rs, _task_value("task_acc", i))) for i in range(len(tasks))]
            cells += [Cell(_stat(rs, _task_value("task_loss", i)), digits=3) for i in range(len(tasks))]
            if m in ("fsmgda", "fedcmoo", "fedhv"):
                for j, c in enumerate(cells):
                    columns[j].append(c)
            theirs = None
            if paper:
                theirs = [Cell(paper_stat("table9", setting, m, "task_acc", i)) for i in range(len(tasks))]
                theirs += [Cell(paper_stat("table9", setting, m, "task_loss", i), digits=3) for i in range(len(tasks))]
            _with_paper(table, [method_label(m)], cells, theirs)
        for j, col in enumerate(columns):
            rank(col, j < len(tasks))
        table.notes.append("Ranks among FSMGDA, FedCMOO and FedHV, as in the paper.")
        out.append(table)
    return out


def table7(runs: Sequence[Run], paper: bool = False) -> Table:
    """FedHV reference diagnostics: minimum report slack and floor activations over all seeds."""
    groups = group(runs)
    table = Table("7", "Table 7: FedHV reference diagnostics over all adaptive rounds and seeds", ["Setting"],
                  ["reference r", "min report slack", "floor activations", "seeds"])
    for setting in ordered_settings({s for s, _, m in groups if m == "fedhv"}):
        rs = groups[(setting, None, "fedhv")]
        slacks = [r.summary["min_report_slack"] for r in rs if r.summary.get("min_report_slack") is not None]
        active = sum(int(r.summary.get("floor_activations") or 0) for r in rs)
        checks = sum(int(r.summary.get("floor_checks") or 0) for r in rs)
        ref = rs[0].summary.get("reference") or []
        cells = [Cell(text="(" + ", ".join(f"{v:.4f}" if v is not None else "–" for v in ref) + ")"),
                 Cell(text=f"{min(slacks):.4f}" if slacks else "–"),
                 Cell(text=f"{active}/{checks}"), Cell(text=str(len(rs)))]
        theirs = None
        if paper:
            ref_p = paper_value("table6", setting)
            slack_p = paper_value("table7", setting, "min_report_slack")
            theirs = [Cell(text="(" + ", ".join(f"{v:.4f}" for v in ref_p) + ")" if ref_p else "–"),
                      Cell(text=f"{slack_p:.4f}" if slack_p is not None else "–"),
                      Cell(text=str(paper_value("table7", setting, "floor_activations") or "–")), Cell(text="3")]
        table.add([setting_label(setting)], cells)
        if theirs is not None:
            table.add(["paper (Tables 6, 7)"], theirs)
    table.notes.append("Minimum report slack: min over rounds, tasks and seeds of r_i − F_i^t (server-averaged report).")
    return table


ABLATION_LABELS = {"report_batches": "B_rep", "clients_per_round": "M", "local_steps": "K"}


def table10(runs: Sequence[Run], paper: bool = False) -> Table:
    """FedHV ablation sweeps (runs made with ``fedhv grid --ablation``)."""
    groups = group(runs, with_variants=True)
    table = Table("10", "Table 10: FedHV ablations, mean ± sample std over seeds", ["Setting", "Ablation", "Variant"],
                  [MEAN_ACC.label, MEAN_LOSS.label])
    keys = sorted({(s, v[0]) for s, v, m in groups if m == "fedhv" and v is not None},
                  key=lambda k: (ordered_settings([k[0]]), k[1]))
    for setting, param in keys:
        name = param.split(".")[-1]
        variants = [v for s, v, m in groups if s == setting and m == "fedhv" and v is not None and v[0] == param]
        variants.sort(key=lambda v: (isinstance(v[1], str), v[1] if not isinstance(v[1], str) else 0))
        col_acc, col_loss = [], []
        for variant in variants:
            rs = groups[(setting, variant, "fedhv")]
            cells = [Cell(_stat(rs, MEAN_ACC.get)), Cell(_stat(rs, MEAN_LOSS.get), digits=4)]
            col_acc.append(cells[0])
            col_loss.append(cells[1])
            theirs = None
            if paper and setting == "cifar10-mnist-b":  # the paper's ablations are on this setting only
                theirs = [Cell(paper_stat("table10", name, str(variant[1]), "mean_acc")),
                          Cell(paper_stat("table10", name, str(variant[1]), "mean_loss"), digits=4)]
            _with_paper(table, [setting_label(setting), ABLATION_LABELS.get(name, name), str(variant[1])], cells,
                        theirs)
        rank(col_acc, True)
        rank(col_loss, False)
    table.notes.append("Ranks within each sweep. The paper's ablations (and so its values, with --paper) are for "
                       "CIFAR10–MNIST α = 0.30 (cifar10-mnist-b) only.")
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
        ])
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
            if paper and setting == "cifar10-mnist-b" and paper_value("table13", m) is not None:
                down = paper_value("table13", m, "downlink_mb_per_client")
                up = paper_value("table13", m, "uplink_mb_per_client")
                theirs = [Cell(paper_stat("table13", m, "total_wall_clock_s"), digits=2), Cell(text=""),
                          Cell(text=""), Cell(text=f"{down} / {up}"), Cell(text="")]
            _with_paper(table, [method_label(m)], cells, theirs)
        rank(time_cells, False)
        table.notes.append("FedHV's wall-clock and totals include its calibration. The paper's Table 13 "
                           "'per client' MB equal one round summed over the M = 10 clients (10 × 6.906 MB); "
                           "compare them with the 'all M clients' column. Paper: CIFAR10–MNIST α = 0.30, 300 rounds.")
        out.append(table)
    return out


def build_tables(runs: Sequence[Run], which: Sequence[str] = TABLES, paper: bool = False) -> list[Table]:
    """The requested tables that have data."""
    builders: dict[str, Callable[[Sequence[Run], bool], Any]] = {
        "1": table1, "8": table8, "9": table9, "11": table11, "7": table7, "10": table10, "13": table13,
    }
    out: list[Table] = []
    for key in which:
        built = builders[key](runs, paper)
        for t in built if isinstance(built, list) else [built]:
            if t.rows:
                out.append(t)
    return out
