"""FedCMOO-Pref (Askin et al., AISTATS 2025): FedCMOO's exchange with EPO's linear program.

As the authors' code (``askinb/FedCMOO``, ``server.py`` ``fedcmoo_pref`` and ``epo_lp.py``, itself from
Mahapatra and Rajan's EPOSearch, ICML 2020, "Multi-Task Learning with User Preferences: Gradient Descent
with Controlled Ascent in Pareto Optimization"). In stage 1 of FedCMOO's exchange
(:mod:`fedhv.algorithms.gramian`) the clients also report their ``m`` task losses at ``theta^t`` (a pass
over their local data in eval mode, ``m`` floats up); the server averages them into ``l`` and, with the
estimated Gramian ``C`` and the preference ``r > 0`` (EPO balances ``r_i l_i``: a larger ``r_i`` asks for
a smaller loss ``l_i``; ``"uniform"``: all ones), solves::

    rl = r * l,  lhat = rl / sum(rl),  mu = sum_i lhat_i log(m lhat_i),  a = r (log(m lhat) - mu),

    if mu > eps (not yet balanced):   max_alpha alpha^T C a   s.t. alpha in simplex,  (C alpha)_j >= rhs_j,
        rhs = C a with rhs_j = -inf where (C a)_j > 0 and rhs_j = 0 where rl_j >= 0.9 max(rl)
        (rhs = 0 when no (C a)_j > 0);
    else (balanced, the "relaxed" descent the authors call):   max 1^T C alpha  s.t. alpha in simplex, C alpha >= 0,

and trains on ``w = (1 - mix) alpha + mix / m`` (the authors' ``min_weight_multiplier = 0.2``), FedCMOO's
stage 2 unchanged. Defaults: ``eps = 1e-2``, ``mix = 0.2``, ``preference = "uniform"`` (the authors').
The authors solve with cvxpy and GLPK; fedhv with SciPy's ``linprog`` (HiGHS). A linear program can have
several optimal vertices, so two solvers may return different ``alpha`` at equal objective. Where the
balance program is infeasible (the authors' code then fails), fedhv falls back to the relaxed program,
and to ``1/m`` when that fails too; the round's log says which (``epo_move``). The authors do not divide
the Gram estimate by ``|S|`` (the programs are invariant to it).

Where fedhv differs from the authors' code, and why:

- **The losses ``l``.** The authors pool the participants' samples (``server.py``,
  ``getParticipatingClientLoss``: each batch's loss times its size, over all clients, divided by the pooled
  count) drawn from each client's training loader (shuffled, ``drop_last``: a random set of full batches
  each round, with the dataset's augmentation where it has one). Here ``l`` is FedHV's report: the mean over
  clients of each client's mean loss over its whole local data (eval mode), no
  augmentation. On the presets (clients of equal size) the two differ only by the dropped last batch.
- **The programs see the symmetric part of ``C``**, ``(C + C^T) / 2``, even with
  ``symmetrize = false`` (FedCMOO's estimate may be asymmetric; the authors use it as it is).
- **The learning rates** are the authors' (``config.py``: ``fedcmoo_pref`` η_g 1.6, η_l 0.3 on MultiMNIST
  and MNIST–FMNIST, where FedCMOO has 1.2 / 0.5): the presets' ``[lr.fedcmoo-pref]`` tables. On CIFAR10–MNIST
  and CelebA5 the authors give every method 1.6 / 0.3, FedCMOO's preset rates, which it takes there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedhv.algorithms.gramian import FEDCMOO_EXCHANGE, GRAMIAN_EXTRA, GramianInputs, gramian_method
from fedhv.algorithms.tuning import Dimension, Range
from fedhv.errors import ConfigError

#: EPO's preference entries lie in ``[1 / MAX_PREFERENCE, MAX_PREFERENCE]`` (issue 52; see ``check_rule``).
MAX_PREFERENCE = 1e6


def epo_adjustments(losses: np.ndarray, preference: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
    """``(rl, mu, a)`` of EPO for losses ``l > 0`` and preference ``r > 0``."""
    rl = preference * losses
    if (rl <= 0).any() or not np.isfinite(rl).all():
        raise FloatingPointError(f"fedcmoo-pref: EPO needs positive finite losses, got {losses.tolist()}")
    m = len(rl)
    lhat = rl / rl.sum()
    mu = float(np.sum(lhat * np.log(lhat * m)))
    return rl, mu, preference * (np.log(lhat * m) - mu)


def _linprog(objective: np.ndarray, c: np.ndarray, rhs: np.ndarray) -> np.ndarray | None:
    """``argmax objective^T alpha`` s.t. simplex and ``(C alpha)_j >= rhs_j`` (rows with ``-inf`` dropped)."""
    try:
        from scipy.optimize import linprog
    except ImportError as exc:
        raise ConfigError(f"fedcmoo-pref needs SciPy: {GRAMIAN_EXTRA}") from exc
    m = len(objective)
    rows = np.isfinite(rhs)
    a_ub = -c[rows] if rows.any() else None
    b_ub = -rhs[rows] if rows.any() else None
    res = linprog(-objective, A_ub=a_ub, b_ub=b_ub, A_eq=np.ones((1, m)), b_eq=np.ones(1), bounds=(0, None),
                  method="highs")
    return np.clip(res.x, 0.0, None) if res.status == 0 else None


def epo_alpha(losses: np.ndarray, gram: np.ndarray, preference: np.ndarray,
              eps: float = 1e-2) -> tuple[np.ndarray, str]:
    """EPO's ``alpha`` (the authors' ``get_alpha(l, G, r, C=True, relax=True)``) and the move taken.

    Returns
    -------
    alpha : ndarray ``[m]``
        On the simplex.
    move : {"balance", "descent", "uniform"}
        The program solved (``"uniform"``: both were infeasible).
    """
    c = 0.5 * (np.asarray(gram, dtype=np.float64) + np.asarray(gram, dtype=np.float64).T)
    rl, mu, a = epo_adjustments(np.asarray(losses, dtype=np.float64), np.asarray(preference, dtype=np.float64))
    ca = c @ a
    if mu > eps:
        j = ca > 0
        if j.any():
            rhs = ca.copy()
            rhs[j] = -np.inf
            rhs[rl >= 0.9 * rl.max()] = 0.0
        else:
            rhs = np.zeros_like(ca)
        alpha = _linprog(ca, c, rhs)
        if alpha is not None:
            return alpha, "balance"
    alpha = _linprog(c.sum(1), c, np.zeros(len(c)))
    if alpha is not None:
        return alpha, "descent"
    return np.full(len(c), 1.0 / len(c)), "uniform"


@dataclass(frozen=True)
class EPORule:
    """FedCMOO-Pref's rule: EPO's ``alpha`` from the reported losses and the Gramian, mixed with ``1/m``.

    Attributes
    ----------
    preference : "uniform" or tuple of float
        EPO's ``r`` (positive; ``"uniform"``: all ones).
    eps : float
        The non-uniformity ``mu`` above which EPO balances (the authors' 1e-2).
    mix : float
        ``w = (1 - mix) alpha + mix / m`` (the authors' ``min_weight_multiplier``, 0.2).
    """

    preference: str | tuple[float, ...] = "uniform"
    eps: float = 1e-2
    mix: float = 0.2
    rule_name: ClassVar[str] = "pref"
    #: ``fedhv tune`` searches the share of ``1/m`` in the weights (the authors' 0.2).
    tuning: ClassVar[tuple[Dimension, ...]] = (Range("mix", 0.05, 0.5, authors=(0.2,)),)
    label: ClassVar[str] = "FedCMOO-Pref"
    server_work: ClassVar[str] = "a linear program of size m (EPO)"
    needs_losses: ClassVar[bool] = True

    def preference_vector(self, m: int) -> np.ndarray:
        """``r`` for ``m`` tasks."""
        if isinstance(self.preference, str):
            return np.ones(m)
        r = np.asarray(self.preference, dtype=np.float64)
        if len(r) != m:
            raise ConfigError(f"fedcmoo-pref.preference has {len(r)} values for {m} tasks; give one per task or "
                              "\"uniform\"")
        return r

    @staticmethod
    def front_values(direction: tuple[float, ...]) -> dict[str, list[float]]:
        """Aim at the loss-space direction ``u``: EPO balances ``r_i l_i``, so its exact-Pareto point lies on
        the ray ``l ∝ 1/r``; the preference is ``r = m (1/u) / sum(1/u)`` (``u = 1/m``: all ones, the default)."""
        inv = 1.0 / np.asarray(direction, dtype=np.float64)
        return {"preference": (len(inv) * inv / inv.sum()).tolist()}

    def require(self, what: str) -> None:
        """Solve a 2-task program once, so that a missing SciPy is reported before round 1."""
        epo_alpha(np.array([1.0, 2.0]), np.eye(2), np.ones(2), self.eps)

    def weights(self, inputs: GramianInputs) -> np.ndarray:
        """``(1 - mix) alpha + mix / m``."""
        assert inputs.losses is not None
        m = len(inputs.losses)
        alpha, _ = epo_alpha(inputs.losses, inputs.gram, self.preference_vector(m), self.eps)
        return (1.0 - self.mix) * alpha + self.mix / m

    def check_rule(self, key: str) -> None:
        """Refuse a preference that is not positive, a negative ``eps`` or a ``mix`` outside ``[0, 1]``."""
        if isinstance(self.preference, str):
            if self.preference != "uniform":
                raise ConfigError(f"{key}.preference = {self.preference!r}: use \"uniform\" or a list of positive "
                                  "numbers, one per task")
        elif not self.preference or not all(isinstance(v, (int, float)) and v > 0 for v in self.preference):
            raise ConfigError(f"{key}.preference = {self.preference!r} must be positive numbers, one per task")
        elif not all(1 / MAX_PREFERENCE <= v <= MAX_PREFERENCE for v in self.preference):
            # EPO multiplies the losses by r and reads r_i l_i on the loss scale: [1e308, 1e308] overflowed the
            # products; a front sweep's preferences (m (1/u) / sum(1/u)) lie within [1/H, m] for H divisions
            raise ConfigError(f"{key}.preference = {list(self.preference)} is outside fedhv's range "
                              f"[{1 / MAX_PREFERENCE:g}, {MAX_PREFERENCE:g}] (EPO balances r_i l_i); scale it, e.g. "
                              "[1.0, 2.0] or \"uniform\"")
        if not self.eps >= 0 or not 0 <= self.mix <= 1:
            raise ConfigError(f"{key}.eps = {self.eps} must be >= 0 and {key}.mix = {self.mix} in [0, 1] "
                              "(the authors': 1e-2, 0.2)")


gramian_method(FEDCMOO_EXCHANGE, EPORule, class_name="FedCMOOPref", label="FedCMOO-Pref",
               doc="FedCMOO-Pref (Askin et al. 2025): EPO's program on FedCMOO's exchange; ``lr_global`` is ``eta_g``.")
