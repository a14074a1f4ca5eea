"""Tasks of a user's multi-task problem and the objective the engines evaluate.

Task ``i`` owns ``width_i`` consecutive columns of the target matrix ``y [n, sum_i width_i]``
and one model output ``o_i [..., size_i]``. Its per-sample loss and score (defaults):

- ``classification`` (``size`` = classes, width 1): ``l = -log softmax(o)_y`` (accepts logits
  or log-probabilities: ``log_softmax`` leaves log-probabilities unchanged);
  score = ``1[argmax o = y]``;
- ``multilabel`` (``size`` = attributes, width ``size``): ``l = mean_j BCE(sigmoid(o_j), y_j)``
  on logits; score = fraction of attributes with ``1[o_j > 0] = y_j``;
- ``regression`` (``size`` = targets, width ``size``): ``l = mean_j (o_j - y_j)^2``;
  score = ``-l`` (negative squared error; "accuracy" columns then hold ``-100 * MSE``).

A custom ``loss(o, y) -> [...]`` / ``score(o, y) -> [...]`` must reduce only the last
dimension (the engines call it with leading copy and batch dimensions).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedhv.errors import ConfigError

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KINDS = ("classification", "multilabel", "regression")


def _ce(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return -torch.log_softmax(o, -1).gather(-1, y.long()).squeeze(-1)


def _ce_score(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (o.argmax(-1) == y[..., 0].long()).to(o.dtype)


def _bce(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(o, y.to(o.dtype), reduction="none").mean(-1)


def _bce_score(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((o > 0) == y.bool()).to(o.dtype).mean(-1)


def _mse(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (o - y.to(o.dtype)).square().mean(-1)


def _neg_mse(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return -_mse(o, y)


_DEFAULTS: dict[str, tuple[LossFn, LossFn]] = {
    "classification": (_ce, _ce_score),
    "multilabel": (_bce, _bce_score),
    "regression": (_mse, _neg_mse),
}


@dataclass(frozen=True)
class Task:
    """One task: its name, kind, output size and (optionally) its own loss and score.

    Parameters
    ----------
    name : str
    kind : {"classification", "multilabel", "regression"}
    size : int
        Classes (classification), attributes (multilabel) or regression targets.
    loss, score : callable, optional
        Per-sample ``f(output [..., size], target [..., width]) -> [...]``; defaults by kind.
    """

    name: str
    kind: str = "classification"
    size: int = 2
    loss: LossFn | None = None
    score: LossFn | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"Task {self.name!r}: kind = {self.kind!r} is unknown; use one of {', '.join(KINDS)}")
        if self.size < 1:
            raise ConfigError(f"Task {self.name!r}: size = {self.size} must be >= 1 (classes, attributes or targets)")

    @property
    def width(self) -> int:
        """Target columns of the task (1 for a class label)."""
        return 1 if self.kind == "classification" else self.size

    def loss_fn(self) -> LossFn:
        return self.loss or _DEFAULTS[self.kind][0]

    def score_fn(self) -> LossFn:
        return self.score or _DEFAULTS[self.kind][1]


@dataclass(frozen=True)
class TaskObjective:
    """Per-task losses and scores of :class:`Task` s (the engines' ``Objective`` protocol)."""

    tasks: tuple[Task, ...]

    def _columns(self, y: torch.Tensor) -> list[torch.Tensor]:
        out, start = [], 0
        for t in self.tasks:
            out.append(y[..., start : start + t.width])
            start += t.width
        return out

    def batch_losses(self, outputs: list[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        """Per-task mean loss ``[..., m]`` over the batch dimension (``outputs[i] [..., B, size_i]``)."""
        cols = self._columns(y)
        return torch.stack([t.loss_fn()(o, c).mean(-1) for t, o, c in zip(self.tasks, outputs, cols)], -1)

    def per_sample(self, outputs: list[torch.Tensor], y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample losses ``[n, m]`` and scores ``[n, m]``."""
        cols = self._columns(y)
        losses = torch.stack([t.loss_fn()(o, c) for t, o, c in zip(self.tasks, outputs, cols)], -1)
        scores = torch.stack([t.score_fn()(o, c).to(losses.dtype) for t, o, c in zip(self.tasks, outputs, cols)], -1)
        return losses, scores


def as_tasks(tasks: Sequence[Task | str]) -> tuple[Task, ...]:
    """Tasks from :class:`Task` objects or bare names (binary classification)."""
    out = tuple(t if isinstance(t, Task) else Task(str(t)) for t in tasks)
    if not out:
        raise ConfigError("tasks = [] is empty; give one Task per model output")
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"tasks = {names} repeat a name; give every task its own name")
    return out
