"""fedhv's task weighting on a FedAvg-family Strategy: the Strategies on FedAvg (:class:`FedHVStrategy`,
:class:`UniformStrategy`, :class:`LossWeightingStrategy`) and on another base, :func:`fedhv_strategy` (FedAdam, …)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
from flwr.serverapp.strategy import FedAvg

from fedhv.algorithms.validation import REPORT_OUTLIER_RATIO
from fedhv.errors import ConfigError
from fedhv.flower.strategy_messages import UNIT_KEY
from fedhv.flower.strategy_rules import loss_only_method
from fedhv.flower.strategy_weighting import FedHVWeighting

__all__ = ["FedHVStrategy", "LossWeightingStrategy", "UniformStrategy", "composition_problem", "fedhv_strategy",
           "loss_signs"]

def loss_signs(nonnegative: bool | Sequence[bool], num_tasks: int) -> tuple[bool, ...]:
    """The ``nonnegative`` option as one flag per task (one-line ``ConfigError`` otherwise)."""
    flags = [nonnegative] * num_tasks if isinstance(nonnegative, (bool, np.bool_)) else list(nonnegative)
    if len(flags) != num_tasks or not all(isinstance(f, (bool, np.bool_)) for f in flags):
        raise ConfigError(f"nonnegative = {nonnegative!r} must be True / False or {num_tasks} of them (one per task): "
                          "True where the task's loss is >= 0, False for a loss of any sign")
    return tuple(bool(f) for f in flags)


def _init(self: FedHVWeighting, base: type[FedAvg], num_tasks: int, reference: Sequence[float] | None = None, *,
          calibration_rounds: int = 20, margin: float = 0.15, rho_clip: float = 1e-6,
          weighted_by_key: str = UNIT_KEY, max_report_ratio: float = REPORT_OUTLIER_RATIO,
          max_num_examples: int = 10**9, metric_keys: Sequence[str] = (), nonnegative: bool | Sequence[bool] = True,
          method: Any = None, seed: int = 0, **options: Any) -> None:
    self._fedhv_init(num_tasks, reference, calibration_rounds, margin, rho_clip, weighted_by_key, max_report_ratio,
                     max_num_examples, metric_keys, method, seed)
    self.nonnegative = loss_signs(nonnegative, self.num_tasks)
    options.setdefault("fraction_evaluate", 0.0)
    if options["fraction_evaluate"] == 0.0:
        options.setdefault("min_evaluate_nodes", 0)
    try:
        base.__init__(self, weighted_by_key=weighted_by_key, **options)
    except TypeError as exc:
        raise ConfigError(f"{base.__name__} options {sorted(options)}: {exc}") from None


class FedHVStrategy(FedHVWeighting):
    """FedHV task weighting over FedAvg's sampling (:class:`FedHVWeighting`; options there)."""

    def __init__(self, num_tasks: int, reference: Sequence[float] | None = None, **options: Any) -> None:
        _init(self, FedAvg, num_tasks, reference, **options)


class UniformStrategy(FedHVStrategy):
    """Fixed uniform task weights ``wᵢ = 1/m`` with FedHV's message format (the baseline)."""

    adaptive = False

    def __init__(self, num_tasks: int, **options: Any) -> None:
        super().__init__(num_tasks, None, calibration_rounds=0, **options)


class LossWeightingStrategy(FedHVWeighting):
    """A loss-only method's task weighting over FedAvg's sampling, on FedHV's single exchange per round.

    ``LossWeightingStrategy(fedhv.DWA(), num_tasks=3)`` (or a method's name, ``"famo"``): the method's rule
    (:mod:`fedhv.algorithms.loss_only`) maps each round's validated, averaged report ``Fᵗ`` to ``wᵗ⁺¹``,
    exactly as :class:`~fedhv.algorithms.loss_only.LossOnlyAlgorithm` does in the simulator. ``seed`` keys a
    random rule's draws (RLW; the simulator's run seed gives the same weights). A method that calibrates
    (STCH: its nadir is the mean calibration report) runs ``calibration_rounds`` uniform rounds first, as
    :class:`FedHVStrategy` does. The method's ``lr_global`` is not used: the Strategy's base sets the server
    step (FedAvg: ``eta_g = 1``; compose with :func:`~fedhv.flower.strategy.fedhv_strategy` for FedAdam & co.).
    Other options as :class:`FedHVWeighting`.
    """

    def __init__(self, method: Any, num_tasks: int, *, seed: int = 0, **options: Any) -> None:
        _init(self, FedAvg, num_tasks, None, method=method, seed=seed, **options)


_COMPOSED: dict[tuple[type, bool], type] = {}


def fedhv_strategy(base: type[FedAvg], num_tasks: int, reference: Sequence[float] | None = None, *,
                   weighting: Any = "fedhv", **options: Any) -> FedHVWeighting:
    """``base`` (FedAdam, FedYogi, FedAdagrad, FedAvgM, FedProx, FedAvg or your subclass) with FedHV's
    (``weighting="fedhv"``), uniform (``"uniform"``) or a loss-only method's task weighting (its name,
    ``"dwa"``, or its object, ``fedhv.DWA(...)``; :class:`LossWeightingStrategy`): replies validated and averaged as
    :class:`FedHVWeighting` does, then ``base``'s own step (a server optimiser's update, FedProx's
    ``proximal-mu`` in the config). ``options``: FedHV's and ``base``'s keyword options.

    ``base`` must reach FedAvg's ``configure_train`` and ``aggregate_train`` through ``super()``;
    one that aggregates on its own (FedMedian, Krum, FedTrimmedAvg, QFedAvg, …) would bypass the
    weighting and is refused. Flower's DP wrappers go *around* the result."""
    problem = composition_problem(base)
    if problem is not None:
        raise ConfigError(problem)
    if not (isinstance(weighting, str) and weighting in ("fedhv", "uniform")):  # a loss-only method
        method = loss_only_method(weighting)
        if reference is not None:
            raise ConfigError(f"reference is FedHV's; {method.name} takes none")
        if base is FedAvg:
            return LossWeightingStrategy(method, num_tasks, **options)
        return _composed(base, True)(num_tasks, None, method=method, **options)  # type: ignore[no-any-return]
    adaptive = weighting == "fedhv"
    cls: type = (FedHVStrategy if adaptive else UniformStrategy) if base is FedAvg else _composed(base, adaptive)
    if not adaptive:
        if reference is not None:
            raise ConfigError("reference is FedHV's; uniform weighting takes none")
        if cls is UniformStrategy:
            return UniformStrategy(num_tasks, **options)
        options = {**options, "calibration_rounds": 0}
    return cls(num_tasks, reference, **options)


def _composed(base: type[FedAvg], adaptive: bool) -> type:
    """``base`` with the task weighting (made once per base and kind)."""
    key = (base, adaptive)
    if key not in _COMPOSED:
        def __init__(self: FedHVWeighting, num_tasks: int, reference: Sequence[float] | None = None,
                     **opts: Any) -> None:
            _init(self, base, num_tasks, reference, **opts)

        name = ("FedHV" if adaptive else "Uniform") + base.__name__
        _COMPOSED[key] = type(name, (base, FedHVWeighting), {"__init__": __init__, "adaptive": adaptive,
                                                             "__module__": __name__, "__qualname__": name})
    return _COMPOSED[key]


def composition_problem(base: object) -> str | None:
    """Why ``base`` cannot carry the task weighting, or ``None``."""
    if not (isinstance(base, type) and issubclass(base, FedAvg)):
        return (f"base = {base!r}: the task weighting composes with a FedAvg-family Strategy class (FedAvg, FedAdam, "
                "FedYogi, FedAdagrad, FedAvgM, FedProx); wrap DP wrappers around the result instead")
    if issubclass(base, FedHVWeighting):
        return f"base = {base.__name__} already carries fedhv's task weighting"
    for cls in base.__mro__[:base.__mro__.index(FedAvg)]:
        for method in ("configure_train", "aggregate_train"):
            fn = cls.__dict__.get(method)
            if fn is None:
                continue
            try:
                source = inspect.getsource(fn)
            except (OSError, TypeError):
                source = ""
            if f"super().{method}(" not in source:
                return (f"base = {base.__name__}: {cls.__name__}.{method} does not call super().{method}, so it "
                        "would bypass fedhv's validation and task weighting; use FedAvg, FedAdam, FedYogi, "
                        "FedAdagrad, FedAvgM or FedProx")
    return None
