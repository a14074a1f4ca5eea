"""fedhv's task weighting on another FedAvg-family Strategy: :func:`fedhv_strategy` (FedAdam, FedYogi, …)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from flwr.serverapp.strategy import FedAvg

from fedhv.errors import ConfigError
from fedhv.flower.strategy_rules import loss_only_method
from fedhv.flower.strategy_weighting import FedHVStrategy, FedHVWeighting, LossWeightingStrategy, UniformStrategy, _init

__all__ = ["composition_problem", "fedhv_strategy"]

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
