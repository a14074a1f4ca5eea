"""Validation of client replies before aggregation.

A server must not let one faulty client poison the global model or the task weights.
Every reply is checked against what the stage asked for; a client whose reply fails
any check is rejected *as a whole* for the round's remaining stages (its update and
its report are both discarded) and the reason is logged and counted.

Checks, for a stage of a run with ``m`` tasks and ``d`` parameters that asked for
``T`` gradient / trajectory rows:

- report (when asked for): a 1-D vector of exactly ``m`` finite values, ``>= 0`` for the
  tasks whose loss is declared non-negative (``ReplySpec.nonnegative``; the built-in
  losses: NLL, BCE, MSE); a task declared of any sign (``Task(nonnegative=False)``, e.g. a
  Gaussian negative log-likelihood) may report any finite value;
- gradients / deltas (when asked for): shape ``[T, d]``, all values finite;
- optional norm bounds (``validation.*``; both off by default), on the float64 L2 norm
  of each row ``u_t`` of a client's ``[T, d]`` upload:

  * ``max_update_norm = B``: an update (``deltas``) row with ``||u_t|| > B`` is
    rejected. Updates only: a model update and a gradient differ in scale by the
    learning rate and the step count, so one absolute bound cannot serve both;
  * ``max_update_norm_ratio = rho > 1``: among the replies that passed every other
    check, a client with ``||u_kt|| > rho * med_t`` for some row ``t`` is rejected,
    where ``med_t`` is the *lower* median of the ``k`` row norms (the
    ``ceil(k/2)``-th smallest). Updates and gradient uploads alike: the rule is
    scale-free. The lower median stays an honest client's norm while at most
    ``floor(k/2)`` replies are inflated, so up to half of a round's replies (one of
    two, two of four) are caught; a client whose norm is within ``rho`` times the
    lower median is never rejected.

- optional report bound (``ReplySpec.max_report_ratio = rho``; off in the simulator,
  :data:`REPORT_OUTLIER_RATIO` on the Flower paths, whose replies come from other hosts):
  among the replies that passed every other check, a client with ``F_ki > rho * med_i``
  for some task ``i`` is rejected, ``med_i`` the lower median of the ``k`` reports of
  task ``i`` (the same order statistic as the norm rule). A report of a non-negative task
  is ``>= 0``, so one client can then move the mean report of a round by at most
  ``rho * med_i / k`` (it cannot be caught below that bound); with ``k = 2`` the larger of
  the two is the one rejected. The rule is a ratio to a distance from the bound 0, so it
  applies to the tasks declared non-negative only: a task of any sign has no such scale
  (its median may be 0 or negative), and its reports are bounded by finiteness alone.

A value that cannot be read as a number array (wrong type, ragged) is rejected too.
Self-reported counts (sample counts a weighting uses) are checked by :func:`count_problem`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedhv.algorithms.base import Replies

#: ``max_report_ratio`` of the Flower paths (strategies and back-end): a report above 10x the
#: round's lower median of that task is an outlier. Honest reports of one round are taken at one
#: model (the spread comes from the clients' data only; 10x is far beyond it), and a report
#: 10x the median still moves a round's mean by at most ``10 * med / k``. Measured (simulator, paper
#: presets, 20 clients per round, 10 calibration + 10 FedHV rounds): the largest honest
#: ``F_ki / med_i`` was 1.09 on MultiMNIST (alpha 0.15) and 1.17 on MNIST-FMNIST (alpha 0.30).
REPORT_OUTLIER_RATIO = 10.0


class NoValidReplies(RuntimeError):
    """Raised by a federation when no sampled client returned a valid reply in a stage."""

    def __init__(self, dropped: list[int], rejected: list[tuple[int, str]]) -> None:
        super().__init__(f"no valid client reply ({len(dropped)} dropped, {len(rejected)} rejected)")
        self.dropped = dropped
        self.rejected = rejected


@dataclass
class ClientReply:
    """One client's answer to one stage (``None`` = not sent)."""

    client: int
    report: Any = None
    gradients: Any = None
    deltas: Any = None
    #: Model buffers after training (Flower nodes of a model with buffers), not validated here.
    buffers: Any = None


@dataclass(frozen=True)
class ReplySpec:
    """What a stage expects from each client.

    Attributes
    ----------
    num_tasks : int
        ``m``.
    dim : int
        ``d``, the flat parameter count.
    report : bool
        A report was requested.
    gradient_rows, train_rows : int
        ``T`` rows of gradients / deltas requested (0 = none).
    max_update_norm : float
        Absolute bound on each update row's L2 norm (0 = off).
    max_norm_ratio : float
        Bound relative to the median row norm of the stage's valid replies (0 = off).
    max_report_ratio : float
        Bound on each task's report relative to the lower median of the stage's valid
        reports of that task (0 = off; :func:`report_outliers`; non-negative tasks only).
    nonnegative : tuple of bool, optional
        Per task: whether its loss is bounded below by 0, so that a negative report is
        invalid (:func:`fedhv.objectives.nonnegative_losses`). ``None``: every task.
    """

    num_tasks: int
    dim: int
    report: bool = False
    gradient_rows: int = 0
    train_rows: int = 0
    max_update_norm: float = 0.0
    max_norm_ratio: float = 0.0
    max_report_ratio: float = 0.0
    nonnegative: tuple[bool, ...] | None = None

    def nonnegative_mask(self) -> np.ndarray:
        """Boolean ``[m]``: the tasks whose reports must be ``>= 0``."""
        if self.nonnegative is None:
            return np.ones(self.num_tasks, dtype=bool)
        return np.asarray(self.nonnegative, dtype=bool).reshape(-1)


def _as_array(value: Any) -> np.ndarray | None:
    """``value`` as a float64 array, or ``None`` when it is not numeric."""
    try:
        if isinstance(value, torch.Tensor):
            arr = value.detach().to("cpu", torch.float64).numpy()
        else:
            arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, RuntimeError):
        return None
    return arr


def _tensor_problem(name: str, value: Any, shape: tuple[int, ...]) -> str | None:
    if value is None:
        return f"{name} missing"
    if isinstance(value, torch.Tensor):
        if value.dtype.is_complex or not (value.dtype.is_floating_point or value.dtype == torch.int64):
            return f"{name} has dtype {value.dtype}"
        if tuple(value.shape) != shape:
            return f"{name} has shape {tuple(value.shape)}, expected {shape}"
        if not bool(torch.isfinite(value).all()):
            return f"{name} has non-finite values"
        return None
    if isinstance(value, np.ndarray) and value.dtype.kind not in "fiu":  # complex, bool, object, text
        return f"{name} has dtype {value.dtype}"
    arr = _as_array(value)
    if arr is None:
        return f"{name} is not a numeric array ({type(value).__name__})"
    if arr.shape != shape:
        return f"{name} has shape {arr.shape}, expected {shape}"
    if not np.isfinite(arr).all():
        return f"{name} has non-finite values"
    return None


def array_problem(name: str, value: Any, shape: tuple[int, ...]) -> str | None:
    """Why ``value`` is not a finite real array of ``shape`` (``name`` in the reason), or ``None``."""
    return _tensor_problem(name, value, shape)


def count_problem(value: Any, name: str, minimum: int, maximum: int) -> str | None:
    """Why a self-reported count (a sample count) is not an integer in ``[minimum, maximum]``, or ``None``.

    An ``int`` or an integral finite ``float`` is a count; ``bool``, strings, lists and
    anything else are not.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return f"{name} = {value!r} is not an integer"
    if isinstance(value, (float, np.floating)) and (not np.isfinite(value) or float(value) != int(value)):
        return f"{name} = {value!r} is not an integer"
    if not minimum <= int(value) <= maximum:
        shown = f"{float(value):g}" if isinstance(value, (float, np.floating)) else str(int(value))
        return f"{name} = {shown} is outside [{minimum}, {maximum}]"
    return None


def is_non_finite(problem: str) -> bool:
    """Whether a :func:`reply_problem` reason is a NaN / infinite value (not shape, type or norm)."""
    return "non-finite values" in problem


def reply_problem(reply: ClientReply, spec: ReplySpec) -> str | None:
    """Why ``reply`` must be rejected, or ``None`` when it is valid."""
    if spec.report:
        if reply.report is None:
            return "report missing"
        arr = _as_array(reply.report)
        if arr is None:
            return f"report is not numeric ({type(reply.report).__name__})"
        if arr.ndim != 1 or arr.shape[0] != spec.num_tasks:
            return f"report has shape {arr.shape}, expected ({spec.num_tasks},)"
        if not np.isfinite(arr).all():
            return f"report has non-finite values {arr.tolist()}"
        negative = np.flatnonzero((arr < 0) & spec.nonnegative_mask())
        if negative.size:
            return (f"report has negative losses {arr.tolist()} for task(s) {negative.tolist()} (0-based) declared "
                    "non-negative (the built-in losses, or Task(nonnegative=True)); for a loss of any sign declare "
                    "Task(..., nonnegative=False)")
    if spec.gradient_rows:
        problem = _tensor_problem("gradients", reply.gradients, (spec.gradient_rows, spec.dim))
        if problem:
            return problem
    if spec.train_rows:
        problem = _tensor_problem("update", reply.deltas, (spec.train_rows, spec.dim))
        if problem:
            return problem
        if spec.max_update_norm > 0:
            norm = float(row_norms(reply.deltas).max())
            if norm > spec.max_update_norm:
                return f"update norm {norm:.4g} exceeds validation.max_update_norm = {spec.max_update_norm:g}"
    return None


def row_norms(value: Any) -> np.ndarray:
    """Float64 L2 norms ``[T]`` of the rows of a validated ``[T, d]`` upload (no overflow)."""
    if isinstance(value, torch.Tensor):
        return torch.linalg.vector_norm(value.detach().to("cpu", torch.float64), dim=-1).numpy()
    return np.linalg.norm(np.asarray(value, dtype=np.float64), axis=-1)


def norm_outliers(valid: Sequence[ClientReply], spec: ReplySpec) -> list[str | None]:
    """``validation.max_update_norm_ratio``: why each valid reply is an outlier, or ``None``.

    Row ``t`` of client ``k`` is an outlier when ``||u_kt|| > rho * med_t``, with
    ``med_t`` the lower median of ``||u_jt||`` over the replies ``j`` in ``valid``
    (which passed :func:`reply_problem`).
    """
    problems: list[str | None] = [None] * len(valid)
    rho = spec.max_norm_ratio
    if rho <= 0 or not valid:
        return problems
    for name, label, rows in (("deltas", "update", spec.train_rows), ("gradients", "gradients", spec.gradient_rows)):
        if not rows:
            continue
        norms = np.stack([row_norms(getattr(r, name)) for r in valid])  # [k, T]
        median = np.sort(norms, axis=0)[(len(valid) - 1) // 2]  # lower median, per row
        for k in range(len(valid)):
            over = np.flatnonzero(norms[k] > rho * median)
            if problems[k] is None and over.size:
                t = int(over[0])
                problems[k] = (f"{label} norm {norms[k, t]:.4g} exceeds validation.max_update_norm_ratio = {rho:g} "
                               f"x the round's lower median {median[t]:.4g}")
    return problems


def report_outliers(valid: Sequence[ClientReply], spec: ReplySpec) -> list[str | None]:
    """``spec.max_report_ratio``: why each valid reply's report is an outlier, or ``None``.

    Task ``i`` of client ``k`` is an outlier when ``F_ki > rho * med_i``, with ``med_i``
    the lower median of ``F_ji`` over the replies ``j`` in ``valid`` (which passed
    :func:`reply_problem`: finite, ``m`` values). Only the tasks declared non-negative
    (``spec.nonnegative``) are checked: for a loss of any sign a ratio to the median has
    no meaning (a median of ``-0.5`` would reject every report above ``-5``).
    """
    problems: list[str | None] = [None] * len(valid)
    rho = spec.max_report_ratio
    if rho <= 0 or not spec.report or len(valid) < 2:
        return problems
    reports = np.stack([np.asarray(_as_array(r.report), dtype=np.float64).reshape(-1) for r in valid])  # [k, m]
    median = np.sort(reports, axis=0)[(len(valid) - 1) // 2]
    checked = spec.nonnegative_mask()
    for k in range(len(valid)):
        over = np.flatnonzero((reports[k] > rho * median) & checked)
        if over.size:
            i = int(over[0])
            problems[k] = (f"report {reports[k, i]:.4g} of task {i} exceeds {rho:g} x the round's lower median "
                           f"{median[i]:.4g} (an outlier report)")
    return problems


def split_replies(replies: Replies) -> list[ClientReply]:
    """Per-client views of stacked replies."""
    out = []
    for i, c in enumerate(replies.clients):
        out.append(ClientReply(
            int(c),
            None if replies.reports is None else replies.reports[i],
            None if replies.gradients is None else replies.gradients[i],
            None if replies.deltas is None else replies.deltas[i],
        ))
    return out


def stack_replies(valid: Sequence[ClientReply], spec: ReplySpec, like: torch.Tensor) -> Replies:
    """Stack validated replies (in order) into :class:`Replies` of ``like``'s dtype and device."""

    def stack(name: str) -> torch.Tensor:
        return torch.stack([torch.as_tensor(getattr(r, name)).to(like) for r in valid])

    return Replies(
        clients=np.asarray([r.client for r in valid], dtype=np.int64),
        reports=stack("report") if spec.report else None,
        gradients=stack("gradients") if spec.gradient_rows else None,
        deltas=stack("deltas") if spec.train_rows else None,
    )
