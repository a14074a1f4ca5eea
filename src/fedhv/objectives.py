"""Task objectives: how model outputs and labels become per-task losses and accuracy.

- :class:`Classification`: task ``i`` predicts class ``y[..., i]``; outputs are
  log-probabilities; loss = negative log-likelihood; accuracy = arg-max correct.
- :class:`MultiLabel`: task ``i`` predicts a group of binary attributes
  ``y[..., groups[i]]``; outputs are sigmoid probabilities; loss = binary cross-entropy
  averaged over the group's attributes (paper B.2, CelebA5); accuracy = the fraction of
  the group's attributes predicted correctly at threshold 0.5.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


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
        return torch.stack([b.mean(-1) for b in self._bce(outputs, y)], -1)

    def per_sample(self, outputs: list[torch.Tensor], y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        losses = torch.stack(self._bce(outputs, y), -1)
        correct = torch.stack(
            [((p > 0.5) == y[..., list(g)].bool()).to(p.dtype).mean(-1) for p, g in zip(outputs, self.groups)], -1
        )
        return losses, correct


Objective = Classification | MultiLabel


def nonnegative_losses(objective: object, num_tasks: int) -> tuple[bool, ...]:
    """Per task: whether its loss is bounded below by 0.

    An objective with a ``nonnegative`` attribute (a user's tasks:
    :attr:`fedhv.api.tasks.TaskObjective.nonnegative`) says so per task; the built-in
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
