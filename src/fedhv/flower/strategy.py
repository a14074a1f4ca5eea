"""Flower Strategies for your own ServerApp: FedHV and Uniform task weighting (flwr 1.42).

A user with their own ``ServerApp`` and ``ClientApp`` (Flower's Message API) drops
:class:`FedHVStrategy` (or :class:`UniformStrategy`) where FedAvg would go::

    strategy = FedHVStrategy(num_tasks=3, calibration_rounds=10)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=50)

or puts the task weighting on another FedAvg-family Strategy — a server optimiser::

    strategy = fedhv_strategy(FedAdam, num_tasks=3, calibration_rounds=10, eta=0.05)

and may wrap either in Flower's DP wrappers (``DifferentialPrivacyServerSideFixedClipping(strategy, …)``).

Protocol (one message round trip per round, as the paper's FedHV): the train message carries
the global arrays ``θᵗ`` and, in its ConfigRecord (``configrecord_key``, ``"config"`` by
default), the task weights ``wᵗ`` (``"fedhv-weights"``, read on the client with
:func:`task_weights`). Each client evaluates its *m* task losses at the received ``θᵗ`` (the
report), trains on ``Σᵢ wᵢ ℓᵢ`` and replies with its arrays and, through :func:`fedhv_reply`, the
report in the ``MetricRecord`` (``"fedhv-report"``). The server validates every reply, averages
the valid ones **in node-id order** (identical runs give bit-identical models whatever order the
replies arrive in) and sets

    w^{t+1}_i ∝ 1 / max(r_i − F_i^t, ρ_clip)

(:func:`fedhv.weighting.hv_weights`), ``F^t`` the averaged report. The reference ``r`` is given,
or calibrated as the paper does: ``calibration_rounds`` uniform-weight rounds, ``r = max_t F^t +
margin`` (:func:`fedhv.weighting.reference_from_losses`). :meth:`FedHVWeighting.start` runs them
from ``initial_arrays`` and starts the FedHV run again from ``initial_arrays`` (the server
optimiser's state, e.g. FedAdam's moments, is restored too); when another object drives the
rounds (a DP wrapper's ``start()``), the first ``calibration_rounds`` rounds of that run calibrate
with uniform weights and FedHV weighting follows from the model they reached (logged).

Evaluation rounds (``fraction_evaluate > 0``; 0 by default) send the global arrays; the client
answers with :func:`fedhv_evaluate_reply`; the replies are validated and averaged weighted by
``num-examples``, as FedAvg does.

Every loss-only method (:mod:`fedhv.algorithms.loss_only`: DWA, FAMO, RLW, STCH, inverse loss, linear
scalarisation, a user's own) shares this protocol: :class:`LossWeightingStrategy` runs its weight rule in
place of FedHV's map (``LossWeightingStrategy(fedhv.FAMO(), num_tasks=3)``, or
``fedhv_strategy(FedAdam, 3, weighting="dwa")``), with the same messages and checks.

FSMGDA, FedCMOO and the Gramian methods on their exchanges are not offered as Strategies: each round needs a gradient stage (every
client's *m* task gradients, or their sketches) before the training stage, a second round
trip with a reply format of its own, which ``Strategy.start``'s one train exchange per round
cannot express. They run through fedhv's own ServerApp (:mod:`fedhv.flower.app`).
"""

from __future__ import annotations

from fedhv.flower.strategy_compose import (
    FedHVStrategy,
    LossWeightingStrategy,
    UniformStrategy,
    composition_problem,
    fedhv_strategy,
    loss_signs,
)
from fedhv.flower.strategy_messages import (
    CALIBRATION_KEY,
    EXAMPLES_KEY,
    REPORT_KEY,
    UNIT_KEY,
    WEIGHTS_KEY,
    evaluate_reply_problem,
    fedhv_evaluate_reply,
    fedhv_reply,
    mean_metrics,
    node_id,
    records,
    task_weights,
    train_arrays_problem,
    train_metrics_problem,
)
from fedhv.flower.strategy_weighting import FedHVResult, FedHVWeighting, log

__all__ = ["CALIBRATION_KEY", "EXAMPLES_KEY", "REPORT_KEY", "UNIT_KEY", "WEIGHTS_KEY", "FedHVResult", "FedHVStrategy",
           "FedHVWeighting", "LossWeightingStrategy", "UniformStrategy", "composition_problem", "evaluate_reply_problem", "fedhv_evaluate_reply",
           "fedhv_reply", "fedhv_strategy", "log", "loss_signs", "mean_metrics", "node_id", "records", "task_weights",
           "train_arrays_problem", "train_metrics_problem"]
