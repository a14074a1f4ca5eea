"""Configuration schema: frozen dataclasses with defaults and validation.

A run is described by one :class:`RunConfig`. Presets (``presets/*.toml``) and user
TOML files are partial dictionaries of these fields; :mod:`fedhv.config.loader`
turns them into dataclasses, rejecting unknown keys with a did-you-mean hint.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fedhv.config.flower import FlowerConfig, check_flower
from fedhv.devices import check_device
from fedhv.errors import ConfigError
from fedhv.registry import METHODS as REGISTERED_METHODS
from fedhv.registry import resolve_benchmark

#: The built-in methods (``method = ...`` accepts every name in :data:`fedhv.registry.METHODS`).
METHODS: tuple[str, ...] = ("fedhv", "uniform", "fsmgda", "fedcmoo")
#: Method names accepted as keys of the ``[lr]`` table (the paper's four methods).
LR_METHODS: tuple[str, ...] = ("uniform", "fsmgda", "fedcmoo", "fedhv")
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
    """

    test_period: int = 3
    final: bool = True
    batch_size: int = 2500
    splits: tuple[str, ...] = ("test",)


@dataclass(frozen=True)
class FedHVConfig:
    """FedHV hyperparameters (paper B.7).

    Attributes
    ----------
    rho_clip : float
        Numerical slack floor ``rho_clip > 0`` of the weight map.
    report_batches : int or "all"
        Objective-report budget ``B_rep``: minibatches of ``train.batch_size``
        samples, or the whole local dataset.
    reference : "calibrate", "paper" or list of float
        Training reference ``r``: from a calibration run, the paper's Table 6, or
        given directly.
    """

    rho_clip: float = 1e-6
    report_batches: int | str = "all"
    reference: str | tuple[float, ...] = "calibrate"


@dataclass(frozen=True)
class FSMGDAConfig:
    """FSMGDA options (reference notes §4.1; defaults follow the reference code)."""

    reference_clip: bool = True
    scale_decoders: bool = True
    count_decoders: bool = False
    max_iter: int = 1000
    tol: float = 1e-10


@dataclass(frozen=True)
class FedCMOOConfig:
    """FedCMOO options (paper B.6, reference notes §4.2)."""

    estimator: str = "randsvd"
    extra_upload: float = 1.0
    oversample: float = 0.1
    power_iterations: int = 2
    weight_lr: float = 1e-3
    weight_steps: int = 1000
    weight_momentum: float = 0.0
    symmetrize: bool = True


@dataclass(frozen=True)
class CalibrationConfig:
    """Reference calibration (paper §3.2, B.8): uniform-weight run(s),
    ``r = max over rounds and seeds of the averaged reports + margin``.

    ``partition_alpha`` / ``partition_strata`` calibrate on another partition of the
    same family (paper: CIFAR10-MNIST calibrates once with alpha = 0.30 for both
    settings; CelebA5 with the first-label alpha = 0.30 partition); unset = the run's.
    """

    rounds: int = 20
    margin: float = 0.15
    seeds: tuple[int, ...] = (0,)
    partition_alpha: float | None = None
    partition_strata: str | None = None

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
class RunConfig:
    """A complete run.

    ``engine_chunk``: model copies the batched engine trains at once; ``"auto"`` (default):
    as many as fit half the available memory (:mod:`fedhv.sim.memory`), ``0``: all, unchecked
    (the earlier default), ``n > 0``: ``n``. ``precision = "bf16"``: forward passes under
    bfloat16 autocast, the rest in float32 (:mod:`fedhv.sim.precision`). ``device`` is
    ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``; it must be available (see
    :func:`fedhv.devices.check_device`).
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
    fedhv: FedHVConfig = field(default_factory=FedHVConfig)
    fsmgda: FSMGDAConfig = field(default_factory=FSMGDAConfig)
    fedcmoo: FedCMOOConfig = field(default_factory=FedCMOOConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    flower: FlowerConfig = field(default_factory=FlowerConfig)  # [flower]: fedhv.config.flower

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


def _choice(name: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ConfigError(
            f"{name} = {value!r} is not supported; choose one of {', '.join(options)}"
        )


#: Seeds are keyed into :mod:`fedhv.rng` streams as 32-bit words (``fedhv.rng._key_to_int``
#: keeps ``seed & 0xFFFFFFFF``), so only ``0 <= seed < 2**32`` names a distinct stream; larger
#: or negative seeds would silently alias another seed and are refused.
SEED_BOUND = 2**32


def _seed(name: str, value: int) -> None:
    """Refuse a seed outside ``[0, 2**32)`` (it would alias a seed inside the range)."""
    if not 0 <= value < SEED_BOUND:
        raise ConfigError(
            f"{name} = {value} is out of range; seeds must be integers in [0, 2**32 - 1 = {SEED_BOUND - 1}] "
            f"(random streams are keyed by 32-bit seeds, so {value} would silently equal seed {value % SEED_BOUND})"
        )


def _validation(v: ValidationConfig) -> None:
    """Check the ``validation`` section (bounds: 0 = off)."""
    if not v.max_update_norm >= 0:
        raise ConfigError(f"validation.max_update_norm = {v.max_update_norm} must be >= 0 (0 = no bound), e.g. 100")
    for name in ("max_update_norm_ratio", "max_model_growth"):
        value = getattr(v, name)
        if not (value == 0 or value > 1):
            raise ConfigError(f"validation.{name} = {value} must be 0 (off) or > 1, e.g. 10")
    if v.divergence_rounds < 0:
        raise ConfigError(f"validation.divergence_rounds = {v.divergence_rounds} must be >= 0 (0 = never stop), e.g. 3")


def _positive(name: str, value: float, fix: str = "") -> None:
    if not value > 0:
        raise ConfigError(f"{name} = {value!r} must be > 0{'; ' + fix if fix else ''}")


def validate_partition_keys(cfg: RunConfig) -> None:
    """The checks of the values a partition depends on (``data.val_fraction``, ``partition.*``
    sizes and concentration); part of :func:`validate`, and all that ``fedhv partition-stats``
    needs besides the seeds, strata and benchmark."""
    if not 0.0 <= cfg.data.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction = {cfg.data.val_fraction} must be in [0, 1)")
    p = cfg.partition
    _positive("partition.alpha", p.alpha, "the Dirichlet concentration must be positive, e.g. 0.3")
    if p.clients < 1:
        raise ConfigError(f"partition.clients = {p.clients} must be >= 1")
    if p.samples_per_client < 1:
        raise ConfigError(f"partition.samples_per_client = {p.samples_per_client} must be >= 1")


def validate(cfg: RunConfig) -> None:
    """Check every value that can be checked without data.

    Raises
    ------
    ConfigError
        Naming the parameter, the value and the fix.
    """
    REGISTERED_METHODS.get(cfg.method)  # one line naming the key, the value, the known methods and the fix
    _choice("engine", cfg.engine, ENGINES)
    _choice("dtype", cfg.dtype, DTYPES)
    check_device(cfg.device)
    resolve_benchmark(cfg.data.benchmark)  # a registered name, or an importable 'module:attr' factory
    _choice("partition.strata", cfg.partition.strata, STRATA)
    if cfg.rounds < 1:
        raise ConfigError(f"rounds = {cfg.rounds} must be >= 1")
    if not cfg.setting.strip() or cfg.setting in (".", "..") or any(c in cfg.setting for c in "/\\\0"):
        raise ConfigError(
            f"setting = {cfg.setting!r} names run directories; use a plain name without '/', '\\' or '..'"
        )
    _seed("seed", cfg.seed)
    _seed("partition.seed", cfg.partition.seed)
    _seed("data.pair_seed", cfg.data.pair_seed)
    _seed("data.val_seed", cfg.data.val_seed)
    for i, calibration_seed in enumerate(cfg.calibration.seeds):
        _seed(f"calibration.seeds[{i}]", calibration_seed)
    if cfg.engine_chunk != "auto" and not (isinstance(cfg.engine_chunk, int) and cfg.engine_chunk >= 0):
        raise ConfigError(f"engine_chunk = {cfg.engine_chunk!r} must be \"auto\" (fit the available memory), "
                          "0 (all model copies at once) or a positive number of copies")
    _choice("precision", cfg.precision, PRECISIONS)
    if cfg.precision == "bf16" and cfg.dtype != "float32":
        raise ConfigError(f"precision = \"bf16\" needs dtype = \"float32\" (got dtype = {cfg.dtype!r}); "
                          "set dtype = \"float32\" or precision = \"fp32\"")
    if cfg.threads < 0:
        raise ConfigError(f"threads = {cfg.threads} must be >= 0 (0 = torch default)")
    validate_partition_keys(cfg)
    if cfg.data.max_test_samples < 0:
        raise ConfigError(f"data.max_test_samples = {cfg.data.max_test_samples} must be >= 0 (0 = all)")
    p = cfg.partition
    t = cfg.train
    if not 1 <= t.clients_per_round <= p.clients:
        raise ConfigError(
            f"train.clients_per_round = {t.clients_per_round} must be between 1 and "
            f"partition.clients = {p.clients}; lower it or raise partition.clients"
        )
    if t.batch_size < 1:
        raise ConfigError(f"train.batch_size = {t.batch_size} must be >= 1")
    if t.batch_size > p.samples_per_client:
        raise ConfigError(
            f"train.batch_size = {t.batch_size} exceeds partition.samples_per_client = "
            f"{p.samples_per_client}; batches drop the last partial batch, so no batch could be drawn"
        )
    if t.local_steps < 1:
        raise ConfigError(f"train.local_steps = {t.local_steps} must be >= 1 (K local SGD steps)")
    if not 0.0 <= t.momentum < 1.0:
        raise ConfigError(f"train.momentum = {t.momentum} must be in [0, 1)")
    for key, rates in cfg.lr.items():
        _choice("lr table key", key, REGISTERED_METHODS.names())
        _positive(f"lr.{key}.global", rates.global_, "a learning rate must be positive, e.g. 1.0 (server)")
        _positive(f"lr.{key}.local", rates.local, "a learning rate must be positive, e.g. 0.1 (local SGD)")
    if t.lr_global is not None:
        _positive("train.lr_global", t.lr_global, "a learning rate must be positive, e.g. 1.0 (server)")
    if t.lr_local is not None:
        _positive("train.lr_local", t.lr_local, "a learning rate must be positive, e.g. 0.1 (local SGD)")
    e = cfg.eval
    if e.test_period < 0:
        raise ConfigError(f"eval.test_period = {e.test_period} must be >= 0 (0 = final evaluation only)")
    if e.batch_size < 1:
        raise ConfigError(f"eval.batch_size = {e.batch_size} must be >= 1")
    for split in e.splits:
        _choice("eval.splits entry", split, ("val", "test"))
    # The summary and the tables report the test metrics: refuse a run that never evaluates them.
    if "test" not in e.splits:
        raise ConfigError(
            f"eval.splits = {list(e.splits)} has no \"test\": the run would never evaluate the test set that "
            "summary.json reports; add it, e.g. eval.splits = [\"test\", \"val\"]"
        )
    if not e.final and (e.test_period == 0 or e.test_period > cfg.rounds):
        raise ConfigError(
            f"eval.test_period = {e.test_period} with eval.final = false and rounds = {cfg.rounds} never evaluates "
            "the test set; set eval.final = true or eval.test_period between 1 and rounds"
        )
    h = cfg.fedhv
    _positive("fedhv.rho_clip", h.rho_clip, "the slack floor must be positive, e.g. 1e-6")
    if isinstance(h.report_batches, str):
        if h.report_batches != "all":
            raise ConfigError(
                f"fedhv.report_batches = {h.report_batches!r}: use \"all\" or a positive integer"
            )
    elif h.report_batches < 1:
        raise ConfigError(f"fedhv.report_batches = {h.report_batches} must be >= 1 or \"all\"")
    if isinstance(h.reference, str):
        _choice("fedhv.reference", h.reference, ("calibrate", "paper"))
    else:
        for i, r in enumerate(h.reference):
            if not r > 0:
                raise ConfigError(
                    f"fedhv.reference[{i}] = {r} gives a non-positive slack r_i - f_i for any "
                    "non-negative loss; give a reference above the task losses or use "
                    "fedhv.reference = \"calibrate\""
                )
    f = cfg.fsmgda
    if f.max_iter < 1 or not f.tol > 0:
        raise ConfigError(f"fsmgda.max_iter = {f.max_iter} must be >= 1 and fsmgda.tol = {f.tol} > 0")
    g = cfg.fedcmoo
    _choice("fedcmoo.estimator", g.estimator, ("randsvd", "randsvd-direct"))
    _positive("fedcmoo.extra_upload", g.extra_upload)
    _positive("fedcmoo.weight_lr", g.weight_lr)
    if g.oversample < 0 or g.power_iterations < 0 or g.weight_steps < 1 or not 0 <= g.weight_momentum < 1:
        raise ConfigError(
            "fedcmoo: oversample and power_iterations must be >= 0, weight_steps >= 1, weight_momentum in [0, 1); "
            f"got {g.oversample}, {g.power_iterations}, {g.weight_steps}, {g.weight_momentum}"
        )
    c = cfg.calibration
    if c.rounds < 1:
        raise ConfigError(f"calibration.rounds = {c.rounds} must be >= 1")
    if c.margin < 0:
        raise ConfigError(f"calibration.margin = {c.margin} must be >= 0 (paper: 0.15)")
    if c.partition_alpha is not None:
        _positive("calibration.partition_alpha", c.partition_alpha)
    if c.partition_strata is not None:
        _choice("calibration.partition_strata", c.partition_strata, STRATA)
    d = cfg.data
    if d.rotation_degrees is not None and d.rotation_degrees < 0:
        raise ConfigError(f"data.rotation_degrees = {d.rotation_degrees} must be >= 0 (0 = no rotation)")
    if d.flip_prob is not None and not 0 <= d.flip_prob <= 1:
        raise ConfigError(f"data.flip_prob = {d.flip_prob} must be in [0, 1]")
    if not c.seeds:
        raise ConfigError("calibration.seeds is empty; give at least one seed, e.g. [0]")
    for name in ("client_dropout", "corrupt_reports", "corrupt_updates", "poison_updates"):
        value = getattr(cfg.faults, name)
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"faults.{name} = {value} must be a probability in [0, 1) (0 = no faults)")
    _validation(cfg.validation)
    check_flower(cfg)
    if cfg.checkpoint.period < 0:
        raise ConfigError(
            f"checkpoint.period = {cfg.checkpoint.period} must be >= 0 (0 = at every test evaluation); "
            "to turn checkpoints off use checkpoint.enabled = false"
        )
