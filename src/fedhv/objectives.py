"""Task objectives: how model outputs and targets become per-task losses and scores.

One concept, :class:`Objective`: ``batch_losses(outputs, y)`` (per-task mean losses, what the
engines differentiate) and ``per_sample(outputs, y)`` (per-sample losses and scores, what
reports and evaluation average). Three objectives implement it:

- :class:`Classification` (the paper's digit / image benchmarks): task ``i`` predicts class
  ``y[..., i]``; outputs are log-probabilities; loss = negative log-likelihood; accuracy =
  arg-max correct.
- :class:`MultiLabel` (CelebA5): task ``i`` predicts a group of binary attributes
  ``y[..., groups[i]]``; outputs are sigmoid probabilities; loss = binary cross-entropy
  averaged over the group's attributes (paper B.2); accuracy = the fraction of the group's
  attributes predicted correctly at threshold 0.5.
- :class:`TaskObjective`: a user's :class:`Task` s (public as ``fedhv.Task``; also
  importable from :mod:`fedhv.api.tasks`), described below.

A user's tasks: task ``i`` owns ``width_i`` consecutive columns of the target matrix ``y [n, sum_i width_i]``
and one model output ``o_i [..., size_i]``.

Loss and score functions follow PyTorch's convention: they are called with the outputs
flattened to ``o [N, size]`` and the targets as a PyTorch loss expects them,

- ``classification`` (``size`` = classes): ``y`` int64 ``[N]`` (``F.cross_entropy(o, y,
  reduction="none")`` works as it is);
- ``multilabel`` (``size`` = attributes): ``y`` float ``[N, size]`` in ``[0, 1]``;
- ``regression`` (``size`` = targets): ``y`` float ``[N, size]``,

and return one value per sample, ``[N]`` (or ``[N, ...]``, averaged over the trailing
dimensions). A mean-reduced loss cannot be weighted per client and batch: an ``nn.Module``
loss with a ``reduction`` attribute (``nn.CrossEntropyLoss()``, ``nn.MSELoss()``, ...) is
copied with ``reduction="none"``; any other function that returns one number for ``N > 1``
samples is refused with the task's name.

Defaults by kind (per sample):

- ``classification``: ``l = -log softmax(o)_y`` (logits or log-probabilities:
  ``log_softmax`` leaves log-probabilities unchanged); score = ``1[argmax o = y]``,
  reported as **accuracy** (%);
- ``multilabel``: ``l = mean_j BCE(sigmoid(o_j), y_j)`` on logits; score = fraction of
  attributes with ``1[o_j > 0] = y_j``, reported as **accuracy** (%);
- ``regression``: ``l = mean_j (o_j - y_j)^2``; score = the same squared error, reported
  as **mse** (lower is better).

MeanAcc / WorstAcc average and minimise over the tasks whose score is an accuracy
(:attr:`Task.is_accuracy`); every task reports its own score under its own metric name
and direction (:meth:`Task.metric_info`).

Bottom layer: imports nothing from fedhv but :mod:`fedhv.errors`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from fedhv.errors import ConfigError


class Objective(Protocol):
    """What the engines, reports and evaluation call on a benchmark's objective."""

    def batch_losses(self, outputs: list[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        """Per-task mean loss ``[..., m]`` over the batch dimension (``outputs[i] [..., B, size_i]``)."""
        ...

    def per_sample(self, outputs: list[torch.Tensor], y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample losses ``[n, m]`` and scores ``[n, m]``."""
        ...


@dataclass(frozen=True)
class Classification:
    """One multi-class label per task."""

    def _per_sample(self, outputs: list[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        return torch.stack([-lp.gather(-1, y[..., i : i + 1]).squeeze(-1) for i, lp in enumerate(outputs)], -1)

    def batch_losses(self, outputs: list[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        """Per-task mean loss ``[..., m]`` over the batch dimension (``outputs [..., B, C_i]``)."""
        losses = [-lp.gather(-1, y[..., i : i + 1]).squeeze(-1).mean(-1) for i, lp in enumerate(outputs)]
        return torch.stack(losses, -1)

    def per_sample(self, outputs: list[torch.Tensor], y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample losses ``[n, m]`` and correctness ``[n, m]`` (0/1)."""
        correct = torch.stack([lp.argmax(-1) == y[:, i] for i, lp in enumerate(outputs)], -1)
        return self._per_sample(outputs, y), correct.to(outputs[0].dtype)


@dataclass(frozen=True)
class MultiLabel:
    """Groups of binary attributes per task (``groups[i]``: attribute columns of task ``i``)."""

    groups: tuple[tuple[int, ...], ...]

    def _bce(self, outputs: list[torch.Tensor], y: torch.Tensor) -> list[torch.Tensor]:
        return [
            F.binary_cross_entropy(p, y[..., list(g)].to(p.dtype), reduction="none").mean(-1)
            for p, g in zip(outputs, self.groups)
        ]

    def batch_losses(self, outputs: list[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        """Each task's mean binary cross-entropy over its attributes, averaged over the batch (``[..., m]``)."""
        return torch.stack([b.mean(-1) for b in self._bce(outputs, y)], -1)

    def per_sample(self, outputs: list[torch.Tensor], y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample losses ``[n, m]`` and scores ``[n, m]``."""
        losses = torch.stack(self._bce(outputs, y), -1)
        correct = torch.stack(
            [((p > 0.5) == y[..., list(g)].bool()).to(p.dtype).mean(-1) for p, g in zip(outputs, self.groups)], -1
        )
        return losses, correct


def nonnegative_losses(objective: object, num_tasks: int) -> tuple[bool, ...]:
    """Per task: whether its loss is bounded below by 0.

    An objective with a ``nonnegative`` attribute (a user's tasks:
    :attr:`TaskObjective.nonnegative`) says so per task; the built-in
    objectives (:class:`Classification`: negative log-likelihood of log-probabilities,
    :class:`MultiLabel`: binary cross-entropy) are ``>= 0`` for every task.
    """
    flags = getattr(objective, "nonnegative", None)
    if flags is None:
        return (True,) * num_tasks
    out = tuple(bool(f) for f in flags)
    if len(out) != num_tasks:
        raise ValueError(f"the objective declares {len(out)} loss signs for {num_tasks} tasks")
    return out

#: The default objective (one multi-class label per task).
CLASSIFICATION = Classification()


# --------------------------------------------------------------------------- a user's tasks

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KINDS = ("classification", "multilabel", "regression")


def _ce(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return -torch.log_softmax(o, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)


def _ce_score(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (o.argmax(-1) == y).to(o.dtype)


def _bce(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(o, y, reduction="none").mean(-1)


def _bce_score(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((o > 0) == (y > 0.5)).to(o.dtype).mean(-1)


def _mse(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (o - y).square().mean(-1)


_DEFAULTS: dict[str, tuple[LossFn, LossFn]] = {
    "classification": (_ce, _ce_score),
    "multilabel": (_bce, _bce_score),
    "regression": (_mse, _mse),
}


@dataclass(frozen=True)
class TaskMetric:
    """How a task's score is reported.

    Attributes
    ----------
    name : str
        ``"accuracy"`` (in %), ``"mse"`` or the user's ``Task(metric=...)``.
    higher_is_better : bool
    is_accuracy : bool
        Whether the score enters MeanAcc / WorstAcc.
    scale : float
        Factor from the mean per-sample score to the reported value (100 for accuracies).
    """

    name: str
    higher_is_better: bool
    is_accuracy: bool
    scale: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        """The metric as plain data (what a run records)."""
        return {"metric": self.name, "higher_is_better": self.higher_is_better, "is_accuracy": self.is_accuracy}


#: The metric of the built-in benchmarks' tasks (all classification or multi-label).
ACCURACY = TaskMetric("accuracy", True, True, 100.0)


def _unreduced(fn: LossFn | None) -> LossFn | None:
    """``fn`` itself, or a copy of an ``nn.Module`` loss with ``reduction = "none"``."""
    if fn is not None and isinstance(fn, torch.nn.Module) and getattr(fn, "reduction", "none") != "none":
        fn = copy.deepcopy(fn)
        fn.reduction = "none"  # type: ignore[assignment]
    return fn


@dataclass(frozen=True)
class Task:
    """One task: its name, kind, output size and (optionally) its own loss and score.

    Parameters
    ----------
    name : str
    kind : {"classification", "multilabel", "regression"}
    size : int
        Classes (classification), attributes (multilabel) or regression targets; the width
        of the model's output for the task.
    loss, score : callable, optional
        ``f(output [N, size], target) -> [N]`` in PyTorch's convention (module docstring);
        defaults by kind. An ``nn.Module`` loss is used with ``reduction = "none"``.
    metric : str, optional
        Name of the score in tables and records (default: ``"accuracy"`` for classification
        and multilabel tasks, ``"mse"`` for a regression task's default score, ``"score"``
        for a regression task's own score).
    higher_is_better : bool, optional
        Direction of a regression task's own score (default: True; the default ``"mse"`` is
        lower-is-better). Classification and multilabel scores are accuracies.
    nonnegative : bool, optional
        Whether the loss is bounded below by 0. Default: ``True`` for the built-in losses
        (cross-entropy, BCE, MSE), ``False`` for a loss of your own (a Gaussian negative
        log-likelihood, a log-likelihood ratio, ... may be negative). A report (a client's
        mean loss) below 0 of a task declared non-negative is rejected as invalid; the
        Flower paths' report-outlier bound (a ratio to the round's median report) applies
        to non-negative tasks only. Declare ``True`` for an own loss that cannot be negative
        to keep both checks.
    """

    name: str
    kind: str = "classification"
    size: int = 2
    loss: LossFn | None = None
    score: LossFn | None = None
    metric: str | None = None
    higher_is_better: bool | None = None
    nonnegative: bool | None = None

    def __post_init__(self) -> None:
        """Refuse an empty name, an unknown kind, a bad size or inconsistent fields (one line naming it)."""
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"Task name = {self.name!r} must be a non-empty string")
        if self.kind not in KINDS:
            raise ConfigError(f"Task {self.name!r}: kind = {self.kind!r} is unknown; use one of {', '.join(KINDS)}")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ConfigError(f"Task {self.name!r}: size = {self.size!r} must be an integer >= 1 (classes, attributes "
                              "or targets)")
        if self.kind == "classification" and self.size < 2:
            raise ConfigError(f"Task {self.name!r}: a classification task needs size >= 2 classes (size = {self.size}); "
                              "for one binary output use kind = \"multilabel\" with size = 1")
        for what in ("loss", "score"):
            fn = getattr(self, what)
            if fn is not None and not callable(fn):
                raise ConfigError(f"Task {self.name!r}: {what} = {fn!r} is not callable; pass f(output, target)")
        if self.nonnegative is not None and not isinstance(self.nonnegative, bool):
            raise ConfigError(f"Task {self.name!r}: nonnegative = {self.nonnegative!r} must be True (the loss is >= 0), "
                              "False (a loss of any sign) or None (True for the built-in losses)")
        if self.higher_is_better is not None and self.kind != "regression":
            raise ConfigError(f"Task {self.name!r}: higher_is_better applies to regression tasks only (a {self.kind} "
                              "task's score is an accuracy)")

    @property
    def width(self) -> int:
        """Target columns of the task (1 for a class label)."""
        return 1 if self.kind == "classification" else self.size

    @property
    def is_accuracy(self) -> bool:
        """Whether the task's score is an accuracy (it enters MeanAcc / WorstAcc)."""
        return self.kind != "regression"

    @property
    def loss_nonnegative(self) -> bool:
        """Whether the task's loss is declared ``>= 0`` (``nonnegative``, or: the loss is a built-in one)."""
        return self.loss is None if self.nonnegative is None else self.nonnegative

    def metric_info(self) -> TaskMetric:
        """Name, direction and scale of the task's reported score."""
        if self.is_accuracy:
            return TaskMetric(self.metric or "accuracy", True, True, 100.0)
        if self.score is None:
            return TaskMetric(self.metric or "mse", False, False)
        better = True if self.higher_is_better is None else bool(self.higher_is_better)
        return TaskMetric(self.metric or "score", better, False)

    def loss_fn(self) -> LossFn:
        """The per-sample loss: the task's own ``loss``, else its kind's default."""
        return _unreduced(self.loss) or _DEFAULTS[self.kind][0]

    def score_fn(self) -> LossFn:
        """The per-sample score: the task's own ``score``, else its kind's default."""
        return _unreduced(self.score) or _DEFAULTS[self.kind][1]

    def target(self, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The task's columns ``y [N, width]`` in PyTorch's convention (int64 ``[N]`` for a class label)."""
        return y[:, 0].long() if self.kind == "classification" else y.to(dtype)


def _per_sample(task: Task, fn: LossFn, what: str, o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``fn`` on ``o [..., size]``, ``y [..., width]`` flattened to PyTorch's ``[N, ...]``; returns ``[...]``."""
    lead = o.shape[:-1]
    n = lead.numel()
    flat_o = o.reshape(n, o.shape[-1])
    out = fn(flat_o, task.target(y.reshape(n, y.shape[-1]), o.dtype))
    if not isinstance(out, torch.Tensor):
        raise ConfigError(f"Task {task.name!r}: its {what} returned {type(out).__name__}; return a tensor with one "
                          "value per sample")
    if out.ndim == 0 or out.shape[0] != n:
        raise ConfigError(f"Task {task.name!r}: its {what} returned shape {tuple(out.shape)} for {n} samples; return "
                          "one value per sample (e.g. reduction=\"none\"), not the batch mean")
    if out.ndim > 1:
        out = out.reshape(n, -1).mean(-1)
    return out.reshape(lead)


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

    @property
    def metrics(self) -> tuple[TaskMetric, ...]:
        """Each task's metric (:meth:`Task.metric_info`)."""
        return tuple(t.metric_info() for t in self.tasks)

    @property
    def nonnegative(self) -> tuple[bool, ...]:
        """Per task: whether its loss is declared ``>= 0`` (:attr:`Task.loss_nonnegative`)."""
        return tuple(t.loss_nonnegative for t in self.tasks)

    def batch_losses(self, outputs: list[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        """Per-task mean loss ``[..., m]`` over the batch dimension (``outputs[i] [..., B, size_i]``)."""
        cols = self._columns(y)
        return torch.stack([_per_sample(t, t.loss_fn(), "loss", o, c).mean(-1)
                            for t, o, c in zip(self.tasks, outputs, cols)], -1)

    def per_sample(self, outputs: list[torch.Tensor], y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample losses ``[n, m]`` and scores ``[n, m]``."""
        cols = self._columns(y)
        losses = torch.stack([_per_sample(t, t.loss_fn(), "loss", o, c) for t, o, c in zip(self.tasks, outputs, cols)],
                             -1)
        scores = torch.stack([_per_sample(t, t.score_fn(), "score", o, c).to(losses.dtype)
                              for t, o, c in zip(self.tasks, outputs, cols)], -1)
        return losses, scores


def as_tasks(tasks: Sequence[Task | str]) -> tuple[Task, ...]:
    """Tasks from :class:`Task` objects or bare names (binary classification)."""
    if isinstance(tasks, (str, Task)):
        tasks = [tasks]
    out = tuple(t if isinstance(t, Task) else Task(str(t)) for t in tasks)
    if not out:
        raise ConfigError("tasks = [] is empty; give one Task per model output")
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"tasks = {names} repeat a name; give every task its own name")
    return out
