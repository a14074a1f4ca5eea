"""Checks of :func:`fedhv.simulate` / :func:`fedhv.calibrate` arguments, before any work.

Each check raises :class:`~fedhv.errors.ConfigError` with one line naming the argument, the
value and the fix, so a mistyped argument never reaches round 1 (nor a torch traceback).
Values that would otherwise silently mean something else (``clients_per_round = 0``) are
refused, and harmless spellings are accepted as what they obviously mean (``seed =
numpy.int64(3)`` is the seed 3).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from fedhv.algorithms.method import Method
from fedhv.checks import as_seed, check_seed  # as_seed: re-exported (it moved to fedhv.checks)
from fedhv.devices import check_device
from fedhv.errors import ConfigError
from fedhv.methods import FedHV
from fedhv.registry import METHODS

__all__ = ["as_device", "as_method", "as_seed", "check_seed", "clients_per_round", "hv_reference", "plain_int",
           "plain_numbers", "real", "shared_parameters"]


def _choices() -> str:
    """The registered methods as constructor calls, for messages."""
    return ", ".join(f"{METHODS.get(n).__name__}()" for n in METHODS.names())


def as_method(method: object) -> Method:
    """``method`` itself when it is a method object; ``None`` is ``FedHV()``.

    A method object is a built-in's or any :class:`fedhv.Method` subclass's instance.

    Raises
    ------
    ConfigError
        For a name (``"fedhv"``, ``"dwa"``), a class instead of an instance, or anything else.
    """
    if method is None:
        return FedHV()
    if isinstance(method, Method):
        return method
    if isinstance(method, type) and issubclass(method, Method):
        where = "fedhv" if method.__module__.startswith("fedhv.") else method.__module__
        raise ConfigError(f"method = {where}.{method.__name__} is the class; pass an instance: "
                          f"{where}.{method.__name__}() (with its options as arguments)")
    if isinstance(method, str):
        known = {n.lower(): _class_path(METHODS.get(n)) for n in METHODS.names()}
        hint = f"pass {known[method.lower()]}()" if method.lower() in known else f"fedhv has no method " \
            f"{method!r}; pass one of {_choices()}"
        raise ConfigError(f"method = {method!r} is a string; {hint}")
    raise ConfigError(f"method = {method!r} ({type(method).__name__}) is not a fedhv method; pass one of "
                      f"{_choices()}, or an instance of your own fedhv.Method subclass")


def _class_path(cls: type) -> str:
    """``fedhv.DWA`` for a class ``fedhv`` exports, else its module path (``fedhv.algorithms.aggregators.FSMGDAUPGrad``)."""
    top = sys.modules.get("fedhv")
    return f"fedhv.{cls.__name__}" if getattr(top, cls.__name__, None) is cls else f"{cls.__module__}.{cls.__name__}"


def plain_int(value: object) -> object:
    """A numpy (or other ``numbers.Integral``) integer as a Python ``int``; anything else unchanged."""
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else value


def plain_numbers(obj: Any) -> Any:
    """``obj`` (a configuration dataclass, tuple, dict) with numpy scalars as Python numbers.

    Each scalar becomes the number it holds, so ``np.float32(0.05)`` is the learning rate 0.05
    (and ``config.toml`` can record it).
    """
    if isinstance(obj, np.generic):
        return obj.item()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: plain_numbers(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, tuple):
        return tuple(plain_numbers(v) for v in obj)
    if isinstance(obj, list):
        return [plain_numbers(v) for v in obj]
    if isinstance(obj, dict):
        return {k: plain_numbers(v) for k, v in obj.items()}
    return obj


def real(name: str, value: object, example: str) -> float:
    """``value`` as a float when it is a real number (numpy's too); else a one-line refusal."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise ConfigError(f"{name} = {value!r} ({type(value).__name__}) is not a number; pass e.g. {name} = {example}")


def as_device(model: nn.Module, device: str | torch.device | None) -> str:
    """The run's device: ``device``, or the model's own; unknown or unavailable devices refused.

    The check is the configuration's (:func:`fedhv.devices.check_device`, what ``fedhv run
    --device`` uses): ``"cuda"`` on a CPU-only torch is one line, not a torch traceback.
    """
    first = next(model.parameters(), None)
    if first is None:
        raise ConfigError("the model has no parameters; pass an nn.Module with trainable parameters")
    if device is None:
        return str(first.device)
    if not isinstance(device, (str, torch.device)):
        raise ConfigError(f"device = {device!r} ({type(device).__name__}) is not a device; use \"cpu\", \"cuda\", "
                          "\"cuda:N\" or \"mps\"")
    try:
        name = str(torch.device(device))
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"device = {device!r} is not a torch device; use \"cpu\", \"cuda\", \"cuda:N\" or \"mps\"") \
            from None
    check_device(name)
    return name


def clients_per_round(value: object, sizes: Sequence[int]) -> int:
    """``clients_per_round``: ``None`` = ``min(10, clients with samples)``; else an int in ``[1, usable]``.

    ``0`` is refused like any other value out of range (it does not mean "the default").
    """
    usable = sum(1 for s in sizes if s > 0)
    if value is None:
        return min(10, usable)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"clients_per_round = {value!r} must be an integer in [1, {usable}], or None for the "
                          f"default min(10, clients with samples) = {min(10, usable)}")
    cpr = int(value)
    if not 1 <= cpr <= usable:
        empty = len(sizes) - usable
        note = f" ({empty} of the {len(sizes)} clients are empty and never sampled)" if empty else ""
        raise ConfigError(f"clients_per_round = {cpr} must be in [1, {usable}] (the clients with samples{note}); "
                          f"pass a value in that range, or None for the default min(10, {usable}) = {min(10, usable)}")
    return cpr


def hv_reference(value: Any, num_tasks: int) -> float | tuple[float, ...]:
    """``hv_reference``: one finite number, or one per task (checked here, not at the first evaluation)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        values = [float(value)]
    elif isinstance(value, (Sequence, torch.Tensor)) and not isinstance(value, str):
        try:
            values = [float(v) for v in value]
        except (TypeError, ValueError):
            values = []
    else:
        values = []
    ok = values and all(math.isfinite(v) for v in values) and len(values) in (1, num_tasks)
    if not ok or (len(values) == 1 and not isinstance(value, numbers.Real) and num_tasks != 1):
        raise ConfigError(f"hv_reference = {value!r} must be one finite number for every task or {num_tasks} finite "
                          f"numbers (one per task, in task order); e.g. hv_reference = 3.0")
    return values[0] if isinstance(value, numbers.Real) else tuple(values)


def shared_parameters(model: nn.Module) -> list[tuple[str, str]]:
    """Pairs ``(first name, other name)`` of parameters a module registers under two names."""
    seen: dict[int, str] = {}
    pairs = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            pairs.append((seen[id(p)], name))
        else:
            seen[id(p)] = name
    return pairs
