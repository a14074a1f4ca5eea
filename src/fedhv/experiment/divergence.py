"""Divergence checks: stop a run whose training has blown up instead of finishing it quietly.

A learning rate far too large (``--set train.lr_local=50``) makes the clients' local SGD
overflow: their updates become non-finite (rejected by reply validation) or finite but
astronomically large (accepted, and the averaged model is wrecked). Without a check the
run either skips every round and ends with the initial model, or trains on a destroyed
model and writes NaN metrics. These checks turn both into a :class:`DivergenceError`
that names the round and the learning rates; the runner keeps the checkpoint of the last
good round (the diverged model is never recorded).

Rules (``validation.*`` in the configuration):

1. **Non-finite model.** ``theta^{t+1}`` has a NaN or infinite entry.
2. **Exploding model.** ``||theta^{t+1}||_2 > G * ||theta^t||_2`` (norms in float64)
   with ``G = validation.max_model_growth`` (default ``1e4``; 0 = off). Measured on
   MultiMNIST (LeNet, ``||theta^0|| = 8.2``): one round changes the norm by < 1 % at the
   preset's ``eta_l = 0.3`` and by 1.6x at ``eta_l = 3``; diverged first rounds grew it
   1.6e17x (``eta_l = 10``) and past float32's range (``eta_l = 50``). ``G = 1e4`` lies
   four orders of magnitude above every legitimate round measured.
3. **Rounds lost to training.** ``R = validation.divergence_rounds`` (default 3; 0 = off)
   rounds in a row, counted since the last round with a valid reply, in which no reply
   was valid *and* at least one answering client's own training produced non-finite
   values (a rejection that fault injection did not cause: ``SimFederation.diverged``).
   Rounds lost only to simulated faults (``faults.*``) are expected and never count.
   The streak is not checkpointed: after ``--resume`` it starts again at 0.

Calibration (``fedhv.reference = "calibrate"``) is stricter, because it defines the
reference every later round is measured against and runs without simulated faults:

4. a calibration round without a valid reply stops it (:func:`check_calibration_round`);
5. a report that is missing or non-finite, or that grew past ``10 x`` the seed's first
   report (``max_t F_i^t > 10 * F_i^1`` for some task ``i``), stops it
   (:func:`check_calibration_reports`). The first report is taken at the initial model
   (``ln 10 = 2.30`` for the 10-class tasks, ``ln 2 = 0.69`` for CelebA's attributes);
   reports of a learning calibration decrease. The issue's diverged calibration grew
   them to ``[1.5e9, 4.8e9]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedhv.errors import FedHVError

#: Calibration reports may grow at most this factor over the seed's first report (rule 5).
CALIBRATION_GROWTH = 10.0


class DivergenceError(FedHVError):
    """The training (or the calibration) diverged; the message names the round and the learning rates."""


def lr_hint(lr_local: float, lr_global: float) -> str:
    """``"lower train.lr_local=50 or train.lr_global=1.2"``."""
    return f"lower train.lr_local={lr_local:g} or train.lr_global={lr_global:g}"


def cause_hint(reason: str, hint: str) -> str:
    """What to change for a rejected reply: ``hint`` (the learning rates), unless the cause is elsewhere.

    A report (the task losses ``F^t``) is evaluated at the received global model before any
    local step, and that model is finite (rule 1): a non-finite report therefore comes from
    the task's loss on that client's data, not from the learning rates.
    """
    if not reason.startswith("report has non-finite values"):
        return hint
    values = reason[len("report has non-finite values"):].strip().strip("[]")
    tokens = [t.strip().lower().lstrip("+-") for t in values.split(",")] if values.strip() else []
    bad = [i for i, t in enumerate(tokens) if t in ("nan", "inf", "infinity")]
    tasks = f"task(s) {bad}" if bad else "a task"
    return (f"reports are the task losses at the received global model, which was finite, so the loss of {tasks} "
            "(0-based, in task order) is NaN or infinite on this client's data: check that loss function and its "
            "targets (e.g. log of 0, sqrt of a negative), not the learning rates")


def where(round_done: int, stream: str) -> str:
    """``"round 12"`` or ``"calibration round 3"`` (1-based)."""
    return f"calibration round {round_done}" if stream == "calibration" else f"round {round_done}"


def _norm(theta: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(theta.detach().to(torch.float64)))


def check_model(theta_old: torch.Tensor, theta_new: torch.Tensor, round_done: int, stream: str, hint: str,
                max_growth: float) -> None:
    """Rules 1 and 2: raise when ``theta_new`` is non-finite or ``max_growth`` times larger than ``theta_old``.

    Raises
    ------
    DivergenceError
        Naming the round, both norms and the learning rates (``hint``).
    """
    if not bool(torch.isfinite(theta_new).all()):
        raise DivergenceError(
            f"{where(round_done, stream)}: the global model has non-finite values (the training diverged; {hint})"
        )
    if max_growth <= 0:
        return
    before, after = _norm(theta_old), _norm(theta_new)
    if before > 0 and after > max_growth * before:
        raise DivergenceError(
            f"{where(round_done, stream)}: the global model's norm grew from {before:.3g} to {after:.3g} in one round "
            f"(more than validation.max_model_growth = {max_growth:g} times; the training diverged or a client sent "
            f"a huge update; {hint}, or bound updates with validation.max_update_norm_ratio)"
        )


def lost_rounds_error(round_done: int, stream: str, rounds: int, example: tuple[int, str], hint: str
                      ) -> DivergenceError:
    """Rule 3's error: ``rounds`` rounds in a row lost to non-finite training output."""
    client, reason = example
    return DivergenceError(
        f"{where(round_done, stream)}: no valid client reply in {rounds} rounds in a row, and clients' own training "
        f"produced non-finite values (e.g. client {client}: {reason}); {_diagnosis(reason, hint)} "
        "(validation.divergence_rounds sets how many such rounds are tolerated)"
    )


def check_calibration_round(round_done: int, skipped: bool, rejected: Sequence[tuple[int, str]], hint: str) -> None:
    """Rule 4: a calibration round that no client answered validly stops the calibration."""
    if not skipped:
        return
    detail = f" (e.g. client {rejected[0][0]}: {rejected[0][1]})" if rejected else ""
    reason = rejected[0][1] if rejected else ""
    what = cause_hint(reason, hint)
    verdict = "the calibration diverged; " if what == hint else ""
    raise DivergenceError(f"calibration round {round_done}: no client returned a valid reply{detail}; {verdict}{what}")


def _diagnosis(reason: str, hint: str) -> str:
    what = cause_hint(reason, hint)
    return f"the training diverged; {hint}" if what == hint else what


def _finite_row(row: Any, m: int) -> list[float] | None:
    """``row`` as ``m`` finite floats, or ``None`` (``null`` / NaN / wrong length / not numeric)."""
    if not isinstance(row, (list, tuple)) or len(row) != m:
        return None
    out = []
    for v in row:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
        out.append(float(v))
    return out


def check_calibration_reports(reports: Mapping[str, Sequence[Any]], reference: Sequence[Any], hint: str,
                              nonnegative: Sequence[bool] | None = None) -> None:
    """Rule 5: every calibration report finite, and none above ``10 x`` its seed's first report.

    The growth bound is a ratio, meaningful for a loss bounded below by 0 only: it applies to
    the tasks ``nonnegative`` declares so (default: every task); a task of any sign is checked
    for finiteness alone (the model's own divergence checks, rules 1 and 2, still apply).

    Parameters
    ----------
    reports : mapping
        ``{seed: [[F_1, ..., F_m] per round]}`` (``CalibrationResult.reports``).
    reference : sequence
        The calibrated reference ``r``; must be finite.
    hint : str
        What to change (:func:`lr_hint`).

    Raises
    ------
    DivergenceError
        Naming the calibration seed, the rounds and the learning rates.
    """
    m = len(reference)
    if _finite_row(list(reference), m) is None:
        raise DivergenceError(f"calibration: the reference {list(reference)} has non-finite values; {hint}")
    for seed, rows in reports.items():
        if not rows:
            continue
        first = _finite_row(rows[0], m)
        for t, row in enumerate(rows):
            values = _finite_row(row, m)
            if values is None or first is None:
                raise DivergenceError(
                    f"calibration round {t + 1} (seed {seed}): the averaged report {row} is missing or non-finite "
                    f"(the calibration diverged); {hint}"
                )
            grown = [i for i in range(m) if (nonnegative is None or nonnegative[i])
                     and values[i] > CALIBRATION_GROWTH * first[i]]
            if grown:
                raise DivergenceError(
                    f"calibration round {t + 1} (seed {seed}): the averaged report {_fmt(values)} grew past "
                    f"{CALIBRATION_GROWTH:g}x round 1's {_fmt(first)} (the calibration diverged); {hint}"
                )


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"
