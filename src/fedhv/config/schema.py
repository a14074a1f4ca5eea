"""Configuration schema: frozen dataclasses with defaults (validation: :mod:`fedhv.config.validation`).

A run is described by one :class:`RunConfig`. Presets (``presets/*.toml``) and user
TOML files are partial dictionaries of these fields; :mod:`fedhv.config.loader`
turns them into dataclasses, rejecting unknown keys with a did-you-mean hint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fedhv.registry import METHODS as _REGISTERED

AGGREGATIONS: tuple[str, ...] = ("mean", "samples")
#: ``partition.sizes``: every client the same size, or log-normal sizes (cross-device).
SIZES: tuple[str, ...] = ("equal", "lognormal")
#: ``train.optimizer`` values (the keys of :data:`fedhv.sim.local_opt.OPTIMIZERS`).
OPTIMIZER_NAMES: tuple[str, ...] = ("sgd", "adam", "adamw", "rmsprop", "adagrad", "adamax", "nadam", "radam")
ENGINES: tuple[str, ...] = ("batched", "sequential")
DTYPES: tuple[str, ...] = ("float32", "float64")
PRECISIONS: tuple[str, ...] = ("fp32", "bf16")
#: Dirichlet strata rules (``partition.strata``; :meth:`fedhv.data.benchmarks.Benchmark.strata`).
#: They differ only for multi-label benchmarks (CelebA5), where ``"all-label"`` is kept as the
#: earlier name of ``"task-representatives"`` and ``"all-attributes"`` is the paper's all-label rule.
STRATA: tuple[str, ...] = ("all-label", "first-label", "all-attributes", "task-representatives")
#: The built-in benchmarks (``data.benchmark`` accepts every name in :data:`fedhv.registry.BENCHMARKS`
#: and ``"module:attr"`` user factories).
BENCHMARKS: tuple[str, ...] = ("multimnist", "mnist-fmnist", "cifar10-mnist", "celeba5")


@dataclass(frozen=True)
class DataConfig:
    """Benchmark data.

    Attributes
    ----------
    benchmark : str
        A registered benchmark (``"multimnist"``, ``"mnist-fmnist"``, ``"cifar10-mnist"``,
        ``"celeba5"`` or one registered with :func:`fedhv.register_benchmark`), or a user
        factory ``"mypkg.tasks:make_benchmark"`` returning a :class:`fedhv.UserBenchmark`.
    root : str or None
        Data directory; ``None`` means ``$FEDHV_DATA`` or ``~/.cache/fedhv/data``.
    download : bool
        Download missing files from the canonical mirrors (checksum-verified).
    pair_seed : int
        Seed of the generator that draws the partner image of each pair.
    val_fraction : float
        Fraction of the combined training set held out for validation (reference
        code: 0.2, the *last* shuffled indices).
    val_seed : int
        Seed of the validation shuffle.
    augment : bool
        Random per-sample rotation of training batches.
    rotation_degrees : float or None
        Rotation range of the training augmentation (``None`` = the benchmark's:
        25 for the MNIST pairs, 30 integer degrees for CIFAR10-MNIST).
    flip_prob : float or None
        Probability of flipping a whole training batch (``None`` = the benchmark's:
        0, or 0.4 for CIFAR10-MNIST).
    max_test_samples : int
        Evaluate on a fixed random subset of ``n`` test samples (0 = all); for quick tests.
    """

    benchmark: str = "multimnist"
    root: str | None = None
    download: bool = True
    pair_seed: int = 0
    val_fraction: float = 0.2
    val_seed: int = 1
    augment: bool = True
    rotation_degrees: float | None = None
    flip_prob: float | None = None
    max_test_samples: int = 0


@dataclass(frozen=True)
class PartitionConfig:
    """Dirichlet client partition (paper Table 3, reference notes §3)."""

    clients: int = 30
    samples_per_client: int = 600
    alpha: float = 0.15
    strata: str = "all-label"
    seed: int = 10
    #: ``"equal"`` (the paper: every client holds ``samples_per_client``) or ``"lognormal"``: client
    #: ``k`` holds ``clip(round(S exp(size_sigma z_k - size_sigma^2 / 2)), min_samples, n)`` samples,
    #: ``S = samples_per_client`` their mean before clipping (:func:`fedhv.data.partition.client_sizes`).
    sizes: str = "equal"
    size_sigma: float = 1.0
    min_samples: int = 1
    #: ``"dirichlet"`` (the paper's rule, the keys above) or ``"identity"``: a natural federation, the
    #: benchmark's identities (CelebA: ``identity_CelebA.txt``) with at least ``min_identity_images``
    #: training images (LEAF's 5) grouped into ``clients`` clients
    #: (:func:`fedhv.data.partition.identity_partition`; ``samples_per_client``, ``alpha``, ``strata`` unused).
    by: str = "dirichlet"
    min_identity_images: int = 5


@dataclass(frozen=True)
class TrainConfig:
    """Local training and participation (paper Tables 3-5).

    ``lr_global`` / ``lr_local`` left unset are taken from ``[lr.<method>]``.
    """

    clients_per_round: int = 20
    batch_size: int = 32
    local_steps: int = 10
    momentum: float = 0.0
    lr_global: float | None = None
    lr_local: float | None = None
    #: The clients' optimizer (:data:`fedhv.sim.local_opt.OPTIMIZERS`; the paper: SGD) and its
    #: keyword options (e.g. ``{weight_decay = 1e-4}``, ``{betas = [0.9, 0.99]}``).
    optimizer: str = "sgd"
    optimizer_options: dict[str, float | bool | tuple[float, ...]] = field(default_factory=dict)
    #: ``0``: ``local_steps`` steps per round; ``E``: ``E`` passes over each client's data.
    local_epochs: int = 0
    #: ``0``: off; ``c``: each client's gradient clipped to norm ``c`` before every step.
    clip_grad_norm: float = 0.0
    #: ``"mean"`` (the paper: unweighted mean of the updates) or ``"samples"`` (weighted by the
    #: clients' sample counts, FedAvg's and Flower's default).
    aggregation: str = "mean"


@dataclass(frozen=True)
class LearningRates:
    """Server (``global``) and local SGD learning rates of one method."""

    global_: float = 1.0
    local: float = 0.1


@dataclass(frozen=True)
class EvalConfig:
    """Test evaluation schedule.

    The test set is evaluated after round ``t`` (1-based) when
    ``t % test_period == 0``, and after the last round when ``final`` is true.

    ``splits`` names the evaluated sets (``"test"``, ``"val"``); empty (the default) is the test set
    and, where the data holds one, the server-side validation set (every built-in benchmark does;
    a :class:`~fedhv.FederatedDataset` given ``validation=``). ``metrics.jsonl`` keeps the test
    metrics at the top level and the validation metrics under ``"val"``; tuning reads only these.
    """

    test_period: int = 3
    final: bool = True
    batch_size: int = 2500
    splits: tuple[str, ...] = ()
    #: HV offsets ``r^eval`` of ``HV = prod_i max(r^eval_i - l_i, 0)``: one for every task or
    #: one per task (paper C.1: 3 for every task).
    hv_reference: float | tuple[float, ...] = 3.0


#: The method whose configuration defines a reference calibration: it runs at that method's learning
#: rates (``[lr.fedhv]``) and its clients report with that method's budget (``fedhv.report_batches``),
#: exactly as FedHV's clients later do; a grid shares one calibration per family under it.
CALIBRATION_METHOD = "fedhv"


@dataclass(frozen=True)
class CalibrationConfig:
    """Reference calibration (paper §3.2, B.8): uniform-weight run(s),
    ``r = max over rounds and seeds of the averaged reports + margin``.

    ``partition_alpha`` / ``partition_strata`` calibrate on another partition of the
    same family (paper: CIFAR10-MNIST calibrates once with alpha = 0.30 for both
    settings; CelebA5 with the first-label alpha = 0.30 partition); unset = the run's.

    ``lr_global`` / ``lr_local`` pin the calibration's learning rates; unset = the run's (a grid's
    shared calibration: ``[lr.fedhv]``'s). ``fedhv tune`` pins them in its chosen configuration, so a
    grid of tuned methods calibrates at the rates its trials calibrated at, not at FedHV's tuned ones.
    """

    rounds: int = 20
    margin: float = 0.15
    seeds: tuple[int, ...] = (0,)
    partition_alpha: float | None = None
    partition_strata: str | None = None
    lr_global: float | None = None
    lr_local: float | None = None

    def train_for(self, run: TrainConfig) -> TrainConfig:
        """The local training calibration runs with: the run's, with ``lr_*`` applied."""
        return replace(
            run,
            lr_global=run.lr_global if self.lr_global is None else self.lr_global,
            lr_local=run.lr_local if self.lr_local is None else self.lr_local,
        )

    def partition_for(self, run: PartitionConfig) -> PartitionConfig:
        """The partition calibration runs on: the run's, with ``partition_*`` applied."""
        return replace(
            run,
            alpha=run.alpha if self.partition_alpha is None else self.partition_alpha,
            strata=run.strata if self.partition_strata is None else self.partition_strata,
        )


@dataclass(frozen=True)
class FaultsConfig:
    """Simulated client faults (for robustness testing; all zero = no faults).

    Attributes
    ----------
    client_dropout : float
        Probability that a sampled client does not answer in a round (decided once per
        round and client, so a multi-stage method loses it from its first stage on).
    corrupt_reports : float
        Probability that a client's objective report is replaced by garbage (NaN, inf,
        a negative value or the wrong length) in a stage that asks for one.
    corrupt_updates : float
        Probability that a client's uploaded update or gradients are replaced by
        garbage (non-finite values or the wrong shape).
    poison_updates : float
        Probability that a client's uploaded update or gradients are multiplied by
        1e30: finite and of the right shape, so only ``validation.max_update_norm`` /
        ``max_update_norm_ratio`` reject them (drawn from a stream of its own).
    """

    client_dropout: float = 0.0
    corrupt_reports: float = 0.0
    corrupt_updates: float = 0.0
    poison_updates: float = 0.0


@dataclass(frozen=True)
class ValidationConfig:
    """Reply bounds and divergence checks (see :mod:`fedhv.algorithms.validation` and
    :mod:`fedhv.experiment.divergence` for the rules and the evidence behind the defaults).

    Attributes
    ----------
    max_update_norm : float
        Reject a client whose model update has a row with L2 norm above this (0 = off).
    max_update_norm_ratio : float
        Reject a client whose update (or uploaded gradient) row norm exceeds this many
        times the median over the stage's valid replies; 0 = off, else > 1.
    divergence_rounds : int
        Stop after this many rounds in a row lost because clients' training produced
        non-finite values (0 = never).
    max_model_growth : float
        Stop when one round multiplies the global model's L2 norm by more than this
        (0 = off, else > 1). A non-finite global model always stops the run.
    """

    max_update_norm: float = 0.0
    max_update_norm_ratio: float = 0.0
    divergence_rounds: int = 3
    max_model_growth: float = 1e4


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints for exact resume (``fedhv run --resume RUN_DIR``).

    Attributes
    ----------
    enabled : bool
        Write ``checkpoint.pt`` into the run directory.
    period : int
        ``0``: after every test evaluation (and the last round); ``n > 0``: also after
        every ``n``-th round.
    """

    enabled: bool = True
    period: int = 0


@dataclass(frozen=True)
class DiagnosticsConfig:
    """The paper's theory quantities and per-client fairness at test evaluations
    (:mod:`fedhv.diagnostics`; simulator only: they read every client's data).

    Attributes
    ----------
    enabled : bool
        Compute them (off by default: their cost is stated in ``docs/diagnostics.md``).
    probe_samples : int
        Size ``P`` of the fixed probe on which the per-task full-batch gradients are taken.
    probe_seed : int
        Seed of the probe draw.
    period : int
        Every ``period``-th test evaluation (1 = every one), and the run's last one.
    """

    enabled: bool = False
    probe_samples: int = 1024
    probe_seed: int = 0
    period: int = 1


@dataclass(frozen=True)
class FlowerConfig:
    """Flower back-end options (``[flower]``); the simulator (``fedhv run``) ignores them.

    Attributes
    ----------
    secure_aggregation : bool
        Aggregate every stage with SecAgg+ (flwr's ``SecAggPlusWorkflow`` and
        ``secaggplus_mod``): the server learns only the mean of the clients' updates and
        reports (``fedhv flower local --secure``; docs/security.md).
    num_shares : int or float
        SecAgg+ ``num_shares``: an integer ``>= 3`` = the shares (neighbours) per client; a
        float in ``(0, 1]`` = that fraction of the round's clients (``1.0``: every client
        is every other's neighbour, plain SecAgg).
    reconstruction_threshold : int or float
        SecAgg+ ``reconstruction_threshold``: an integer ``>= 2`` (below ``num_shares``) =
        shares needed to recover a client's secrets; a float in ``(0, 1]`` = that fraction
        of ``num_shares`` (rounded, at least 2). A round in which some client keeps fewer live
        neighbours than this is skipped. Default ``0.67``: more than half of the shares for
        every share count, so a server that tells some neighbours a client dropped and others
        that it did not cannot collect both of its secrets (docs/security.md).
    clipping_range : float
        Every masked value is clipped to ``[-c, c]`` and quantized with step
        ``2c / 2**22``. Default ``c = 16``: the largest update coordinate measured in the
        built-in settings is below 1 and reports (task losses) stay below 16 (docs/flower.md,
        "Secure aggregation"); quantization step ``7.6e-6``.
    """

    secure_aggregation: bool = False
    num_shares: int | float = 1.0
    reconstruction_threshold: int | float = 0.67
    clipping_range: float = 16.0


@dataclass(frozen=True)
class RunConfig:
    """A complete run.

    ``engine_chunk``: model copies the batched engine trains at once; ``"auto"`` (default):
    as many as fit half the available memory (:mod:`fedhv.sim.memory`), ``0``: all, unchecked
    (the earlier default), ``n > 0``: ``n``. ``precision = "bf16"``: forward passes under
    bfloat16 autocast, the rest in float32 (:mod:`fedhv.sim.precision`). ``device`` is
    ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``; it must be available (see
    :func:`fedhv.devices.check_device`).

    ``sections`` holds the methods' hyper-parameter sections by method name (``[fedhv]``,
    ``[fsmgda]``, a user method's ``[dwa]``): instances of each registered method class's
    ``section`` dataclass (:mod:`fedhv.algorithms.method`). :meth:`section` gives a method's
    section, or its defaults when the configuration names none; ``cfg.fedhv`` is
    ``cfg.section("fedhv")``.
    """

    setting: str = "custom"
    method: str = "fedhv"
    seed: int = 0
    rounds: int = 200
    engine: str = "batched"
    engine_chunk: int | str = "auto"
    precision: str = "fp32"
    device: str = "cpu"
    dtype: str = "float32"
    threads: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    lr: dict[str, LearningRates] = field(default_factory=dict)
    eval: EvalConfig = field(default_factory=EvalConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    flower: FlowerConfig = field(default_factory=FlowerConfig)  # [flower]: its checks in fedhv.config.flower
    #: Who started the run when not ``fedhv run`` / ``grid`` (``"fedhv.simulate"``: a Python
    #: model and data, registered in that process only); unset (omitted) otherwise.
    source: str | None = None
    sections: Mapping[str, Any] = field(default_factory=dict)

    def section(self, method: str) -> Any:
        """The ``[method]`` hyper-parameter section: the one given, else the method's defaults.

        Raises
        ------
        ConfigError
            For a method name that is not registered (naming the known ones).
        """
        given = self.sections.get(method)
        return given if given is not None else _REGISTERED.get(method).section()

    def with_section(self, method: str, value: Any) -> RunConfig:
        """This configuration with ``[method]`` set to ``value`` (an instance of the method's section)."""
        return replace(self, sections={**self.sections, method: value})

    def __getattr__(self, name: str) -> Any:
        # ``cfg.fedhv``, ``cfg.fsmgda``: a registered method's section (only for names that are not
        # fields; dunder and private names never reach the registry, so copying and pickling work).
        if name.startswith("_") or "sections" not in self.__dict__ or name not in _REGISTERED:
            raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")
        return self.section(name)

    @property
    def lr_global(self) -> float:
        """Server learning rate ``eta_g`` of the run's method."""
        assert self.train.lr_global is not None, "config not resolved"
        return self.train.lr_global

    @property
    def lr_local(self) -> float:
        """Local learning rate ``eta_l`` of the run's method."""
        assert self.train.lr_local is not None, "config not resolved"
        return self.train.lr_local


def __getattr__(name: str) -> Any:
    # The methods' sections live with their methods (fedhv.algorithms.*); the old names resolve there.
    if name in ("FedHVConfig", "FSMGDAConfig", "FedCMOOConfig"):
        import importlib

        return getattr(importlib.import_module("fedhv.algorithms"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
