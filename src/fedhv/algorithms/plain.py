"""Plain-data form of algorithm states, for checkpoints loaded with ``weights_only=True``.

A checkpoint may only hold tensors, numbers, strings, lists and dicts, so that loading
it cannot run code. Each state class converts itself with ``to_plain()`` and back with
``from_plain(data)``; numpy arrays travel as tensors of the same dtype (bit for bit).
``from_plain`` checks what it reads and raises :class:`StateError` with a description.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


class StateError(ValueError):
    """Plain data that is not a valid algorithm state."""


def array_to_plain(a: np.ndarray | None) -> torch.Tensor | None:
    """A copy of ``a`` as a CPU tensor of the same dtype (``None`` stays ``None``)."""
    return None if a is None else torch.from_numpy(np.array(a, copy=True))


def array_from_plain(value: Any, name: str, optional: bool = False) -> np.ndarray | None:
    """The 1-D finite floating array stored under ``name``.

    Raises
    ------
    StateError
        When ``value`` is not a 1-D floating tensor with finite values (or ``None`` for
        an ``optional`` field).
    """
    if value is None and optional:
        return None
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or not value.is_floating_point():
        raise StateError(f"{name} must be a 1-D floating tensor, found {_describe(value)}")
    if not bool(torch.isfinite(value).all()):
        raise StateError(f"{name} has non-finite values {value.tolist()}")
    return value.detach().cpu().numpy().copy()


def int_from_plain(value: Any, name: str, minimum: int = 0) -> int:
    """The integer ``>= minimum`` stored under ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise StateError(f"{name} must be an integer >= {minimum}, found {_describe(value)}")
    return value


def fields(data: Any, kind: str, names: tuple[str, ...]) -> Mapping[str, Any]:
    """``data`` as a mapping with exactly the keys ``names`` (the state ``kind``)."""
    if not isinstance(data, Mapping) or set(data) != set(names):
        keys = sorted(data) if isinstance(data, Mapping) else _describe(data)
        raise StateError(f"a {kind} state has the fields {list(names)}, found {keys}")
    return data


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return f"{type(value).__name__} {value!r}"[:120]
