"""What a tuning searches and how it is judged, checked before anything runs (``fedhv tune``).

A :class:`TunePlan` is one setting, its methods and one budget for all of them: ``trials`` trials of
``rounds`` rounds per method, stopped early by one pruner (:class:`Pruning`), judged by one objective on
the **validation** split. Everything a bad option could break is refused by :func:`check_plan` with one
line naming the option, the value and the fix, before any data is loaded: an unknown method or objective,
an empty or inverted search range, a budget whose rounds or trials never reach the pruner's first rung.

Each method's search space is its own declaration (:meth:`fedhv.algorithms.method.Method.search_space`);
:func:`method_space` turns it into concrete :class:`Param` bounds for the setting (a learning rate's range
is around the setting's rate). A trial's configuration is the base setting plus :func:`param_overrides`;
the chosen configuration (:func:`chosen_toml`) is a TOML file ``fedhv grid`` takes: ``extends`` the
base setting, the user's ``--set`` overrides, and each method's chosen values in its ``[lr.<method>]``
and ``[<method>]`` tables. Nothing here imports Optuna (:mod:`fedhv.experiment.tune` does).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedhv.algorithms.tuning import Choice, Dimension, Range, Rate, config_key
from fedhv.config import dumps, load_config
from fedhv.config.loader import apply_overrides
from fedhv.config.schema import RunConfig
from fedhv.errors import ConfigError
from fedhv.experiment.runner import eval_due
from fedhv.registry import METHODS


class TuneError(ConfigError):
    """A tuning that cannot run as asked (one line: the option, the value, the fix)."""


def _mean_worst(v: Mapping[str, Any]) -> float | None:
    mean, worst = v.get("mean_acc"), v.get("worst_acc")
    return None if mean is None or worst is None else (float(mean) + float(worst)) / 2


#: Objectives (all maximised) of one validation evaluation: name -> (description, score).
OBJECTIVES: dict[str, tuple[str, Callable[[Mapping[str, Any]], float | None]]] = {
    "mean-worst": ("(MeanAcc + WorstAcc) / 2", _mean_worst),
    "mean-acc": ("MeanAcc", lambda v: v.get("mean_acc")),
    "worst-acc": ("WorstAcc", lambda v: v.get("worst_acc")),
    "hv": ("HV of the task losses", lambda v: v.get("hv")),
}
DEFAULT_OBJECTIVE = "mean-worst"
#: How many of the last validation evaluations the objective averages (single evaluations oscillate by
#: 1-5 points near the end of training; ten of them average that out).
DEFAULT_WINDOW = 10
PRUNERS = ("halving", "median", "none")
#: The trials' evaluation splits: the validation split the objective reads, and the test split every run
#: must evaluate (config validation refuses a run without it: ``summary.json`` reports it). The objective
#: and the pruner never read the test metrics.
TRIAL_SPLITS = 'eval.splits=["test", "val"]'


@dataclass(frozen=True)
class Pruning:
    """The early stopping of poor trials.

    Attributes
    ----------
    kind : str
        ``"halving"`` (Optuna's successive halving: at rounds ``first_rung * reduction**k`` a trial goes on
        only when it is in the best ``1 / reduction`` of the trials that reached that rung), ``"median"``
        (stopped when below the median of the finished trials at the same round, from ``first_rung`` on,
        once ``startup`` trials finished) or ``"none"``.
    first_rung : int
        The first round at which a trial may be stopped (a scheduled evaluation at or after it).
    reduction : int
        Successive halving's reduction factor.
    startup : int
        The median pruner's finished trials before it stops any.
    """

    kind: str = "halving"
    first_rung: int = 0
    reduction: int = 3
    startup: int = 3


@dataclass(frozen=True)
class TunePlan:
    """One tuning: the setting, its methods, the budget, the objective and the pruner.

    Attributes
    ----------
    setting : str
        A preset name or a TOML file's absolute path (what the trials and the chosen configuration extend).
    name : str
        The setting's name (``setting = ...``), the one the runs group under in ``fedhv table``.
    methods : tuple of str
        The methods, each tuned with the same budget.
    trials, rounds : int
        Per method: ``trials`` trials of at most ``rounds`` rounds.
    overrides : tuple of str
        The user's ``--set`` overrides (part of the setting: also in the chosen configuration).
    objective : str
        A key of :data:`OBJECTIVES`.
    window : int
        The objective is the mean over the last ``window`` validation evaluations.
    pruning : Pruning
        Early stopping.
    seed : int
        The trials' training seed and the sampler's seed.
    ranges : tuple
        ``(key, low, high)`` replacing declared ranges (``--range``).
    pinned : tuple of str
        ``calibration.lr_*`` overrides: the rates every trial's calibration runs at (the setting's FedHV
        rates), pinned so the chosen configuration calibrates as the trials did.
    """

    setting: str
    name: str
    methods: tuple[str, ...]
    trials: int
    rounds: int
    overrides: tuple[str, ...] = ()
    objective: str = DEFAULT_OBJECTIVE
    window: int = DEFAULT_WINDOW
    pruning: Pruning = Pruning()
    seed: int = 0
    ranges: tuple[tuple[str, float, float], ...] = ()
    pinned: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """Plain values (``tune.json``)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def digest(self) -> str:
        """A digest of everything that decides the trials (a folder holds one plan's trials)."""
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:12]

    def base_overrides(self, execution: Sequence[str] = ()) -> tuple[str, ...]:
        """Every trial's overrides before its parameters: the user's, the pinned calibration rates, the
        budget's rounds, the trial splits, then ``execution`` (threads, data root: not part of the plan)."""
        return (*self.overrides, *self.pinned, f"rounds={self.rounds}", TRIAL_SPLITS, *execution)


@dataclass(frozen=True)
class Param:
    """One concrete search dimension of a method in a setting.

    Attributes
    ----------
    name : str
        The configuration key it sets (``lr.stch.global``, ``stch.mu``, ``calibration.margin``).
    kind : str
        ``"float"``, ``"int"`` or ``"choice"``.
    low, high : float
        The bounds (numbers).
    log : bool
        Log-uniform.
    choices : tuple
        The values of a choice.
    default : Any
        The setting's value (the preset's rate, the section's default): the method's first trial.
    """

    name: str
    kind: str
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple[Any, ...] = ()
    default: Any = None

    def contains(self, value: Any) -> bool:
        """Whether ``value`` lies in this dimension."""
        if self.kind == "choice":
            return any(type(value) is type(c) and value == c for c in self.choices)
        return isinstance(value, (int, float)) and not isinstance(value, bool) and self.low <= value <= self.high


def config_value(cfg: RunConfig, key: str) -> Any:
    """The value of the dotted configuration ``key`` in a resolved ``cfg`` (``stch.mu``, ``calibration.margin``)."""
    head, *rest = key.split(".")
    obj: Any = cfg.section(head) if head in METHODS else getattr(cfg, head)  # a method's name is no field's
    for part in rest:
        obj = getattr(obj, part)
    return obj


def declared_space(method: str, ranges: Sequence[tuple[str, float, float]] = ()) -> tuple[Dimension, ...]:
    """``method``'s declared dimensions, each checked, with ``--range`` replacements applied.

    Raises
    ------
    TuneError
        An empty, inverted or non-positive log range, an authors' value outside its range, or a
        ``--range`` on a choice.
    """
    where = f"{method}'s search space"
    dims: list[Dimension] = []
    for dim in METHODS.get(method).search_space():
        if not isinstance(dim, Rate):
            dim = dataclasses.replace(dim, key=config_key(method, dim))  # messages name the configuration key
        for key, low, high in ranges:
            if key in (dim.key, config_key(method, dim)):
                if isinstance(dim, Choice):
                    raise TuneError(f"--range {key}={low}:{high}: {key} is a choice of {list(dim.values)}, not a "
                                    "range; leave it out of --range")
                dim = dataclasses.replace(dim, low=low, high=high)
                if isinstance(dim, Range):
                    dim = dataclasses.replace(dim, authors=())  # the user's narrower range need not hold them
                where = f"--range {key}={low}:{high} ({method})"
        try:
            dim.check(where)
        except ConfigError as exc:
            raise TuneError(str(exc)) from None
        dims.append(dim)
    return tuple(dims)


def method_space(cfg: RunConfig, ranges: Sequence[tuple[str, float, float]] = ()) -> list[Param]:
    """The concrete dimensions of ``cfg.method`` in ``cfg``'s setting (``cfg`` resolved for that method)."""
    method = cfg.method
    params: list[Param] = []
    for dim in declared_space(method, ranges):
        name = config_key(method, dim)
        if isinstance(dim, Rate):
            rate = cfg.lr_global if dim.which == "global" else cfg.lr_local
            low, high = dim.bounds(rate)
            params.append(Param(name, "float", low, high, True, default=rate))
        elif isinstance(dim, Range):
            params.append(Param(name, "int" if dim.integer else "float", dim.low, dim.high, dim.log,
                                default=config_value(cfg, name)))
        else:
            params.append(Param(name, "choice", choices=tuple(dim.values), default=config_value(cfg, name)))
    return params


def param_overrides(params: Mapping[str, Any]) -> tuple[str, ...]:
    """``--set`` overrides of a trial's parameters (``lr.stch.global=0.61``, ``aligned.scale_mode="min"``)."""
    return tuple(f"{name}={json.dumps(value)}" for name, value in params.items())


def evaluations(cfg: RunConfig) -> list[int]:
    """The rounds at which a run of ``cfg`` evaluates (test and validation together)."""
    return [t for t in range(1, cfg.rounds + 1) if eval_due(t, cfg)]


def default_first_rung(rounds_evaluated: Sequence[int], rounds: int, reduction: int) -> int:
    """The first evaluation at or after ``rounds / reduction**2`` that is not the last round (0: none)."""
    target = math.ceil(rounds / reduction ** 2)
    return next((t for t in rounds_evaluated if t >= target and t < rounds), 0)


def check_plan(plan: TunePlan, configs: Mapping[str, RunConfig]) -> TunePlan:
    """``plan`` checked against each method's resolved trial configuration (``configs``); with its default
    first rung filled in.

    Raises
    ------
    TuneError
        One line naming the option, the value and the fix.
    """
    if plan.trials < 1:
        raise TuneError(f"--trials {plan.trials}: give at least 1 trial per method")
    if plan.rounds < 1:
        raise TuneError(f"--rounds {plan.rounds}: give at least 1 round per trial")
    if plan.window < 1:
        raise TuneError(f"--window {plan.window}: the objective averages the last N >= 1 validation evaluations")
    if plan.objective not in OBJECTIVES:
        raise TuneError(f"--objective {plan.objective!r} is unknown; choose one of {', '.join(OBJECTIVES)}")
    shared: dict[str, str] = {}
    for method, cfg in configs.items():
        for param in method_space(cfg, plan.ranges):
            head = param.name.split(".")[0]
            if head not in ("lr", method):
                if param.name in shared:
                    raise TuneError(f"--methods: {shared[param.name]} and {method} both tune {param.name}, which "
                                    "the chosen configuration holds once; tune them in separate `fedhv tune` runs")
                shared[param.name] = method
    known = {key for cfg in configs.values() for dim in declared_space(cfg.method)
             for key in (dim.key, config_key(cfg.method, dim))}
    for key, _, _ in plan.ranges:
        if key not in known:
            raise TuneError(f"--range {key}: no method of this tuning searches {key}; give one of "
                            f"{', '.join(sorted(known))}")
    cfg = next(iter(configs.values()))
    if cfg.data.val_fraction <= 0:
        raise TuneError(f"data.val_fraction = {cfg.data.val_fraction}: a tuning judges trials on the validation "
                        "split; set data.val_fraction > 0 (default 0.2)")
    p = plan.pruning
    if p.kind not in PRUNERS:
        raise TuneError(f"--pruner {p.kind!r} is unknown; choose one of {', '.join(PRUNERS)}")
    if p.kind == "none":
        return plan
    if p.reduction < 2:
        raise TuneError(f"--reduction {p.reduction}: successive halving keeps 1/N of the trials at each rung; "
                        "give N >= 2, e.g. 3")
    if p.first_rung < 0 or (p.first_rung and p.first_rung >= plan.rounds):
        raise TuneError(f"--first-rung {p.first_rung} with --rounds {plan.rounds}: no trial could be stopped "
                        f"before its end; give a first rung between 1 and {plan.rounds - 1}, or --pruner none")
    evaluated = evaluations(cfg)
    first = p.first_rung or default_first_rung(evaluated, plan.rounds, p.reduction)
    if not first:
        raise TuneError(f"--rounds {plan.rounds} with eval.test_period = {cfg.eval.test_period}: no validation "
                        "evaluation falls before the last round, so the pruner has no rung to stop a trial at; raise "
                        "--rounds (at least twice eval.test_period), or give --pruner none")
    if not any(first <= t < plan.rounds for t in evaluated):
        raise TuneError(f"--first-rung {first} with --rounds {plan.rounds} and eval.test_period = "
                        f"{cfg.eval.test_period}: no validation evaluation falls from the first rung to before the "
                        "last round, so the pruner never stops a trial; lower --first-rung, raise --rounds, or give "
                        "--pruner none")
    if p.kind == "halving" and plan.trials < 2:
        raise TuneError(f"--trials {plan.trials} with --pruner halving: one trial has nothing to be compared "
                        "with at a rung; give --trials >= 2, or --pruner none")
    if p.kind == "median" and plan.trials <= p.startup:
        raise TuneError(f"--trials {plan.trials} with --pruner median and {p.startup} startup trials never stops "
                        f"a trial; give --trials > {p.startup}, fewer --startup trials, or --pruner halving")
    return dataclasses.replace(plan, pruning=dataclasses.replace(p, first_rung=first))


def trial_configs(plan: TunePlan, execution: Sequence[str] = ()) -> dict[str, RunConfig]:
    """Each method's trial configuration before its parameters (validates the setting and overrides).

    Raises
    ------
    ConfigError
        An unknown method, a bad setting or override (the configuration's own one-line errors).
    """
    if not plan.methods:
        raise TuneError("--methods is empty; give at least one method, e.g. --methods uniform,fedhv")
    if len(set(plan.methods)) != len(plan.methods):
        raise TuneError(f"--methods {','.join(plan.methods)} names a method twice; give each once")
    for method in plan.methods:
        if method not in METHODS:
            raise TuneError(f"--methods: {method!r} is not a method; choose from {', '.join(METHODS.names())}")
    base = plan.base_overrides(execution)
    return {m: load_config(plan.setting, (*base, f"method={json.dumps(m)}", f"seed={plan.seed}"))
            for m in plan.methods}


def objective_value(entries: Sequence[Mapping[str, Any]], objective: str, window: int) -> float | None:
    """The objective of a run's ``metrics.jsonl`` entries: the mean of :data:`OBJECTIVES`' score of the
    last ``window`` **validation** evaluations (``entry["val"]``; the test metrics are never read).
    ``None`` before the first validation evaluation.

    Raises
    ------
    TuneError
        When an evaluation has no value for the objective (e.g. MeanAcc of regression tasks).
    """
    vals = [e["val"] for e in entries if isinstance(e.get("val"), Mapping)]
    if not vals:
        return None
    name, score = OBJECTIVES[objective]
    values = [score(v) for v in vals[-window:]]
    if any(v is None or not math.isfinite(float(v)) for v in values):
        raise TuneError(f"--objective {objective}: a validation evaluation has no finite {name} ({values}); "
                        "choose another objective, e.g. --objective hv")
    return float(sum(float(v) for v in values if v is not None) / len(values))


def chosen_toml(plan: TunePlan, chosen: Mapping[str, Mapping[str, Any]], notes: Sequence[str] = ()) -> str:
    """The chosen configuration as a TOML file ``fedhv grid`` takes.

    It ``extends`` the plan's setting under the setting's own name (so ``fedhv table`` groups its runs
    with the setting's), holds the user's overrides and the pinned calibration rates, and each method's
    chosen values (``chosen[method]``: configuration key -> value). Not the trials' rounds: a grid of the
    file runs the setting's rounds (``fedhv grid FILE --rounds R`` for the tuning's). ``notes`` become
    comment lines at the top.
    """
    values = [*plan.overrides, *plan.pinned]
    for params in chosen.values():
        values.extend(param_overrides(params))
    data = apply_overrides({"extends": plan.setting, "setting": plan.name}, values)
    body: list[str] = []
    for line in dumps(data).splitlines():  # one blank line before each table
        if line.startswith("[") and body and body[-1]:
            body.append("")
        if line or (body and body[-1]):
            body.append(line)
    return "".join(f"# {note}\n" for note in notes) + "\n".join(body).strip("\n") + "\n"
