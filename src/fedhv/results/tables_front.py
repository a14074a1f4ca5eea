"""Front tables (``fedhv table --table front,margin``) of a front sweep's runs (``fedhv grid --front``).

A front run aimed a method at one direction ``u`` (FedHV also at one margin ``delta``); its point is the
final test-loss vector ``l in R^m`` of :attr:`fedhv.results.collect.Run.reported` (the last scheduled
evaluation, as every final-result table). A *family* is a method with its margin (``FedHV δ=0.15``,
``Linear``, ``FedCMOO-Pref``); per setting, family and seed its front is the non-dominated subset of its
points over the directions.

``front``: per setting one row per family: the directions swept, the non-dominated points, and -- mean ±
sample std over seeds -- the front's hypervolume at the evaluation reference (``3 * 1_m``, the paper's),
IGD+ and the additive ε against the reference set ``Z`` (the non-dominated union of every family's and
seed's points of the setting: the best front found), the lowest loss the front reaches in each task, and
how many of its points no point of the same seed's linear-scalarisation front weakly dominates ("beyond
Linear": the parts of the front linear scalarisation did not reach). Indicators through moocore
(:mod:`fedhv.results.fronts`).

``margin``: FedHV's runs at the uniform direction per margin ``delta``: MeanAcc, WorstAcc and HV (the
paper's Table 8 hypervolume of the final point), mean ± sample std over seeds -- the sensitivity the paper
left open (B.8).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedhv.results.collect import (
    FRONT_ABLATION,
    Run,
    Stat,
    log,
    method_label,
    ordered_methods,
    ordered_settings,
    setting_label,
)
from fedhv.results.fronts import nondominated, score_front
from fedhv.results.table_model import Cell, Record, Table, rank

#: A family: (method, margin or None).
Family = tuple[str, "float | None"]
#: The family whose front the others are compared with ("beyond Linear"): linear scalarisation at ``w ∝ 1/u``,
#: the limit of FedHV's map far along ``u``.
BASELINE = "linear"


def front_point(run: Run) -> tuple[tuple[float, ...], float | None] | None:
    """``(u, delta)`` of a front run (``None`` for any other run)."""
    if run.ablation != FRONT_ABLATION or run.variant is None or run.variant[0] != FRONT_ABLATION:
        return None
    if not isinstance(run.variant[1], (tuple, list)) or len(run.variant[1]) != 2:
        return None  # received.job_problem left such a run out already (a Run built in Python)
    u, delta = run.variant[1]
    return tuple(float(v) for v in u), None if delta is None else float(delta)


def family_label(family: Family) -> str:
    """``FedHV δ=0.15``, ``Linear``."""
    method, delta = family
    return method_label(method) + ("" if delta is None else f" δ={delta:g}")


def _losses(run: Run) -> np.ndarray | None:
    loss = run.reported.get("task_loss")
    if not isinstance(loss, list) or not loss:
        return None
    v = np.asarray(loss, dtype=np.float64)
    return v if np.isfinite(v).all() else None


def front_runs(runs: Sequence[Run]) -> dict[str, dict[Family, dict[int, list[tuple[tuple[float, ...], Run]]]]]:
    """Front runs by setting, family and seed: ``[(u, run), ...]``.

    A run whose final ``task_loss`` (or ``task_acc``, ``hv_reference``) has another length than its direction
    ``u``, or than most front runs of its setting, is damaged (a received run edited, or of another setting):
    it is left out with one ``warning: skipped RUN: … (run left out)`` line, as the paper tables skip one.
    """
    out: dict[str, dict[Family, dict[int, list[tuple[tuple[float, ...], Run]]]]] = {}
    aimed = [(run, aim) for run in runs if (aim := front_point(run)) is not None and _losses(run) is not None]
    sizes: dict[str, Counter[int]] = {}
    for run, (u, _) in aimed:
        sizes.setdefault(run.setting, Counter())[len(u)] += 1
    for run, aim in aimed:
        u, delta = aim
        m = sizes[run.setting].most_common(1)[0][0]
        problem = _size_problem(run, len(u), m)
        if problem is not None:
            log.warning(f"skipped {run.path}: {problem} (run left out)")
            continue
        out.setdefault(run.setting, {}).setdefault((run.method, delta), {}).setdefault(run.seed, []).append((u, run))
    return out


def _size_problem(run: Run, k: int, m: int) -> str | None:
    """Why a front run aimed along a ``k``-task direction does not fit its setting's ``m`` tasks, or None."""
    if k != m:
        return f"its direction u has {k} values, most front runs of setting {run.setting!r} {m}"
    for key in ("task_loss", "task_acc"):
        value = run.reported.get(key)
        if isinstance(value, list) and len(value) != m:
            return f"its final {key} has {len(value)} values, its direction u {m}"
    ref = run.summary.get("hv_reference")
    if isinstance(ref, list) and ref and len(ref) != m:
        return f"its hv_reference has {len(ref)} values, its direction u {m}"
    return None


def family_order(families: Sequence[Family]) -> list[Family]:
    methods = ordered_methods({m for m, _ in families})
    return sorted(families, key=lambda f: (methods.index(f[0]), -1.0 if f[1] is None else f[1]))


def _eval_reference(runs: Sequence[Run], m: int) -> np.ndarray:
    refs = {tuple(r.summary.get("hv_reference") or ()) for r in runs}
    refs.discard(())
    if len(refs) > 1:
        raise ValueError(f"the front runs use different evaluation references {sorted(refs)}; tabulate them apart")
    return np.asarray(refs.pop(), dtype=np.float64) if refs else np.full(m, 3.0)


def table_front(runs: Sequence[Run], paper: bool = False) -> list[Table]:
    """One front table per setting with front runs (see the module docstring; ``paper`` unused)."""
    out = []
    fronts = front_runs(runs)
    for setting in ordered_settings(fronts):
        families = fronts[setting]
        members = [r for seeds in families.values() for pairs in seeds.values() for _, r in pairs]
        points = np.vstack([_losses(r) for r in members])  # type: ignore[misc]
        m = points.shape[1]
        ref = _eval_reference(members, m)
        z = nondominated(points)
        linear = {seed: np.vstack([_losses(r) for _, r in pairs])  # type: ignore[misc]
                  for (method, _), seeds in families.items() if method == BASELINE for seed, pairs in seeds.items()}
        header = ["directions", "points", "HV ↑", "IGD+ ↓", "ε+ ↓", "lowest loss per task"]
        if linear:
            header.append("beyond Linear")
        table = Table("front", f"Fronts, {setting_label(setting)}: indicators of each family's non-dominated final "
                      "test losses over the directions, mean ± sample std over seeds", ["Method"], header,
                      slug=f"{setting}-front")
        columns: dict[str, list[Cell]] = {"hv": [], "igd_plus": [], "eps_add": []}
        for family in family_order(list(families)):
            seeds, partial = complete_seeds(families[family])
            if partial:
                table.note(f"{family_label(family)}: seed(s) {', '.join(map(str, partial))} left out: their runs "
                           f"cover fewer of the family's {len({u for ps in families[family].values() for u, _ in ps})}"
                           " directions (a front over fewer directions is not comparable).")
            scores, lowest, beyond, directions = [], [], [], set()
            for seed, pairs in sorted(seeds.items()):
                mine = np.vstack([_losses(r) for _, r in pairs])  # type: ignore[misc]
                directions |= {u for u, _ in pairs}
                scores.append(score_front(mine, z, ref))
                lowest.append(mine.min(axis=0))
                if seed in linear and family[0] != BASELINE:
                    front = nondominated(mine)
                    beyond.append(sum(not _weakly_dominated(p, linear[seed]) for p in front))
            stats = {"hv": Stat.of(s.hv for s in scores), "igd_plus": Stat.of(s.igd_plus for s in scores),
                     "eps_add": Stat.of(s.eps_add for s in scores)}
            cells = [Cell(text=str(len(directions))), Cell(Stat.of(s.points for s in scores), digits=1)]
            for key, digits in (("hv", 3), ("igd_plus", 4), ("eps_add", 4)):
                cell = Cell(stats[key], digits=digits)
                columns[key].append(cell)
                cells.append(cell)
                table.records.append(Record(setting, _record_method(family), f"front_{key}", stats[key]))
            low = np.mean(lowest, axis=0)
            cells.append(Cell(text=" / ".join(f"{v:.4f}" for v in low)))
            if linear:
                cells.append(Cell(Stat.of(beyond), digits=1) if beyond else Cell(text="–"))
            table.add([family_label(family)], cells)
        rank(columns["hv"], True)
        rank(columns["igd_plus"], False)
        rank(columns["eps_add"], False)
        table.notes.append(
            f"Each run's point: its final test-loss vector (m = {m}). HV at the evaluation reference "
            f"{ref.tolist()}; IGD+ and ε+ against the non-dominated union of every family's and seed's points "
            f"({len(z)} points). Lowest loss per task: the front's best value in each task, mean over seeds. "
            + ("Beyond Linear: the front's points that no point of the same seed's Linear front weakly dominates, "
               "mean over seeds. " if linear else "")
            + "Directions u: FedHV r = max F^cal + δ m u, Linear w ∝ 1/u, FedCMOO-Pref preference ∝ 1/u "
            "(docs/fronts.md). Bold: best, underlined: second best.")
        out.append(table)
    return out


def complete_seeds(seeds: dict[int, list[tuple[tuple[float, ...], Run]]]
                    ) -> tuple[dict[int, list[tuple[tuple[float, ...], Run]]], list[int]]:
    """The seeds whose runs cover every direction the family has on any seed, and the others (left out). When
    no seed covers them all, every seed is kept (nothing left out)."""
    union = {u for pairs in seeds.values() for u, _ in pairs}
    complete = {seed: pairs for seed, pairs in seeds.items() if {u for u, _ in pairs} == union}
    if not complete:
        return seeds, []
    return complete, sorted(set(seeds) - set(complete))


def _weakly_dominated(point: np.ndarray, others: np.ndarray) -> bool:
    return bool(np.any(np.all(others <= point, axis=1)))


def _record_method(family: Family) -> str:
    method, delta = family
    return method if delta is None else f"{method}@margin={delta:g}"


def table_margin(runs: Sequence[Run], paper: bool = False) -> list[Table]:
    """FedHV at the uniform direction per margin (see the module docstring; ``paper`` unused)."""
    out = []
    by_setting: dict[str, dict[float, list[Run]]] = {}
    for run in runs:
        aim = front_point(run)
        if aim is None or run.method != "fedhv" or aim[1] is None:
            continue
        u, delta = aim
        if not np.allclose(u, 1.0 / len(u), rtol=0, atol=1e-12):
            continue
        by_setting.setdefault(run.setting, {}).setdefault(delta, []).append(run)
    for setting in ordered_settings(by_setting):
        table = Table("margin", f"FedHV's reference margin δ at the uniform direction, {setting_label(setting)}: "
                      "r = max F^cal + δ; mean ± sample std over seeds", ["δ"],
                      ["MeanAcc ↑", "WorstAcc ↑", "HV ↑", "seeds"], slug=f"{setting}-margin")
        columns: dict[str, list[Cell]] = {"mean_acc": [], "worst_acc": [], "hv": []}
        for delta, rs in sorted(by_setting[setting].items()):
            cells = []
            for key, digits in (("mean_acc", 2), ("worst_acc", 2), ("hv", 3)):
                stat = Stat.of(_value(r, key) for r in rs)
                cell = Cell(stat, digits=digits)
                columns[key].append(cell)
                cells.append(cell)
                table.records.append(Record(setting, f"fedhv@margin={delta:g}", key, stat))
            cells.append(Cell(text=str(len(rs))))
            table.add([f"{delta:g}"], cells)
        for cells in columns.values():
            rank(cells, True)
        table.notes.append("fedhv grid SETTING --front uniform --methods fedhv --margins ...: one calibration shared by "
                           "every margin (the margin only shifts r). The paper uses 0.15 (and 0.30 for CelebA5); B.8 "
                           "notes its two margins are not a controlled sensitivity sweep.")
        out.append(table)
    return out


def _value(run: Run, key: str) -> Any:
    return run.reported.get(key)
