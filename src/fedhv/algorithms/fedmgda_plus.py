"""FedMGDA+ (Hu, Li, Ramanathan and Jordan, IEEE TNSE 2022), adapted task-wise on FSMGDA's exchange.

"FedMGDA+: Federated Learning meets Multi-objective Optimization". The original treats each *client's*
update as an objective; here, as in every fedhv method, the objectives are the ``m`` tasks: the server
holds the averaged task updates ``Dbar_i`` of FSMGDA's exchange (:mod:`fedhv.algorithms.gramian`),
normalises them, ``u_i = Dbar_i / (||Dbar_i|| + 1e-8)``, and finds the min-norm point of their hull within
``epsilon`` of the uniform weights in the infinity norm::

    lambda = argmin lambda^T U U^T lambda   s.t.  lambda in simplex,
             max(0, 1/m - eps) <= lambda_i <= min(1, 1/m + eps),

then steps ``theta += eta_g sum_i lambda_i u_i`` (each head by its own task's weight). This follows FLGo's
implementation (``flgo/algorithm/fedmgda.py``, WwZzz/easyFL): normalised updates, the box around
``lambda_0`` (there the clients' data shares; here ``1/m``), the quadratic program ``P = 2 U U^T``, ``q = 0``,
and ``eta = 1``, ``epsilon = 0.1`` as its defaults (``eta`` is fedhv's ``eta_g``, ``[lr.fsmgda]``'s rates
when a configuration has none for ``fedmgda-plus``). The norms are those of the vectors the Gramian is built
from (the encoder parts, with the heads when ``count_decoders``): the rule returns ``lambda_i / (||Dbar_i||
+ 1e-8)`` as the weight of the raw update. FLGo solves the program with cvxopt; fedhv uses qpsolvers with
quadprog (the same solver torchjd's projections use), on ``U U^T + reg_eps I`` (quadprog needs a positive
definite matrix; ``reg_eps = 1e-9`` against a unit diagonal).

With two tasks the program has one answer: the min-norm point of two unit vectors is their midpoint,
``lambda = (1/2, 1/2)`` whatever their angle (``d/dlambda |lambda u_1 + (1 - lambda) u_2|^2 = 0`` at
``lambda = (1 - u_1.u_2) / (2 - 2 u_1.u_2) = 1/2``), so ``epsilon`` has no effect and FedMGDA+ steps along
the mean of the normalised task updates, a step of norm up to ``eta_g`` each round however far training
has come. Note the rates, too: the presets' ``[lr.fsmgda]`` ``eta_g = 2`` doubles FLGo's ``eta = 1`` on these
unit-norm directions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedhv.algorithms.gramian import FSMGDA_EXCHANGE, GRAMIAN_EXTRA, GramianInputs, gramian_method
from fedhv.algorithms.tuning import Dimension, Range
from fedhv.errors import ConfigError

#: FLGo's guard against a zero update in the normalisation.
NORM_GUARD = 1e-8


def box_min_norm(gram: np.ndarray, epsilon: float, reg_eps: float = 1e-9) -> np.ndarray:
    """``argmin lambda^T G lambda`` over the simplex within ``epsilon`` of ``1/m`` (infinity norm).

    Parameters
    ----------
    gram : ndarray ``[m, m]``
        A positive semi-definite Gramian (float64).
    epsilon : float
        The box's half-width around ``1/m`` (``epsilon >= 1 - 1/m``: the plain min-norm point).
    reg_eps : float
        Added to the diagonal for the solver.

    Returns
    -------
    ndarray ``[m]``
        The weights (float64).
    """
    try:
        from qpsolvers import solve_qp
    except ImportError as exc:
        raise ConfigError(f"fedmgda-plus needs qpsolvers and quadprog: {GRAMIAN_EXTRA}") from exc
    g = np.asarray(gram, dtype=np.float64)
    m = len(g)
    lam0 = 1.0 / m
    lb = np.full(m, max(0.0, lam0 - epsilon))
    ub = np.full(m, min(1.0, lam0 + epsilon))
    p = 2.0 * (0.5 * (g + g.T)) + 2.0 * reg_eps * np.eye(m)
    sol = solve_qp(p, np.zeros(m), A=np.ones((1, m)), b=np.ones(1), lb=lb, ub=ub, solver="quadprog")
    if sol is None:
        raise FloatingPointError(f"fedmgda-plus: quadprog found no solution for the Gramian {g.tolist()}")
    return np.asarray(sol, dtype=np.float64)


@dataclass(frozen=True)
class FedMGDAPlusRule:
    """FedMGDA+'s rule: box-constrained min-norm weights of the normalised task updates.

    Attributes
    ----------
    epsilon : float
        The half-width of the box around ``1/m`` (FLGo's 0.1; 0 is FedAvg of the normalised updates).
    reg_eps : float
        Diagonal regularisation of the normalised Gramian for the QP solver.
    """

    epsilon: float = 0.1
    reg_eps: float = 1e-9
    rule_name: ClassVar[str] = "fedmgda-plus"
    #: ``fedhv tune`` searches the box's half-width (FLGo's 0.1; no effect with two tasks).
    tuning: ClassVar[tuple[Dimension, ...]] = (Range("epsilon", 0.01, 1.0, log=True, authors=(0.1,)),)
    label: ClassVar[str] = "FedMGDA+"
    server_work: ClassVar[str] = "a box-constrained QP of size m"
    needs_losses: ClassVar[bool] = False

    def require(self, what: str) -> None:
        """Solve a 2 x 2 problem once, so that a missing solver is reported before round 1."""
        box_min_norm(np.eye(2), self.epsilon, self.reg_eps)

    def weights(self, inputs: GramianInputs) -> np.ndarray:
        """``lambda_i / (||Dbar_i|| + 1e-8)``, ``lambda`` from the normalised Gramian."""
        g = np.asarray(inputs.gram, dtype=np.float64)
        norms = np.sqrt(np.clip(np.diag(g), 0.0, None)) + NORM_GUARD
        lam = box_min_norm(g / np.outer(norms, norms), self.epsilon, self.reg_eps)
        return lam / norms

    def check_rule(self, key: str) -> None:
        """Refuse a negative box or regularisation."""
        if not self.epsilon >= 0 or not self.reg_eps >= 0:
            raise ConfigError(f"{key}.epsilon = {self.epsilon} and {key}.reg_eps = {self.reg_eps} must be >= 0 "
                              "(FLGo's epsilon: 0.1)")
        # the normalised Gramian has a unit diagonal: a regularisation of 1 already outweighs it (1e308 gave NaN)
        if self.reg_eps > 1.0:
            raise ConfigError(f"{key}.reg_eps = {self.reg_eps} is over fedhv's bound of 1 (it regularises a Gramian "
                              "of unit diagonal); e.g. 1e-9 (the default)")


gramian_method(FSMGDA_EXCHANGE, FedMGDAPlusRule, name="fedmgda-plus", class_name="FedMGDAPlus", label="FedMGDA+",
               doc="FedMGDA+ (Hu et al. 2022) task-wise on FSMGDA's exchange; ``lr_global`` is ``eta_g``.")
