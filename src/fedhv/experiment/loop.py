"""The federated round loop shared by calibration and training runs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedhv.algorithms.base import Algorithm, Federation
from fedhv.algorithms.validation import NoValidReplies
from fedhv.config.schema import ValidationConfig
from fedhv.data.federated import FederatedData
from fedhv.devices import synchronize
from fedhv.errors import FedHVError
from fedhv.experiment.divergence import check_model, lost_rounds_error, lr_hint, where
from fedhv.experiment.setup import sample_clients
from fedhv.sim.engine import Engine
from fedhv.sim.faults import FaultInjector
from fedhv.sim.federation import SimFederation

log = logging.getLogger("fedhv")

#: The skipped-rounds rule (:func:`run_rounds`): after at least ``SKIPPED_MIN_ROUNDS`` rounds, a run
#: stops when more than ``SKIPPED_FRACTION`` of its last ``SKIPPED_WINDOW`` rounds (or of all its rounds,
#: when fewer) were skipped (no valid client reply). A window, not the whole run, so that a run that stops
#: learning late (every report rejected from round 40 on) is caught within ten rounds.
SKIPPED_WINDOW = 10
SKIPPED_FRACTION = 0.5
SKIPPED_MIN_ROUNDS = 4


class SkippedRoundsError(FedHVError):
    """Most of a run's recent rounds had no valid client reply; the finished rounds are kept."""


def skipped_rounds_error(round_done: int, stream: str, skipped: int, window: int,
                         example: tuple[int, str] | None) -> SkippedRoundsError:
    """The skipped-rounds rule's error, naming the rounds, a rejected reply and the fix."""
    detail = f" (e.g. client {example[0]}: {example[1]})" if example else " (every sampled client dropped out)"
    fix = ("a task's loss is negative: declare Task(..., nonnegative=False) for a loss of any sign"
           if example and "negative losses" in example[1] else
           "see the rejection reasons in rounds.jsonl (validation.* bounds, the clients' data, the learning rates)")
    return SkippedRoundsError(
        f"{where(round_done, stream)}: {skipped} of the last {window} rounds were skipped (no valid client "
        f"reply){detail}; the run stops, its finished rounds are kept; {fix}"
    )


#: ``factory(clients, round_idx, seed, stream)`` -> one round's
#: :class:`~fedhv.algorithms.base.Federation` (whose protocol declares the books this loop reads:
#: ``client_seconds``, ``bytes_down``, ``bytes_up``, ``stages``, ``dropped``, ``rejected``,
#: ``diverged``, ``extras``, ``global_buffers``). ``None`` in :func:`run_rounds` means the
#: simulator's ``SimFederation`` over the engine.
FederationFactory = Callable[[np.ndarray, int, int, str], Federation]


@dataclass
class RoundRecord:
    """What happened in one round (1-based ``round`` = rounds completed)."""

    round: int
    clients: list[int]
    log: dict[str, Any]
    time_client_s: float
    time_server_s: float
    bytes_down: int
    bytes_up: int
    sync_stages: int
    dropped: list[int] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    skipped: bool = False

    @property
    def answered(self) -> int:
        """Sampled clients that answered (valid or not)."""
        return len(self.clients) - len(self.dropped)

    def as_dict(self) -> dict[str, Any]:
        faults: dict[str, Any] = {}
        if self.dropped or self.rejected or self.skipped:
            faults = {
                "dropped": self.dropped,
                "rejected": [{"client": c, "reason": r} for c, r in self.rejected],
                "skipped": self.skipped,
            }
        return {
            "round": self.round,
            "clients": self.clients,
            **self.log,
            "time_client_s": self.time_client_s,
            "time_server_s": self.time_server_s,
            "bytes_down_per_client": self.bytes_down,
            "bytes_up_per_client": self.bytes_up,
            "sync_stages": self.sync_stages,
            "dropped_clients": len(self.dropped),
            "rejected_clients": len(self.rejected),
            **faults,
        }


def run_rounds(
    algorithm: Algorithm,
    engine: Engine,
    data: FederatedData,
    theta: torch.Tensor,
    rounds: int,
    clients_per_round: int,
    seed: int,
    stream: str,
    on_round: Callable[[RoundRecord, torch.Tensor, Any], None] | None = None,
    start_round: int = 0,
    state: Any = None,
    faults: FaultInjector | None = None,
    validation: ValidationConfig | None = None,
    federation_factory: FederationFactory | None = None,
    aggregation: str = "mean",
) -> tuple[torch.Tensor, Any]:
    """Run ``rounds`` federated rounds from ``theta``.

    Parameters
    ----------
    on_round : callable, optional
        Called after every round with the record, the new model and state.
    start_round, state : int, optional
        Resume point: rounds already done and the algorithm state after them.
    faults : FaultInjector, optional
        Simulated client faults. A round in which no client returns a valid reply
        keeps ``theta`` and the state unchanged, is recorded with ``skipped`` and logged
        with the count so far (``round 7: no valid client reply ...; 3 of 7 rounds
        skipped``). Without simulated faults, more than ``SKIPPED_FRACTION`` (half) of
        the last ``SKIPPED_WINDOW`` (10) rounds skipped, after at least
        ``SKIPPED_MIN_ROUNDS`` (4), stops the run with :class:`SkippedRoundsError` (after
        ``on_round`` recorded the round); with ``faults.*`` set, skipped rounds are the
        experiment's expected outcome and never stop it. The window starts again at a resume.
    validation : ValidationConfig, optional
        Reply norm bounds and divergence checks (default: ``ValidationConfig()``).
    federation_factory : FederationFactory, optional
        Builds each round's federation from ``(clients, round, seed, stream)`` (e.g. the
        Flower back-end, :mod:`fedhv.flower`); ``engine`` then only supplies the device
        and the local learning rate, and the ``faults`` argument is not used: faults are
        the factory's. Over Flower, ``faults.corrupt_reports`` / ``corrupt_updates`` /
        ``poison_updates`` do apply (the SuperNodes put the simulator's keyed garbage in
        their replies in training rounds, see ``docs/flower.md``), while
        ``faults.client_dropout`` is not simulated (a node that does not answer in time
        is dropped). Default: a :class:`SimFederation` over ``engine``.

    aggregation : {"mean", "samples"}
        How the simulator's federation averages updates (``"samples"``: weighted by the
        clients' sample counts); a ``federation_factory`` applies its own.

    Returns
    -------
    theta, state
        Final global model and algorithm state.

    Raises
    ------
    DivergenceError
        When a round's new model is non-finite or exploded (before ``on_round`` sees
        it, so the last recorded round is the last good one), or after
        ``validation.divergence_rounds`` rounds in a row lost to non-finite training
        output (after ``on_round`` recorded the last of them). See
        :mod:`fedhv.experiment.divergence`.
    SkippedRoundsError
        When most recent rounds were skipped (the skipped-rounds rule above), after
        ``on_round`` recorded the last of them.
    """
    v = validation or ValidationConfig()
    hint = lr_hint(engine.lr_local, float(getattr(algorithm, "lr_global", float("nan"))))
    lost = 0  # rounds lost to the clients' own non-finite training output since the last valid reply
    if state is None:
        state = algorithm.init_state(data.num_tasks)
    pool = data.sampleable()  # None: every client has samples (the paper's settings)
    recent: list[bool] = []  # skipped flags of this call's rounds (the skipped-rounds rule's window)
    stop_on_skips = not (faults is not None and faults.active)
    example: tuple[int, str] | None = None  # a rejected reply of the last skipped round that had one
    for t in range(start_round, start_round + rounds):
        if pool is None:
            clients = sample_clients(seed, stream, t, data.num_clients, clients_per_round)
        else:  # empty clients are never sampled: M of the non-empty ones
            clients = pool[sample_clients(seed, stream, t, len(pool), clients_per_round)]
        federation: Federation
        if federation_factory is None:
            federation = SimFederation(engine, clients, t, faults, v.max_update_norm, v.max_update_norm_ratio,
                                       aggregation)
        else:
            federation = federation_factory(clients, t, seed, stream)
            if engine.buffers:  # the back-end federates the model's buffers through the engine's (Flower)
                federation.global_buffers = engine
        synchronize(engine.device)  # clock reads wait for the device's queued work
        t0 = time.perf_counter()
        skipped = False
        try:
            result = algorithm.round(state, theta, federation)
            check_model(theta, result.theta, t + 1, stream, hint, v.max_model_growth)
            theta, state, round_log = result.theta, result.state, result.log
            lost = 0
        except NoValidReplies:
            skipped, round_log = True, {}
            lost += 1 if federation.diverged else 0
            example = federation.rejected[0] if federation.rejected else example
            reason = f" (e.g. client {example[0]}: {example[1]})" if federation.rejected and example else ""
            log.warning("round %d: no valid client reply%s; model and task weights kept; %d of %d rounds skipped",
                        t + 1, reason, sum(recent) + 1, len(recent) + 1)
        round_log = {**round_log, **federation.extras}  # back-end facts (secure aggregation)
        synchronize(engine.device)
        elapsed = time.perf_counter() - t0
        record = RoundRecord(
            t + 1, clients.tolist(), round_log, federation.client_seconds, elapsed - federation.client_seconds,
            federation.bytes_down, federation.bytes_up, federation.stages, list(federation.dropped),
            list(federation.rejected), skipped,
        )
        if on_round is not None:
            on_round(record, theta, state)
        if v.divergence_rounds and lost >= v.divergence_rounds:
            raise lost_rounds_error(t + 1, stream, lost, federation.diverged[0], hint)
        recent.append(skipped)
        window = recent[-SKIPPED_WINDOW:]
        if stop_on_skips and len(recent) >= SKIPPED_MIN_ROUNDS and sum(window) > SKIPPED_FRACTION * len(window):
            raise skipped_rounds_error(t + 1, stream, sum(window), len(window), example)
    return theta, state
