"""The problem a run trains: data for a partition, a fresh model from a seed, and their provenance.

The composition root (:mod:`fedhv.experiment.runner`) builds one :class:`Problem` per run and hands
it to everything that needs data or a model (the calibration, the method's build context, the
training loop, the checkpoint checks), so the configuration's ``data.benchmark`` is resolved once:

- from the configuration (``fedhv run``, grids, the Flower ServerApp): :meth:`Problem.of` -- a
  built-in benchmark, a registered one, or a ``module:attr`` factory;
- from a user's objects (:func:`fedhv.simulate`): :meth:`Problem.given` -- the user's model and
  :class:`~fedhv.api.dataset.FederatedDataset` as they are, with no registry entry.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fedhv.config.schema import RunConfig
from fedhv.data.configured import DTYPES, federated_data
from fedhv.data.federated import FederatedData
from fedhv.data.user import UserBenchmark, user_benchmark, user_federated_data, user_model
from fedhv.errors import ConfigError
from fedhv.models import MultiTaskModel, build_model, default_init
from fedhv.registry import BENCHMARKS
from fedhv.rng import torch_generator

#: ``config.toml``'s ``source`` of a run whose model and data were Python objects (:func:`fedhv.simulate`).
OBJECTS_SOURCE = "fedhv.simulate"


@dataclass(frozen=True)
class Problem:
    """A run's data and model factory.

    Attributes
    ----------
    benchmark : str
        The name the run records (``data.benchmark``).
    user : UserBenchmark or None
        The user's problem (tasks, tensors or dataset, model), or ``None`` for a built-in benchmark.
    """

    benchmark: str
    user: UserBenchmark | None = None

    @classmethod
    def of(cls, cfg: RunConfig) -> Problem:
        """The problem ``cfg``'s ``data.benchmark`` names (resolved here, once per run).

        Raises
        ------
        ConfigError
            For a run whose model and data were Python objects (``source = "fedhv.simulate"``): only
            ``fedhv.simulate(..., resume=DIR)`` with the same objects can continue it.
        """
        if cfg.source == OBJECTS_SOURCE:
            raise ConfigError(f"data.benchmark = {cfg.data.benchmark!r}: this run's model and data were Python objects "
                              "given to fedhv.simulate; continue it with fedhv.simulate(model, data, ..., resume=DIR) "
                              "and the same objects")
        return cls(cfg.data.benchmark, user_benchmark(cfg.data.benchmark))

    @classmethod
    def given(cls, name: str, user: UserBenchmark) -> Problem:
        """A user's problem given as objects, recorded as ``name``."""
        return cls(name, user)

    def data(self, cfg: RunConfig) -> FederatedData:
        """Device tensors of the problem, partitioned by ``cfg.partition`` (a given dataset keeps its own)."""
        if self.user is None:
            return federated_data(cfg)
        return user_federated_data(self.benchmark, cfg.partition, DTYPES[cfg.dtype], cfg.device,
                                   cfg.data.max_test_samples, ub=self.user)

    def model(self, cfg: RunConfig, data: FederatedData, seed: int) -> MultiTaskModel:
        """A freshly initialised model (PyTorch default init from the seed's stream).

        The initialisation is drawn on the CPU and the model then moved to ``cfg.device``, so every
        device starts from the same parameters; a user's module given as an object keeps its own
        parameters as ``theta^0`` (``UserBenchmark.initialise = False``).
        """
        if self.user is not None:
            model = user_model(self.benchmark, data, cfg.train.batch_size, ub=self.user)
        else:
            model = build_model(BENCHMARKS.get(self.benchmark).model, data.num_classes)
        if self.user is None or self.user.initialise:
            default_init(model, torch_generator(seed, "model-init"))
        return model.to(device=cfg.device, dtype=DTYPES[cfg.dtype])

    def for_config(self, cfg: RunConfig) -> Problem:
        """This problem for ``cfg`` (a configuration naming another benchmark gets its own)."""
        if cfg.data.benchmark == self.benchmark:
            return self
        return dataclasses.replace(self, benchmark=cfg.data.benchmark, user=user_benchmark(cfg.data.benchmark))

