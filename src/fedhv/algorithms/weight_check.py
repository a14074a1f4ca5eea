"""The check every method's task weights pass before a client trains on them (issue 52).

A weight rule maps the round's reports (or Gramian) to the next task weights. Accepted finite settings can
still make it give weights no client can train on -- ``dwa.temperature = 1e-320`` overflows the softmax to
NaN, ``linear.weights = [1e308, 1e308]`` sums to infinity and normalises to zeros -- and a run would then
go on (exit 0 on zero weights) or stop blaming the learning rate. :func:`check_weights` refuses them where
they are made, in one line naming the round, the weights, the method's settings that produced them and a
value that works (the setting's default):

- ``"simplex"``: finite, ``>= 0``, summing to 1 (within ``1e-6``): every loss-only rule but STCH, FedHV,
  MGDA's and FedCMOO's FindWeights;
- ``"scaled"``: finite, ``>= 0``, a positive sum: a rule whose weights keep their authors' scale
  (STCH's :class:`~fedhv.algorithms.loss_only.ScaledLossOnlyState`);
- ``"finite"``: finite only: the Gramian aggregators, whose weights may be negative (IMTL-G, Aligned-MTL).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedhv.errors import FedHVError

#: How far a simplex rule's sum may stray from 1 (float64 round-off of a normalisation is ~1e-16 per task).
SIMPLEX_TOL = 1e-6
#: The kinds of weights :func:`check_weights` knows.
KINDS = ("simplex", "scaled", "finite")
#: Section keys that never change a rule's weights (not blamed).
NOT_WEIGHTS = ("report_batches",)


class WeightRuleError(FedHVError):
    """A method's rule gave task weights no client can train on (the message names the settings and a fix)."""


def _short(values: Any, limit: int = 6) -> str:
    flat = np.asarray(values, dtype=np.float64).reshape(-1).tolist()
    text = ", ".join(f"{v:.6g}" for v in flat[:limit])
    return f"[{text}{', ...' if len(flat) > limit else ''}]"


def settings(name: str, section: Any) -> tuple[list[str], list[str]]:
    """``(["dwa.temperature = 1e-320", ...], ["dwa.temperature = 2.0"])``: every weight setting of ``section``
    (a dataclass) and, for those away from their defaults, the default as the fix."""
    if section is None or not dataclasses.is_dataclass(section):
        return [], []
    given, fixes = [], []
    for f in dataclasses.fields(section):
        if f.name in NOT_WEIGHTS or not f.init:
            continue
        value = getattr(section, f.name)
        shown = list(value) if isinstance(value, tuple) else value
        given.append(f"{name}.{f.name} = {shown!r}")
        default = f.default if f.default is not dataclasses.MISSING else None
        if default is not None and value != default:
            fixes.append(f"{name}.{f.name} = {default!r}")
    return given, fixes


def problem(weights: np.ndarray, kind: str, num_tasks: int | None = None) -> str | None:
    """What is wrong with ``weights`` for a rule of ``kind`` (``None``: nothing)."""
    if kind not in KINDS:
        raise ValueError(f"kind = {kind!r}: use one of {KINDS}")
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or (num_tasks is not None and len(w) != num_tasks):
        return f"have shape {list(w.shape)}, not [{num_tasks}]"
    if not np.isfinite(w).all():
        return "are not finite"
    if kind == "finite":
        return None
    if (w < 0).any():
        return "have a negative entry"
    total = float(w.sum())
    if kind == "scaled":
        return None if total > 0 else "sum to 0 (no task is trained)"
    return None if abs(total - 1.0) <= SIMPLEX_TOL else f"sum to {total:.6g}, not 1 (they must lie on the simplex)"


def check_weights(weights: Any, *, name: str, round_index: int | None, kind: str, source: str | Callable[[], str],
                  section: Any = None, num_tasks: int | None = None) -> np.ndarray:
    """``weights`` as float64 if they pass ``kind``'s check, else a one-line :class:`WeightRuleError`.

    Parameters
    ----------
    weights : array ``[m]``
        What the rule gave.
    name : str
        The method's name (its section's, in the message).
    round_index : int or None
        The 0-based round whose inputs produced them (``None``: unknown).
    kind : {"simplex", "scaled", "finite"}
        What the weights must be (module docstring).
    source : str or callable
        What the rule read, for the message (``"the averaged report [2.3, 0.7]"``; a callable is called only
        when the check fails).
    section : dataclass, optional
        The method's settings: each is named in the message, and those away from their defaults get their
        default as the fix.
    num_tasks : int, optional
        ``m`` (the weights' length is checked against it).
    """
    w = np.asarray(weights, dtype=np.float64)
    wrong = problem(w, kind, num_tasks)
    if wrong is None:
        return w
    text = source() if callable(source) else source
    raise WeightRuleError(describe(name, round_index, f"task weights {_short(w)} {wrong}", text, section))


def describe(name: str, round_index: int | None, what: str, source: str, section: Any = None) -> str:
    """One line: round, what went wrong, the settings that produced it and the fix."""
    given, fixes = settings(name, section)
    made = f"{', '.join(given)} made them from {source}" if given else f"they come from {source}"
    if fixes:
        fix = f"set {' and '.join(fixes)} (the default{'s' if len(fixes) > 1 else ''}) or a value nearer it"
    elif given:
        fix = ("the settings are the defaults, so the inputs are out of the rule's range: check the tasks' losses "
               "(a loss at 0, or a model that diverged: lower the learning rates)")
    else:
        fix = "check the rule's settings and the tasks' losses"
    where = "" if round_index is None else f"round {round_index + 1}: "
    return f"{where}{name}'s {what}; {made}; {fix}"


def source_text(label: str, values: Sequence[float] | np.ndarray) -> str:
    """``"the averaged report [2.3, 0.7]"``."""
    return f"{label} {_short(values)}"
