"""The server side of a Flower run: the federation each round runs over, and the ServerApp's progress.

The one ServerApp is :data:`fedhv.flower.app.server_app` (``fedhv.flower.server:app`` names it too,
for apps generated before): ``flwr run`` of the App and ``fedhv flower local`` both run
:func:`fedhv.experiment.runner.run_experiment` (or ``resume_experiment``) with the
:class:`~fedhv.flower.federation.FlowerFederation` per round that :func:`federation_factory` makes,
instead of the simulator: the same run directory, checkpoints, evaluation (on the server's test
set) and summary as ``fedhv run``. A failure raises, so Flower marks the run failed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import numpy as np
from flwr.serverapp import Grid

from fedhv.config.flower import refuse_on_flower
from fedhv.config.schema import RunConfig
from fedhv.experiment.checkpoint import config_digest
from fedhv.experiment.loop import FederationFactory
from fedhv.flower.federation import FlowerFederation, handshake
from fedhv.sim.faults import FaultInjector

log = logging.getLogger("fedhv")


def federation_factory(grid: Grid, cfg: RunConfig, config_text: str, timeout: float | None,
                       node_wait: float = 120.0) -> FederationFactory:
    """Handshake with the SuperNodes, then build each round's :class:`FlowerFederation`."""
    from fedhv.data.benchmarks import BUILDERS
    from fedhv.data.user import user_benchmark
    from fedhv.objectives import as_tasks

    refuse_on_flower(cfg)
    nodes = handshake(grid, config_text, cfg.partition.clients, node_wait)
    sha, v = config_digest(config_text), cfg.validation
    ub = user_benchmark(cfg.data.benchmark)  # a user benchmark ("module:attr", importable on every host)
    num_tasks = len(as_tasks(ub.tasks)) if ub is not None else len(BUILDERS[cfg.data.benchmark].task_names)
    # which tasks' reports must be >= 0: a user's Task(nonnegative=...), every built-in benchmark's (CE / BCE)
    nonnegative = tuple(t.loss_nonnegative for t in as_tasks(ub.tasks)) if ub is not None else None

    def factory(clients: np.ndarray, round_idx: int, seed: int, stream: str) -> FlowerFederation:
        # the nodes inject the configured garbage (faults.corrupt_*, poison_updates) in training rounds,
        # as the simulator does; the server's copy only tells injected garbage from divergence
        f = cfg.faults
        faults = FaultInjector(corrupt_reports=f.corrupt_reports, corrupt_updates=f.corrupt_updates,
                               poison_updates=f.poison_updates, seed=seed, stream=stream) if stream == "train" else None
        if cfg.flower.secure_aggregation:  # SecAgg+: the server learns only the means (fedhv.flower.secure)
            from fedhv.flower.secure import SecureFlowerFederation

            return SecureFlowerFederation(grid, nodes, clients, round_idx, seed, stream, sha, num_tasks, cfg.flower,
                                          timeout, faults)
        return FlowerFederation(grid, nodes, clients, round_idx, seed, stream, sha, num_tasks, timeout,
                                v.max_update_norm, v.max_update_norm_ratio, faults, cfg.train.aggregation,
                                nonnegative)

    factory.engine = "sequential"  # type: ignore[attr-defined]  # what the nodes run (fedhv.flower.node)
    # environment.json["clients"]: what each client's node served (its own file and SHA-256, or samples)
    factory.provenance = {str(k): nodes.served.get(k, {}) for k in sorted(nodes.nodes)}  # type: ignore[attr-defined]
    return factory


class LogProgress:
    """A progress 'bar' that logs ``fedhv: <description> k/N`` (what ``flwr log`` shows)."""

    def __init__(self, total: int, description: str) -> None:
        self.total, self.description, self.n = total, description, 0
        log.info("fedhv: %s 0/%d", description, total)

    def update(self, k: int = 1) -> None:
        self.n += k
        log.info("fedhv: %s %d/%d", self.description, self.n, self.total)

    def close(self) -> None:
        pass


def round_line(total: int) -> Any:
    """An ``on_round`` hook logging ``fedhv: round t/T`` (and MeanAcc / WorstAcc when evaluated)."""
    def on_round(round_done: int, record: dict[str, Any]) -> None:
        ev = record.get("evaluation") or {}
        extra = "".join(f", {k} {ev[k]:.2f}" for k in ("mean_acc", "worst_acc") if isinstance(ev.get(k), float))
        skipped = ", skipped (no valid client reply)" if record.get("skipped") else ""
        log.info("fedhv: round %d/%d%s%s", round_done, total, extra, skipped)

    return on_round


def on_flower(cfg: RunConfig) -> RunConfig:
    """``cfg`` as a Flower run runs it: the nodes compute with the sequential engine
    (:mod:`fedhv.flower.node`), so the run's ``config.toml`` says ``engine = "sequential"``, as its
    ``summary.json`` does."""
    return dataclasses.replace(cfg, engine="sequential")


def fast_pulls(cap_s: float = 0.2) -> None:
    """Retry the pulls of reply objects after 0.02 s growing to ``cap_s`` (flwr 1.42: 1 s to 10 s).

    A reply is listed as soon as the SuperLink has its header; when its objects (the
    update) are still being uploaded, Flower's grid waits a full second before asking
    again, which alone added up to a second per stage on loopback.
    """
    from flwr.superlink.grid import http_grid

    if not isinstance(http_grid.pull_objects, functools.partial):
        http_grid.pull_objects = functools.partial(http_grid.pull_objects, initial_backoff=0.02,
                                                   backoff_cap=cap_s)


def __getattr__(name: str) -> Any:
    # ``fedhv.flower.server:app`` (apps generated before the two ServerApps became one) is the one
    # ServerApp, fedhv.flower.app:server_app.
    if name == "app":
        import importlib

        return importlib.import_module("fedhv.flower.app").server_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
