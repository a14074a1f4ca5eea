"""Build the run's components from a resolved configuration."""

from __future__ import annotations

import dataclasses
import logging
import warnings

import numpy as np

from fedhv.config.schema import RunConfig
from fedhv.data.configured import (  # re-exported: this module's names before data/configured.py
    DTYPES,
    check_batch_size,
    configured_augment,
    federated_data,
    load_data,
    partition_sizes,
)
from fedhv.data.federated import FederatedData
from fedhv.errors import ConfigError
from fedhv.experiment.problem import Problem
from fedhv.models import MultiTaskModel
from fedhv.models.module import ModuleAdapter, vmap_problem
from fedhv.rng import numpy_rng
from fedhv.sim.batched import BatchedEngine
from fedhv.sim.engine import Engine, SequentialEngine
from fedhv.sim.local_opt import LocalTraining
from fedhv.sim.memory import ChunkChoice, auto_chunk

__all__ = ["DTYPES", "check_batch_size", "choose_engine_chunk", "configured_augment", "federated_data", "load_data",
           "local_training", "make_engine", "new_model", "partition_sizes", "sample_clients"]

log = logging.getLogger("fedhv")


def new_model(cfg: RunConfig, data: FederatedData, seed: int) -> MultiTaskModel:
    """A freshly initialised model (PyTorch default init from the seed's stream).

    The initialisation is drawn on the CPU and the model then moved to ``cfg.device``,
    so every device starts from the same parameters.
    """
    return Problem.of(cfg).model(cfg, data, seed)


def local_training(cfg: RunConfig) -> LocalTraining:
    """The clients' local optimisation of ``[train]`` (:mod:`fedhv.sim.local_opt`)."""
    t = cfg.train
    try:
        return LocalTraining.of(t.optimizer, dict(t.optimizer_options), t.local_epochs or None,
                                t.clip_grad_norm or None, t.momentum)
    except ConfigError as exc:
        raise ConfigError(f"train.{exc}") from None


def make_engine(cfg: RunConfig, model: MultiTaskModel, data: FederatedData, seed: int, stream: str,
                available: int | None = None) -> Engine:
    """The configured engine over ``model`` (a working copy it may overwrite).

    ``available``: the memory (bytes) an automatic ``engine_chunk`` plans for; ``None``
    measures it (:func:`fedhv.sim.memory.available_bytes`). Objective reports are
    evaluated in chunks of ``eval.batch_size`` samples, as the test set is (CelebA5's
    1,000 instead of the engines' default 2,048: ResNet-18-GN forwards 2,048 samples at
    a time 1.56x slower per sample than 1,024 on the project's CPU).

    A user's module that ``torch.func.vmap`` cannot run (BatchNorm in train mode) runs on
    the sequential engine, with a one-line warning. ``engine_chunk = "auto"`` is resolved
    here by :func:`choose_engine_chunk`; the choice is kept as ``engine.chunk_choice``.
    """
    if cfg.engine == "batched" and isinstance(model, ModuleAdapter):
        problem = vmap_problem(model, data.train_x[:2])
        if problem is not None:
            warnings.warn(f"torch.func.vmap cannot run this model ({problem}); using the sequential engine",
                          RuntimeWarning, stacklevel=2)
            cfg = dataclasses.replace(cfg, engine="sequential")
    if cfg.engine == "batched":
        choice = choose_engine_chunk(cfg, model, data, available) if cfg.engine_chunk == "auto" else None
        engine = BatchedEngine(
            model, data, local_steps=cfg.train.local_steps, batch_size=cfg.train.batch_size, lr_local=cfg.lr_local,
            momentum=cfg.train.momentum, seed=seed, stream=stream, precision=cfg.precision,
            eval_batch_size=cfg.eval.batch_size, local=local_training(cfg),
            chunk=(choice.chunk if choice else 0) if cfg.engine_chunk == "auto" else int(cfg.engine_chunk),
        )
        engine.chunk_choice = choice
        return engine
    return SequentialEngine(
        model,
        data,
        local_steps=cfg.train.local_steps,
        batch_size=cfg.train.batch_size,
        lr_local=cfg.lr_local,
        momentum=cfg.train.momentum,
        seed=seed,
        stream=stream,
        precision=cfg.precision,
        eval_batch_size=cfg.eval.batch_size,
        local=local_training(cfg),
    )


def choose_engine_chunk(cfg: RunConfig, model: MultiTaskModel, data: FederatedData,
                        available: int | None = None) -> ChunkChoice | None:
    """``engine_chunk = "auto"``: the most copies that fit half the available memory.

    Logged (INFO: a grid's ``run.log``; WARNING when it is below ``train.clients_per_round``,
    i.e. when it actually splits a round). ``None`` (all copies at once, with a warning)
    when the model cannot run the meta-device dry forward of :mod:`fedhv.sim.memory`.
    """
    try:
        x = data.train_x
        choice = auto_chunk(model, tuple(x.shape[1:]), cfg.train.batch_size, cfg.precision, available,
                            None if x.is_floating_point() else x.dtype)
    except Exception as exc:  # noqa: BLE001 - any failure of the estimate means: no automatic chunk
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        log.warning("engine_chunk auto: cannot estimate this model's memory (%s); all copies at once "
                    "(set engine_chunk = N to bound it)", first)
        return None
    level = logging.WARNING if choice.chunk < cfg.train.clients_per_round else logging.INFO
    log.log(level, "%s", choice.describe())
    return choice


def sample_clients(seed: int, stream: str, round_idx: int, num_clients: int, per_round: int) -> np.ndarray:
    """``M`` of ``N`` clients uniformly without replacement (sorted)."""
    rng = numpy_rng(seed, stream, "client-sampling", round_idx)
    return np.sort(rng.choice(num_clients, size=per_round, replace=False))
