"""Front sweeps (issue 41): each method aimed at every direction of a simplex lattice, as grid runs.

A direction ``u`` (``u_i > 0``, ``sum u = 1``) is a point of the loss space's trade-off: a larger
``u_i`` lets task ``i`` keep a larger loss. Each method that takes a direction says how it aims
(:meth:`fedhv.algorithms.method.Method.front_overrides`):

- FedHV: the reference ``r = max_t F^cal_t + delta * m * u`` for each margin ``delta``
  (``u = 1/m``: the paper's ``r = max F + delta``); far along ``u`` its weights tend to ``1/u``;
- linear scalarisation: ``w ∝ 1/u``, the weights FedHV's map tends to as ``delta -> inf``;
- FedCMOO-Pref: EPO's preference ``r ∝ 1/u`` (EPO's exact-Pareto point lies on the ray ``l ∝ u``).

The sweep's runs are ordinary grid runs (:func:`fedhv.experiment.grid.plan_job`): skipped when
finished, resumed when interrupted, on the local pool or on Ray, and every FedHV run of a family
shares one calibration (the margin and the direction only shift ``r``)::

    OUT/<setting>/front/u=<u_1>,...,<u_m>/margin=<delta>/fedhv/s<seed>/
    OUT/<setting>/front/u=<u_1>,...,<u_m>/<method>/s<seed>/

Their ``grid-job.json`` records the variant ``("front", [u, delta])`` (``delta`` ``None`` for a method
without a margin), which :mod:`fedhv.results.tables_front` reads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedhv.config import load_config
from fedhv.config.validation import MAX_LOSS_LEVEL
from fedhv.errors import ConfigError
from fedhv.experiment.grid import CalibrationJob, Job, plan_job, setting_source
from fedhv.registry import METHODS
from fedhv.results.collect import FRONT_ABLATION
from fedhv.results.fronts import MAX_DIRECTIONS, das_dennis, max_divisions

#: The ``ablation`` of a front run (``grid-job.json``).
FRONT = FRONT_ABLATION


def parse_directions(spec: str, m: int) -> list[tuple[float, ...]]:
    """The directions ``--front SPEC`` names for ``m`` tasks.

    ``H`` (an integer >= 1): the interior Das--Dennis lattice, ``C(H + m - 1, m - 1)`` directions
    (:func:`fedhv.results.fronts.das_dennis`); ``uniform``: ``1/m`` only (the paper's direction);
    ``a,b;c,d``: the given directions, each normalised to sum 1.

    Raises
    ------
    ConfigError
        A lattice of ``H < 1``, a direction of another length than ``m``, a zero, negative or
        non-finite entry (one line naming the value and the fix).
    """
    text = spec.strip()
    if text == "uniform":
        return [tuple([1.0 / m] * m)]
    if text.lstrip("-").isdigit():
        h = int(text)
        if h < 1:
            raise ConfigError(f"--front {spec}: the lattice needs H >= 1 divisions (m = 2: H + 1 directions), e.g. "
                              "--front 4")
        if math.comb(h + m - 1, m - 1) > MAX_DIRECTIONS:  # before a row is built (m = 2: before any data is read)
            raise ConfigError(f"--front {h}: the lattice of {m} tasks has {math.comb(h + m - 1, m - 1):,} directions, "
                              f"over fedhv's bound of {MAX_DIRECTIONS:,} (each is a run per method and seed); lower "
                              f"H, e.g. --front {max_divisions(m)}")
        return [tuple(float(v) for v in row) for row in das_dennis(m, h, interior=True)]
    out: list[tuple[float, ...]] = []
    for part in text.split(";"):
        try:
            values = [float(v) for v in part.split(",") if v.strip()]
        except ValueError:
            raise ConfigError(f"--front {spec!r}: give H (a lattice), uniform, or directions such as "
                              "'0.25,0.75;0.5,0.5'") from None
        if len(values) != m:
            raise ConfigError(f"--front: direction {values} has {len(values)} entries for {m} tasks; give one per task")
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise ConfigError(f"--front: direction {values} needs every entry > 0 (u_i = 0 puts task {_zero(values)}'s "
                              "reference at its calibration maximum and gives linear scalarisation an infinite "
                              "weight); use the interior lattice (--front H) or positive entries")
        total = sum(values)
        out.append(tuple(v / total for v in values))
    return list(dict.fromkeys(out))  # a direction given twice (1,1;2,2) runs once


def _zero(values: Sequence[float]) -> int:
    return next((i for i, v in enumerate(values) if not v > 0), 0)


def check_margins(margins: Sequence[float]) -> tuple[float, ...]:
    """The margins ``delta`` of FedHV's references, each finite and > 0 (so that ``r`` exceeds the
    calibration maximum in every task)."""
    if not margins:
        raise ConfigError("--margins is empty; give FedHV's margins, e.g. --margins 0.15,0.3")
    bad = [d for d in margins if not (math.isfinite(d) and d > 0)]
    if bad:
        raise ConfigError(f"--margins {bad[0]}: a margin must be > 0 so that r = max F^cal + delta m u exceeds the "
                          "calibration maximum in every task; e.g. --margins 0.15,0.3")
    huge = [d for d in margins if d > MAX_LOSS_LEVEL]
    if huge:  # r = max F + delta m u overflowed and FedHV's weights became NaN (1e308)
        raise ConfigError(f"--margins {huge[0]} is over fedhv's bound of {MAX_LOSS_LEVEL:g} (a loss level); "
                          "e.g. --margins 0.15,0.3")
    return tuple(dict.fromkeys(float(d) for d in margins))


def num_tasks_of(source: str, overrides: Sequence[str]) -> int:
    """``m`` of a setting: a user benchmark's (``module:attribute``, a registered factory) from its
    tasks, a built-in one's from its data (read from the cache when built)."""
    from fedhv.data.configured import load_data
    from fedhv.experiment.problem import Problem

    cfg = load_config(source, tuple(overrides))
    problem = Problem.of(cfg)
    if problem.user is not None:
        return problem.data(cfg).num_tasks
    return load_data(cfg)[0].num_tasks


def _text(v: float) -> str:
    """``v`` in a folder name: the fewest significant digits, 4 or more, that read back as ``v`` exactly
    (``0.25``, ``2``, ``0.16666666666666666``), so two directions or margins never share a folder (4 significant
    digits did); where 4 digits were exact the name is the one earlier versions gave."""
    return next(s for k in range(4, 18) if float(s := f"{v:.{k}g}") == v)


def plan_front(settings: Sequence[str], methods: Sequence[str], seeds: Sequence[int], out: Path,
               overrides: Sequence[str] = (), front: str = "4", margins: Sequence[float] = (0.15,),
               num_tasks: Any = num_tasks_of) -> tuple[list[Job], list[CalibrationJob]]:
    """Expand a front sweep into grid jobs (every configuration built and validated here).

    Parameters
    ----------
    front : str
        The directions (:func:`parse_directions`).
    margins : sequence of float
        FedHV's ``delta`` values (methods without a margin run once per direction).
    num_tasks : callable
        ``(source, overrides) -> m`` (default: read from the setting's data).

    Raises
    ------
    ConfigError
        A method that takes no direction, a bad lattice, direction or margin -- before any run.
    """
    deltas = check_margins(margins)
    if front.strip().isdigit():  # a lattice too large for the fewest tasks (2) is refused before any data is read
        parse_directions(front, 2)
    takes = {name: METHODS.get(name) for name in methods}
    refused = [name for name, cls in takes.items() if cls.front_overrides((0.5, 0.5), 1.0) is None]
    if refused:
        able = sorted(n for n in METHODS.names() if METHODS.get(n).front_overrides((0.5, 0.5), 1.0) is not None)
        raise ConfigError(f"--methods: {', '.join(refused)} take(s) no direction, so a front sweep cannot aim "
                          f"them; methods that do: {', '.join(able)}")
    jobs: list[Job] = []
    calibrations: dict[str, CalibrationJob] = {}
    named: dict[str, str] = {}
    for setting in dict.fromkeys(setting_source(s) for s in settings):
        m = num_tasks(setting, overrides)
        for u in parse_directions(front, m):
            where = (FRONT, "u=" + ",".join(_text(v) for v in u))
            for method, cls in takes.items():
                for delta in (deltas if cls.takes_margin else (None,)):
                    extra = cls.front_overrides(u, delta)
                    assert extra is not None
                    folder = (*where, f"margin={_text(delta)}") if delta is not None else where
                    for seed in seeds:
                        jobs.append(plan_job(setting, overrides, extra, method, seed, out, folder, FRONT,
                                             (FRONT, (tuple(u), delta)), named, calibrations))
    return jobs, list(calibrations.values())


__all__ = ["FRONT", "check_margins", "num_tasks_of", "parse_directions", "plan_front"]
