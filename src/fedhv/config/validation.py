"""Validation of a resolved :class:`~fedhv.config.schema.RunConfig`: every value that can be
checked without data, each failure one line naming the key, the value and the fix."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from fedhv.code_digest import reference_module
from fedhv.config.flower import check_flower
from fedhv.config.schema import (
    AGGREGATIONS,
    DTYPES,
    ENGINES,
    OPTIMIZER_NAMES,
    PRECISIONS,
    SIZES,
    STRATA,
    RunConfig,
    ValidationConfig,
)
from fedhv.devices import check_device
from fedhv.errors import ConfigError
from fedhv.registry import METHODS as REGISTERED_METHODS
from fedhv.registry import resolve_benchmark


def choice(name: str, value: str, options: Sequence[str]) -> None:
    """Refuse a ``value`` of ``name`` that is not one of ``options`` (one line naming the choices)."""
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


#: Bounds on the values that size memory, checked before any data is loaded (docs/security.md, "Bounds").
#: ``diagnostics.probe_samples``: indices drawn with replacement (8 bytes each) and one forward/backward
#: each per diagnosed evaluation; ``train.batch_size`` / ``eval.batch_size``: one batch of inputs and
#: activations per model copy; ``partition.clients``: per-client arrays (the design's cross-device scale
#: is 10k-100k clients); ``train.local_steps x train.batch_size``: the per-client batch plan.
MAX_PROBE_SAMPLES = 1 << 20
MAX_BATCH_SIZE = 1 << 20
MAX_CLIENTS = 1_000_000
MAX_PLAN_SAMPLES = 1 << 24
#: ``partition.clients x partition.samples_per_client``: the partition's index table (8 bytes a sample, built
#: before the run starts): 2^26 samples are 512 MiB, 280 times the cross-device preset's 10,000 x 24 and room
#: for 100,000 clients of 670 samples; ``40000 x 40000`` was a 12.8 GB plan.
MAX_PARTITION_SAMPLES = 1 << 26
#: A method's ``report_batches``: the report plan (``report_batches x train.batch_size`` indices per client and
#: round, each evaluated), bounded like the batch plan; ``"all"`` (each client's own data) is never above it.
MAX_REPORT_SAMPLES = MAX_PLAN_SAMPLES
#: A loss level a setting names (``fedhv.reference``, ``calibration.margin``, ``fedhv grid --margins``,
#: ``famo.min_loss``): no task's loss comes near 1e100, and below it ``1 / (r - F)`` and the weights' sums stay
#: normal floats (``--margins 1e308`` overflowed FedHV's reference to inf and its weights to NaN).
MAX_LOSS_LEVEL = 1e100
#: The smallest floor of a ``1 / loss`` weight (``fedhv.rho_clip``, ``inverse-loss.rho``): ``1 / 1e-300`` and a
#: sum of many such terms stay finite (``1 / 1e-320`` is inf, and the weights NaN); the paper's floor is 1e-6.
MIN_FLOOR = 1e-300


def _at_most(name: str, value: int, bound: int, fix: str) -> None:
    if value > bound:
        raise ConfigError(f"{name} = {value} is over fedhv's bound of {bound:,}; {fix}")


def at_most(name: str, value: float, bound: float, fix: str) -> None:
    """Refuse ``value`` of ``name`` above ``bound`` (one line naming both, the bound and ``fix``)."""
    if value > bound:
        shown = f"{bound:,}" if isinstance(bound, int) else f"{bound:g}"
        raise ConfigError(f"{name} = {value} is over fedhv's bound of {shown}; {fix}")


def at_least(name: str, value: float, bound: float, fix: str) -> None:
    """Refuse ``value`` of ``name`` below ``bound`` (one line naming both, the bound and ``fix``)."""
    if value < bound:
        raise ConfigError(f"{name} = {value} is under fedhv's bound of {bound:g}; {fix}")


def report_plan(cfg: RunConfig) -> None:
    """Refuse a method's ``report_batches x train.batch_size`` over :data:`MAX_REPORT_SAMPLES` (the report plan
    of the run's method and of every section the run reads, FedHV's calibration's included)."""
    names = dict.fromkeys([cfg.method, *cfg.sections])
    for name in names:
        budget = getattr(cfg.section(name), "report_batches", "all")
        if isinstance(budget, int) and budget * cfg.train.batch_size > MAX_REPORT_SAMPLES:
            raise ConfigError(
                f"{name}.report_batches x train.batch_size = {budget} x {cfg.train.batch_size} is over fedhv's bound "
                f"of {MAX_REPORT_SAMPLES:,} samples per client and round (the report plan); lower one of them, e.g. "
                f"{name}.report_batches = \"all\" (each client's own data)")


def _finite_floats(value: object, where: str) -> None:
    """Refuse any non-finite float (NaN, ±inf) in a config section, at any depth, naming its key.

    The TOML loader refuses them already; this catches a configuration built in Python
    (``dataclasses.replace``, :mod:`fedhv.methods` objects, ``fedhv.simulate``).
    """
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{where} = {value} must be a finite number; give a finite value")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _finite_floats(getattr(value, f.name), f"{where}.{f.name}" if where else f.name)
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            _finite_floats(v, f"{where}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            _finite_floats(v, f"{where}.{k}")


def positive(name: str, value: float, fix: str = "") -> None:
    """Refuse a non-positive ``value`` of ``name`` (one line naming both and the fix)."""
    if not value > 0:
        raise ConfigError(f"{name} = {value!r} must be > 0{'; ' + fix if fix else ''}")


def _sections(cfg: RunConfig) -> None:
    """Each method section: a registered method's, of its section type, passing its own ``check()``
    (the run's method's section is checked even when only its defaults apply)."""
    for name, section in cfg.sections.items():
        spec = REGISTERED_METHODS.get(name)
        if not isinstance(section, spec.section):
            raise ConfigError(f"[{name}] is a {type(section).__name__}, not method {name!r}'s section "
                              f"{spec.section.__name__}; build it as {spec.section.__name__}(...)")
        section.check()
    if cfg.method not in cfg.sections:
        cfg.section(cfg.method).check()


#: ``partition.by``: the paper's Dirichlet rule or a benchmark's natural identities.
PARTITION_RULES = ("dirichlet", "identity")


def validate_partition_keys(cfg: RunConfig) -> None:
    """The checks of the values a partition depends on (``data.val_fraction``, ``partition.*``
    sizes and concentration); part of :func:`validate`, and all that ``fedhv partition-stats``
    needs besides the seeds, strata and benchmark."""
    if not 0.0 <= cfg.data.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction = {cfg.data.val_fraction} must be in [0, 1)")
    p = cfg.partition
    positive("partition.alpha", p.alpha, "the Dirichlet concentration must be positive, e.g. 0.3")
    if p.clients < 1:
        raise ConfigError(f"partition.clients = {p.clients} must be >= 1")
    _at_most("partition.clients", p.clients, MAX_CLIENTS, "lower it (cross-device runs reach 100,000 clients)")
    if p.samples_per_client < 1:
        raise ConfigError(f"partition.samples_per_client = {p.samples_per_client} must be >= 1")
    if p.by == "dirichlet" and p.clients * p.samples_per_client > MAX_PARTITION_SAMPLES:
        raise ConfigError(
            f"partition.clients x partition.samples_per_client = {p.clients} x {p.samples_per_client} is over fedhv's "
            f"bound of {MAX_PARTITION_SAMPLES:,} samples in the partition; lower one of them, e.g. "
            f"partition.samples_per_client = {max(1, MAX_PARTITION_SAMPLES // p.clients)}")
    choice("partition.sizes", p.sizes, SIZES)
    if not p.size_sigma >= 0:
        raise ConfigError(f"partition.size_sigma = {p.size_sigma} must be >= 0 (0 = every size equals "
                          "samples_per_client), e.g. 1.0")
    if p.min_samples < 1:
        raise ConfigError(f"partition.min_samples = {p.min_samples} must be >= 1")
    choice("partition.by", p.by, PARTITION_RULES)
    if p.min_identity_images < 1:
        raise ConfigError(f"partition.min_identity_images = {p.min_identity_images} must be >= 1 (LEAF: 5)")


def validate(cfg: RunConfig, import_code: bool = True) -> None:
    """Check every value that can be checked without data.

    ``import_code=False`` (inspection commands: ``fedhv show-config``): a ``module:attr``
    ``data.benchmark`` is checked for its form only, never imported.

    Raises
    ------
    ConfigError
        Naming the parameter, the value and the fix.
    """
    REGISTERED_METHODS.get(cfg.method)  # one line naming the key, the value, the known methods and the fix
    for f in dataclasses.fields(cfg):
        if f.name != "sections":
            _finite_floats(getattr(cfg, f.name), f.name.rstrip("_"))
    for name, section in cfg.sections.items():
        _finite_floats(section, name)
    choice("engine", cfg.engine, ENGINES)
    choice("dtype", cfg.dtype, DTYPES)
    check_device(cfg.device)
    if cfg.source is None and (import_code or reference_module(cfg.data.benchmark) is None):
        # a registered name, or an importable 'module:attr' factory (a run whose source gave its model and data
        # as objects, fedhv.simulate's, names them for the record only)
        resolve_benchmark(cfg.data.benchmark)
    choice("partition.strata", cfg.partition.strata, STRATA)
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
    choice("precision", cfg.precision, PRECISIONS)
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
    _at_most("train.batch_size", t.batch_size, MAX_BATCH_SIZE, "lower it (a batch is at most one client's samples)")
    if t.batch_size > p.samples_per_client and p.sizes == "equal" and p.by == "dirichlet":  # else: the small-client rule
        raise ConfigError(
            f"train.batch_size = {t.batch_size} exceeds partition.samples_per_client = "
            f"{p.samples_per_client}; batches drop the last partial batch, so no batch could be drawn"
        )
    if t.local_steps < 1:
        raise ConfigError(f"train.local_steps = {t.local_steps} must be >= 1 (K local SGD steps)")
    if t.local_steps * t.batch_size > MAX_PLAN_SAMPLES:
        raise ConfigError(f"train.local_steps x train.batch_size = {t.local_steps} x {t.batch_size} is over fedhv's "
                          f"bound of {MAX_PLAN_SAMPLES:,} samples per client and round; lower one of them")
    if not 0.0 <= t.momentum < 1.0:
        raise ConfigError(f"train.momentum = {t.momentum} must be in [0, 1)")
    choice("train.aggregation", t.aggregation, AGGREGATIONS)
    choice("train.optimizer", t.optimizer, OPTIMIZER_NAMES)  # its options are checked when the engine is built
    if t.momentum and t.optimizer != "sgd":
        raise ConfigError(f"train.momentum = {t.momentum} applies to train.optimizer = \"sgd\" only; set it to 0 "
                          f"and give {t.optimizer}'s own options in train.optimizer_options")
    if t.local_epochs < 0:
        raise ConfigError(f"train.local_epochs = {t.local_epochs} must be >= 0 (0 = train.local_steps steps)")
    if t.clip_grad_norm < 0:
        raise ConfigError(f"train.clip_grad_norm = {t.clip_grad_norm} must be >= 0 (0 = no clipping)")
    for key, rates in cfg.lr.items():
        choice("lr table key", key, REGISTERED_METHODS.names())
        positive(f"lr.{key}.global", rates.global_, "a learning rate must be positive, e.g. 1.0 (server)")
        positive(f"lr.{key}.local", rates.local, "a learning rate must be positive, e.g. 0.1 (local SGD)")
    if t.lr_global is not None:
        positive("train.lr_global", t.lr_global, "a learning rate must be positive, e.g. 1.0 (server)")
    if t.lr_local is not None:
        positive("train.lr_local", t.lr_local, "a learning rate must be positive, e.g. 0.1 (local SGD)")
    e = cfg.eval
    if e.test_period < 0:
        raise ConfigError(f"eval.test_period = {e.test_period} must be >= 0 (0 = final evaluation only)")
    if e.batch_size < 1:
        raise ConfigError(f"eval.batch_size = {e.batch_size} must be >= 1")
    _at_most("eval.batch_size", e.batch_size, MAX_BATCH_SIZE, "lower it, e.g. 2500")
    for split in e.splits:
        choice("eval.splits entry", split, ("val", "test"))
    # The summary and the tables report the test metrics: refuse a run that never evaluates them.
    if e.splits and "test" not in e.splits:
        raise ConfigError(
            f"eval.splits = {list(e.splits)} has no \"test\": the run would never evaluate the test set that "
            "summary.json reports; add it, e.g. eval.splits = [\"test\", \"val\"]"
        )
    # (a fedhv.simulate run of a FederatedDataset without test data evaluates nothing: its choice)
    if not e.final and (e.test_period == 0 or e.test_period > cfg.rounds) and cfg.source is None:
        raise ConfigError(
            f"eval.test_period = {e.test_period} with eval.final = false and rounds = {cfg.rounds} never evaluates "
            "the test set; set eval.final = true or eval.test_period between 1 and rounds"
        )
    _sections(cfg)
    report_plan(cfg)
    c = cfg.calibration
    if c.rounds < 1:
        raise ConfigError(f"calibration.rounds = {c.rounds} must be >= 1")
    if c.margin < 0:
        raise ConfigError(f"calibration.margin = {c.margin} must be >= 0 (paper: 0.15)")
    at_most("calibration.margin", c.margin, MAX_LOSS_LEVEL, "it is a loss level above the calibration's largest "
            "report; e.g. 0.15 (the paper's)")
    if c.partition_alpha is not None:
        positive("calibration.partition_alpha", c.partition_alpha)
    if c.partition_strata is not None:
        choice("calibration.partition_strata", c.partition_strata, STRATA)
    for key in ("lr_global", "lr_local"):
        if getattr(c, key) is not None:
            positive(f"calibration.{key}", getattr(c, key), "a learning rate must be positive; leave it unset for "
                     "the run's own")
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
    dg = cfg.diagnostics
    if dg.probe_samples < 1:
        raise ConfigError(f"diagnostics.probe_samples = {dg.probe_samples} must be >= 1, e.g. 1024")
    _at_most("diagnostics.probe_samples", dg.probe_samples, MAX_PROBE_SAMPLES,
             "lower it, e.g. 1024 (the probe is drawn with replacement: more samples than the data adds little)")
    if dg.period < 1:
        raise ConfigError(f"diagnostics.period = {dg.period} must be >= 1 (1 = at every test evaluation)")
    _seed("diagnostics.probe_seed", dg.probe_seed)
    check_flower(cfg)
    if cfg.checkpoint.period < 0:
        raise ConfigError(
            f"checkpoint.period = {cfg.checkpoint.period} must be >= 0 (0 = at every test evaluation); "
            "to turn checkpoints off use checkpoint.enabled = false"
        )
