"""Checks of a user's data, tasks and model, all made before round 1.

Every failure is a :class:`~fedhv.errors.ConfigError` with one line naming the task or
tensor, the value found and the fix. The rules:

- **inputs** ``x``: floating inputs are cast to the model's dtype (float64 / float16 data
  and a float32 model: float32); ``uint8`` inputs are refused (images: convert with
  ``x.float() / 255`` -- fedhv does not guess the scale); other integer inputs (token ids
  for an ``nn.Embedding``) are passed unchanged; NaN or infinite values are refused;
- **targets**: one row per input row; a classification label must be an integer in
  ``[0, Task.size)``; multi-label targets must lie in ``[0, 1]``; no NaN or infinity;
- **model**: on a few training rows (eval mode), each task's output must have shape
  ``[rows, Task.size]`` (a narrower or wider head, or a regression output that would
  broadcast against its target, is refused), and every task's loss must be finite;
- **heads**: :func:`check_heads`.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import nn

from fedhv.errors import ConfigError


def check_seed(name: str, value: object) -> None:
    """A seed must be an integer in ``[0, 2**32 - 1]``: random streams are keyed by 32-bit words, so
    ``2**32 + s`` would silently equal ``s`` (the configuration's rule, :mod:`fedhv.config.validation`)."""
    from fedhv.config.validation import SEED_BOUND

    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_BOUND:
        alias = f" ({value} would silently equal seed {value % SEED_BOUND})" if isinstance(value, int) else ""
        raise ConfigError(f"{name} = {value!r} is out of range; seeds must be integers in [0, 2**32 - 1 = "
                          f"{SEED_BOUND - 1}]{alias}")


def as_seed(name: str, value: object) -> int:
    """``value`` as a Python ``int`` seed: any integer (``numpy.int64`` too) in ``[0, 2**32 - 1]``."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
    check_seed(name, value)
    return value  # type: ignore[return-value]


def _first_bad(mask: torch.Tensor) -> int:
    return int(torch.nonzero(mask.reshape(len(mask), -1).any(1))[0, 0])


def check_inputs(x: torch.Tensor, what: str) -> None:
    """Refuse ``uint8`` and non-finite inputs (``what`` names the tensor)."""
    if x.dtype == torch.uint8:
        raise ConfigError(f"{what} has dtype uint8; convert it to floats yourself (images: x.float() / 255), "
                          "fedhv does not guess the scale")
    if x.is_floating_point() and len(x) and not bool(torch.isfinite(x).all()):
        raise ConfigError(f"{what} has NaN or infinite values (first in row {_first_bad(~torch.isfinite(x))}); "
                          "remove or impute those rows")


def check_targets(y: torch.Tensor, tasks: Sequence, what: str) -> None:
    """Check each task's columns of ``y [n, sum_i width_i]`` (float64) against its kind and size."""
    start = 0
    for t in tasks:
        col = y[:, start : start + t.width]
        start += t.width
        if len(col) == 0:
            continue
        bad = ~torch.isfinite(col)
        if bool(bad.any()):
            raise ConfigError(f"{what}: task {t.name!r} has NaN or infinite targets (first in row {_first_bad(bad)}); "
                              "remove or impute those rows")
        if t.kind == "classification":
            frac = col != col.round()
            if bool(frac.any()):
                row = _first_bad(frac)
                raise ConfigError(f"{what}: task {t.name!r} has a fractional class label {float(col[row, 0])!r} "
                                  f"(row {row}); class labels are integers in [0, {t.size})")
            out = (col < 0) | (col >= t.size)
            if bool(out.any()):
                row = _first_bad(out)
                raise ConfigError(f"{what}: task {t.name!r} has label {int(col[row, 0])} (row {row}) outside "
                                  f"[0, {t.size}); set Task(size=...) to the number of classes or relabel")
        elif t.kind == "multilabel":
            out = (col < 0) | (col > 1)
            if bool(out.any()):
                row = _first_bad(out)
                raise ConfigError(f"{what}: task {t.name!r} has a multilabel target outside [0, 1] (row {row}); "
                                  "multilabel targets are 0/1 (or probabilities)")


def check_lengths(n: int, parts: Sequence[torch.Tensor], tasks: Sequence, what: str) -> None:
    """Per-task target tensors must have one row per input row."""
    for t, p in zip(tasks, parts):
        if len(p) != n:
            raise ConfigError(f"{what}: task {t.name!r} has {len(p)} targets for {n} inputs; give one target per "
                              "row of x")


def head_keys(container: nn.Module, task_names: Sequence[str]) -> list[str]:
    """The submodule names of each task's head in ``container``, in task order: ``"0", "1", ...`` for an
    ``nn.ModuleList`` / ``nn.Sequential``, the task names for an ``nn.ModuleDict``."""
    if isinstance(container, nn.ModuleDict):
        return list(task_names)
    return [str(i) for i in range(len(task_names))]


def check_heads(module: nn.Module, heads: str, num_tasks: int, needed: bool, explicit: bool,
                task_names: Sequence[str] | None = None) -> None:
    """The per-task head container ``module.<heads>`` (FSMGDA / FedCMOO split encoder and heads there).

    Refused when the attribute is missing or does not hold one head per task and the method
    needs it (``needed``) or the caller named it (``explicit``); a model without heads is fine
    for FedHV and Uniform. An ``nn.ModuleDict`` must be keyed by the task names.
    """
    if not (needed or explicit):
        return
    found = getattr(module, heads, None)
    children = [n for n, _ in module.named_children()]
    if not isinstance(found, nn.Module):
        why = "the method splits encoder and task heads (FSMGDA, FedCMOO)" if needed else "heads was given"
        raise ConfigError(f"heads = {heads!r}: the model has no such submodule ({why}); its submodules are "
                          f"{children}: pass heads=<the one holding one head per task>")
    count = len(found) if isinstance(found, (nn.ModuleList, nn.Sequential, nn.ModuleDict)) else None
    if count != num_tasks:
        raise ConfigError(f"heads = {heads!r} is a {type(found).__name__} with {count if count is not None else 'no'} "
                          f"indexed heads for {num_tasks} tasks; use an nn.ModuleList with one head per task")
    if isinstance(found, nn.ModuleDict) and task_names is not None and set(found.keys()) != set(task_names):
        raise ConfigError(f"heads = {heads!r} is an nn.ModuleDict keyed {list(found.keys())}; key it by the task "
                          f"names {list(task_names)} (or use an nn.ModuleList in task order)")
    empty = [i for i, h in enumerate(found.children()) if not any(True for _ in h.parameters())]
    if empty:
        raise ConfigError(f"heads = {heads!r}: heads {empty} have no parameters; every task needs its own head")


@torch.no_grad()
def check_model(adapter: nn.Module, x: torch.Tensor, y: torch.Tensor, tasks: Sequence, objective: object) -> None:
    """One eval-mode forward on a few training rows: output shapes and finite losses per task."""
    rows = min(len(x), 8)
    xb, yb = x[:rows], y[:rows]
    was = adapter.training
    adapter.eval()
    try:
        outputs = adapter(xb)
    finally:
        adapter.train(was)
    for t, o in zip(tasks, outputs):
        if not isinstance(o, torch.Tensor):
            raise ConfigError(f"task {t.name!r}: the model's output is {type(o).__name__}; return a tensor per task")
        if not o.is_floating_point():
            raise ConfigError(f"task {t.name!r}: the model's output has dtype {o.dtype}; return floating-point outputs "
                              "(logits or predictions, not .argmax() or .long() of them)")
        if tuple(o.shape) != (rows, t.size):
            raise ConfigError(f"task {t.name!r}: the model's output has shape {list(o.shape)} for {rows} rows; expected "
                              f"[{rows}, {t.size}] (batch, Task.size = {t.size}); make the head {t.size} wide or set "
                              f"Task(size={o.shape[-1] if o.ndim else 1})")
    losses, _ = objective.per_sample(outputs, yb)  # type: ignore[attr-defined]
    for i, t in enumerate(tasks):
        if not bool(torch.isfinite(losses[:, i]).all()):
            raise ConfigError(f"task {t.name!r}: its loss is not finite on the first {rows} training rows at the "
                              "initial model; check the targets and the loss function")
