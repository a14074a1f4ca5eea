"""The ``[flower]`` configuration section: secure aggregation on the Flower back-end.

The section's dataclass (:class:`~fedhv.config.schema.FlowerConfig`) lives with the others in
:mod:`fedhv.config.schema`; its checks and the SecAgg+ numbers behind its defaults live here.
"""

from __future__ import annotations

import math

from fedhv.config.schema import FlowerConfig, RunConfig
from fedhv.errors import ConfigError
from fedhv.registry import METHODS

__all__ = ["FlowerConfig", "check_flower", "check_nodes", "check_wait", "refuse_in_simulator", "refuse_on_flower"]

# Which methods SecAgg+ can carry is each method's own ``secure_aggregation`` (every stage needs
# only the *mean* of the clients' replies): FedHV and Uniform (one stage, mean update and mean
# report), FSMGDA (the per-task mean updates ``Dbar_i``); not FedCMOO, whose gradient stage returns
# every client's gradients ``G_k`` (:class:`fedhv.algorithms.fedcmoo.FedCMOO`).

#: flwr 1.42's SecAgg+ quantizes every value to an integer in ``[0, Q]`` with ``Q = 2**22`` and
#: sums modulo ``2**32``: ``n`` clients' sum stays below the modulus only for ``n * Q < 2**32``.
QUANTIZATION_RANGE = 2**22
MODULUS_RANGE = 2**32
MAX_SECURE_CLIENTS = MODULUS_RANGE // QUANTIZATION_RANGE - 1


#: Longest wait (seconds) a Flower stage (``--stage-timeout`` / ``stage-timeout``) or the wait for the
#: SuperNodes (``node-wait``) may be given: a week. A bound, so that no typo waits for ever.
MAX_WAIT_S = 7 * 24 * 3600.0
#: Most SuperNodes (``--nodes`` / the App's ``clients``) a Flower run may ask for; Flower's Simulation
#: Engine was measured here with 10,000 virtual SuperNodes.
MAX_NODES = 100_000


def check_wait(name: str, value: object) -> float:
    """``value`` as a wait in seconds: a finite number in ``[0, MAX_WAIT_S]`` (0 = no limit), else one
    line naming ``name``, the value and the fix."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not (
            0 <= value <= MAX_WAIT_S):
        raise ConfigError(f"{name} = {value!r} must be a number of seconds in [0, {MAX_WAIT_S:.0f}], e.g. 600")
    return float(value)


def check_nodes(name: str, value: object) -> int:
    """``value`` as a number of SuperNodes: an integer in ``[1, MAX_NODES]``, else one line naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_NODES:
        raise ConfigError(f"{name} = {value!r} must be an integer number of SuperNodes in [1, {MAX_NODES}] "
                          "(one per client), e.g. 10")
    return value


def check_flower(cfg: RunConfig) -> None:
    """Refuse ``[flower]`` values that SecAgg+ cannot run, each with its parameter, value and fix.

    Only checked with ``secure_aggregation = true``.
    """
    f = cfg.flower
    if not f.secure_aggregation:
        return
    spec = METHODS.get(cfg.method)
    if not getattr(spec, "secure_aggregation", False):
        why = getattr(spec, "secure_refusal", "") or "only methods that need nothing but the mean of the replies " \
            "can be masked"
        able = [n for n in METHODS.names() if getattr(METHODS.get(n), "secure_aggregation", False)]
        raise ConfigError(f"flower.secure_aggregation = true with method = {cfg.method!r}: {why}; use method "
                          f"{', '.join(able)}, or flower.secure_aggregation = false")
    if cfg.train.aggregation != "mean":
        raise ConfigError(f"train.aggregation = {cfg.train.aggregation!r} with flower.secure_aggregation = true: "
                          "SecAgg+ returns only the plain mean of the masked updates; use train.aggregation = "
                          "\"mean\" or flower.secure_aggregation = false")
    n = cfg.train.clients_per_round
    if not 2 <= n <= MAX_SECURE_CLIENTS:
        raise ConfigError(f"train.clients_per_round = {n} with flower.secure_aggregation = true: SecAgg+ needs 2 to "
                          f"{MAX_SECURE_CLIENTS} clients per round (the masked sum is modulo 2**32 of values up to "
                          "2**22); change train.clients_per_round")
    shares = f.num_shares
    if isinstance(shares, int):
        if not 3 <= shares <= n:
            raise ConfigError(f"flower.num_shares = {shares}: an integer must be between 3 and "
                              f"train.clients_per_round = {n}; or give a fraction of the clients, e.g. 1.0")
    elif not 0 < shares <= 1:
        raise ConfigError(f"flower.num_shares = {shares}: a fraction must be in (0, 1], e.g. 1.0 (every client)")
    t = f.reconstruction_threshold
    if isinstance(t, int):
        if t < 2 or (isinstance(shares, int) and t >= shares):
            raise ConfigError(f"flower.reconstruction_threshold = {t}: an integer must be >= 2 and below "
                              f"flower.num_shares = {shares}; or give a fraction of the shares, e.g. 0.67")
    elif not 0 < t <= 1:
        raise ConfigError(f"flower.reconstruction_threshold = {t}: a fraction must be in (0, 1], e.g. 0.67")
    c = f.clipping_range
    if not (math.isfinite(c) and c > 0):
        raise ConfigError(f"flower.clipping_range = {c} must be a positive number, e.g. 16")
    if cfg.validation.max_update_norm_ratio:
        raise ConfigError(f"validation.max_update_norm_ratio = {cfg.validation.max_update_norm_ratio} with "
                          "flower.secure_aggregation = true: the server never sees a client's update norm to "
                          "compare with the median; set it to 0 (validation.max_update_norm is checked on the nodes)")


def refuse_in_simulator(cfg: RunConfig, resume: str | None = None) -> None:
    """Refuse to *simulate* a configuration with ``flower.secure_aggregation = true``.

    The simulator runs every client in the server's own process, so it would see every
    client's update and report: the privacy the key asks for would silently not exist.
    Called where a simulator run starts (:func:`fedhv.experiment.runner` for ``fedhv run``,
    ``--resume``, ``fedhv grid`` jobs and the Python API; :func:`fedhv.experiment.grid.plan_grid`
    before any calibration), never on the Flower back-end. ``resume``: the run directory
    being resumed (the fix then names ``fedhv flower local --resume``).
    """
    if not cfg.flower.secure_aggregation:
        return
    how = (f"resume it with `fedhv flower local --resume {resume}`" if resume is not None
           else f"run it with `fedhv flower local {cfg.setting} --secure`")
    raise ConfigError(f"flower.secure_aggregation = true: secure aggregation is a Flower deployment mode and the "
                      f"simulator would see every client's update and report; {how}, or set "
                      "flower.secure_aggregation = false")


def refuse_on_flower(cfg: RunConfig) -> None:
    """Refuse what only the simulator runs: unequal client sizes and the diagnostics.

    A SuperNode serves one equal-size partition of a setting (or its own data file), and the
    diagnostics (:mod:`fedhv.diagnostics`) read every client's data on the server. Called by
    ``fedhv flower local`` before anything starts and by the ServerApp before the handshake.
    """
    if cfg.partition.sizes != "equal":
        raise ConfigError(f"partition.sizes = {cfg.partition.sizes!r}: a SuperNode serves one equal-size partition "
                          "of a setting; set partition.sizes = \"equal\", give each SuperNode its own data file "
                          "(fedhv flower export, --node-data), or run unequal sizes in the simulator (fedhv run)")
    if cfg.calibration.lr_local is not None and cfg.calibration.lr_local != cfg.train.lr_local:
        raise ConfigError(f"calibration.lr_local = {cfg.calibration.lr_local}: a SuperNode trains every stage, the "
                          "calibration's too, at the run's train.lr_local; leave calibration.lr_local unset on Flower")
    if cfg.diagnostics.enabled:
        raise ConfigError("diagnostics.enabled = true needs every client's data on the server: it runs in the "
                          "simulator (fedhv run, grid, fedhv.simulate); set diagnostics.enabled = false for Flower")
