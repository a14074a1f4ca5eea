"""The two-digit benchmarks: MultiMNIST and MNIST-FMNIST.

Construction (reference notes §1.1-1.2, paper B.1): one combined image per image of
the first source, ``canvas x canvas`` uint8 canvas, first image at (0, 0), second at
``(+shift, +shift)``, overlap by pixel-wise maximum, then nearest-neighbour resize to
28x28 (source index ``floor(i * canvas / 28)``).

- MultiMNIST: 36x36 canvas, shift 6; partner drawn uniformly from the same split
  (with replacement, it may be the image itself). Tasks: left digit, right digit.
- MNIST-FMNIST: 42x42 canvas, shift 14; partner is a random permutation of the
  Fashion-MNIST split. Tasks: digit, fashion item.

Partners are drawn from a seeded generator (``data.pair_seed``), unlike the reference
code's unseeded ``torch.randperm``. The combined training set is split into train and
validation with a seeded shuffle whose *last* ``val_fraction`` goes to validation
(reference notes §1.5).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedhv.data.augment import Augment
from fedhv.data.derived import load_derived
from fedhv.data.idx import load_fashion_mnist, load_mnist
from fedhv.errors import ConfigError
from fedhv.objectives import CLASSIFICATION, MultiLabel, Objective
from fedhv.registry import BENCHMARKS, resolve_benchmark
from fedhv.rng import numpy_rng

#: MNIST normalisation constants, used for both benchmarks as the reference does.
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


@dataclass(frozen=True)
class Benchmark:
    """A multi-task benchmark as uint8 images and integer labels.

    Attributes
    ----------
    name : str
    task_names : tuple of str
        One name per task ``i = 1..m``.
    num_classes : tuple of int
    train_x, val_x, test_x : ndarray, uint8 ``[n, H, W]`` or ``[n, H, W, C]``
    train_y, val_y, test_y : ndarray, int64 ``[n, m]``
    mean, std : tuple of float
        Per-channel normalisation ``x -> (x / 255 - mean) / std``.
    augment : Augment
        Training-batch augmentation.
    provenance : dict
        Where the arrays come from (JSON-able): data root, source files with sizes and
        digests, warnings, the cache file used or built, sample counts per split.
    """

    name: str
    task_names: tuple[str, ...]
    num_classes: tuple[int, ...]
    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: Augment
    objective: Objective = CLASSIFICATION
    provenance: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_tasks(self) -> int:
        return len(self.task_names)

    def representative_attributes(self) -> tuple[int, ...]:
        """Multi-label tasks: per task, the attribute with training positive rate closest to 1/2."""
        assert isinstance(self.objective, MultiLabel)
        rates = self.train_y.mean(0)
        return tuple(int(min(g, key=lambda a: (abs(rates[a] - 0.5), a))) for g in self.objective.groups)

    def strata(self, rule: str) -> np.ndarray:
        """Stratum label of every training sample for Dirichlet partitioning.

        Classification tasks (one label coordinate per task): ``"all-label"``,
        ``"all-attributes"`` and ``"task-representatives"`` are all the joint label
        ``sum_i y_i * prod_{j>i} C_j`` (``10 L + R`` for two 10-class tasks);
        ``"first-label"`` is the first task's label.

        Multi-label tasks (CelebA5, binary attributes ``a``):

        - ``"all-attributes"``: the joint code of every attribute used by a task,
          ``sum_a y_a 2^(A-1-j(a))`` over the ``A`` attributes in ascending index order
          (all 40 for CelebA5, first attribute most significant) -- paper Table 3's
          all-label strata ("all available task-label coordinates") and the reference
          code's ``dirichlet_all_labels``. Nearly every image has its own code, so the
          Dirichlet step places few samples and the uniform top-up fills the rest
          (``docs/design.md``, "Partition strata").
        - ``"task-representatives"``: an ``m``-bit code of one attribute per task, the
          task's attribute whose training positive rate is closest to 1/2 (32 strata for
          CelebA5); a strongly non-IID alternative.
        - ``"all-label"``: fedhv's earlier name of ``"task-representatives"``, kept with
          that meaning so runs made with it resume and tabulate unchanged; a warning
          points to the two explicit names.
        - ``"first-label"``: the reference code's 3-bit code of Attractive, Male and
          Mouth_Slightly_Open (8 strata).
        """
        if isinstance(self.objective, MultiLabel):
            from fedhv.data.celeba import FIRST_LABEL_ATTRIBUTES

            if rule == "first-label":
                columns: tuple[int, ...] = FIRST_LABEL_ATTRIBUTES
            elif rule == "all-attributes":
                columns = tuple(sorted({a for g in self.objective.groups for a in g}))
            else:
                if rule == "all-label":
                    warnings.warn(
                        f"partition.strata = 'all-label' on {self.name} is the {self.num_tasks}-bit code of one "
                        "representative attribute per task (fedhv's earlier rule, kept so earlier runs resume "
                        "unchanged); the paper's all-label strata are 'all-attributes', this rule is also "
                        "named 'task-representatives'"
                    )
                columns = self.representative_attributes()
            code = np.zeros(len(self.train_y), dtype=np.int64)  # at most 63 bits: A <= 63 attributes
            for c in columns:
                code = code * 2 + self.train_y[:, c].astype(np.int64)
            return code
        if rule == "first-label":
            return self.train_y[:, 0].copy()
        joint = np.zeros(len(self.train_y), dtype=np.int64)
        for i, c in enumerate(self.num_classes):
            joint = joint * c + self.train_y[:, i]
        return joint


def overlay(first: np.ndarray, second: np.ndarray, canvas: int, shift: int, out: int = 28) -> np.ndarray:
    """Combine two image stacks on a canvas (max in the overlap), nearest-resize.

    Parameters
    ----------
    first, second : ndarray, uint8 ``[n, 28, 28]``
    canvas : int
        Side of the square canvas.
    shift : int
        Offset of ``second`` along both axes.
    out : int
        Output side.

    Returns
    -------
    ndarray, uint8 ``[n, out, out]``
    """
    n, h, w = first.shape
    c = np.zeros((n, canvas, canvas), dtype=np.uint8)
    c[:, :h, :w] = first
    region = c[:, shift : shift + h, shift : shift + w]
    np.maximum(region, second, out=region)
    idx = np.floor(np.arange(out) * canvas / out).astype(np.int64)
    return np.ascontiguousarray(c[:, idx][:, :, idx])


def _split_val(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    perm = numpy_rng(seed, "val-split").permutation(n)
    n_val = round(n * fraction)
    return np.sort(perm[: n - n_val]), np.sort(perm[n - n_val :])


def _build_pairs(benchmark: str, root: str | None, download: bool, pair_seed: int) -> dict[str, np.ndarray]:
    mnist = load_mnist(root, download)
    out: dict[str, np.ndarray] = {}
    if benchmark == "multimnist":
        for split, (x, y) in mnist.items():
            partner = numpy_rng(pair_seed, "multimnist-pairs", split).integers(0, len(x), size=len(x))
            out[f"{split}_x"] = overlay(x, x[partner], canvas=36, shift=6)
            out[f"{split}_y"] = np.stack([y, y[partner]], axis=1)
    else:
        fashion = load_fashion_mnist(root, download)
        for split, (x, y) in mnist.items():
            fx, fy = fashion[split]
            if len(fx) != len(x):
                raise ValueError(f"MNIST and Fashion-MNIST {split} sizes differ")
            perm = numpy_rng(pair_seed, "mnist-fmnist-pairs", split).permutation(len(fx))
            out[f"{split}_x"] = overlay(x, fx[perm], canvas=42, shift=14)
            out[f"{split}_y"] = np.stack([y, fy[perm]], axis=1)
    return out


def load_benchmark(
    benchmark: str,
    root: str | None = None,
    download: bool = True,
    pair_seed: int = 0,
    val_fraction: float = 0.2,
    val_seed: int = 1,
    augment: Augment | None = None,
    use_cache: bool = True,
) -> Benchmark:
    """Build (or load from the cache) a benchmark by name.

    The source files present under the data root are verified on every call (digests
    memoised by size and mtime); the cache key includes their fingerprints
    (:mod:`fedhv.data.derived`). ``augment`` replaces the benchmark's default training
    augmentation.
    """
    spec = resolve_benchmark(benchmark)  # a module:attribute value too, so that its refusal names it as such
    if not isinstance(spec, BenchmarkSpec):
        raise ConfigError(f"data.benchmark = {benchmark!r} is a user benchmark (tensors, not image files); "
                          "fedhv partition-stats and Flower take built-in benchmarks only, use fedhv run / grid")
    params = {"benchmark": benchmark, "pair_seed": pair_seed, "version": spec.version}
    arrays, provenance = load_derived(
        benchmark, spec.datasets, params, root, lambda: spec.build(root, download, pair_seed), use_cache
    )
    if "val_x" in arrays:  # an official validation split (CelebA)
        train_x, train_y, val_x, val_y = arrays["train_x"], arrays["train_y"], arrays["val_x"], arrays["val_y"]
    else:
        tr, va = _split_val(len(arrays["train_x"]), val_fraction, val_seed)
        train_x, train_y = arrays["train_x"][tr], arrays["train_y"][tr]
        val_x, val_y = arrays["train_x"][va], arrays["train_y"][va]
    provenance = {"benchmark": benchmark, **provenance,
                  "samples": {"train": len(train_x), "val": len(val_x), "test": len(arrays["test_x"])}}
    return Benchmark(
        name=benchmark,
        task_names=spec.task_names,
        num_classes=spec.num_classes,
        train_x=train_x,
        train_y=train_y,
        val_x=val_x,
        val_y=val_y,
        test_x=arrays["test_x"],
        test_y=arrays["test_y"],
        mean=spec.mean,
        std=spec.std,
        augment=augment if augment is not None else spec.augment,
        objective=spec.objective,
        provenance=provenance,
    )


@dataclass(frozen=True)
class BenchmarkSpec:
    """How a benchmark is built: source data sets (their fingerprints key the cache), builder, constants,
    and the name of its model in :data:`fedhv.registry.MODELS` (the paper's architecture, B.3)."""

    datasets: tuple[str, ...]
    build: Callable[[str | None, bool, int], dict[str, np.ndarray]]
    task_names: tuple[str, ...]
    num_classes: tuple[int, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: Augment
    objective: Objective = CLASSIFICATION
    version: int = 2
    model: str = "lenet"
    #: The natural identity of every training sample (``root -> ids [n_train]``) for ``partition.by =
    #: "identity"``; ``None``: the benchmark has none.
    identities: Callable[[str | None], np.ndarray] | None = None


def _cifar_mnist(root: str | None, download: bool, pair_seed: int) -> dict[str, np.ndarray]:
    from fedhv.data.cifar_mnist import build_cifar_mnist

    return build_cifar_mnist(root, download)


def _celeba5(root: str | None, download: bool, pair_seed: int) -> dict[str, np.ndarray]:
    from fedhv.data.celeba import load_celeba

    with warnings.catch_warnings():  # the subset warning was given (and recorded) by load_derived
        warnings.filterwarnings("ignore", message=".*not the full CelebA")
        data = load_celeba(root)
    return {f"{split}_{k}": v for split, pair in data.items() for k, v in zip(("x", "y"), pair)}


def _celeba_identities(root: str | None) -> np.ndarray:
    from fedhv.data.celeba import train_identities

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not the full CelebA")
        return train_identities(root)


BENCHMARKS.register("multimnist", BenchmarkSpec(
    ("MNIST",), lambda r, d, s: _build_pairs("multimnist", r, d, s), ("left", "right"), (10, 10),
    (MNIST_MEAN,), (MNIST_STD,), Augment(rotation_degrees=25.0), model="lenet",
))
BENCHMARKS.register("mnist-fmnist", BenchmarkSpec(
    ("MNIST", "Fashion-MNIST"), lambda r, d, s: _build_pairs("mnist-fmnist", r, d, s),
    ("digit", "fashion"), (10, 10), (MNIST_MEAN,), (MNIST_STD,), Augment(rotation_degrees=25.0), model="lenet",
))
BENCHMARKS.register("cifar10-mnist", BenchmarkSpec(
    ("CIFAR-10", "MNIST"), _cifar_mnist, ("cifar", "digit"), (10, 10),
    (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010),
    Augment(rotation_degrees=30.0, integer_angles=True, interpolation="nearest", flip_prob=0.4), model="cifar-cnn",
))
BENCHMARKS.register("celeba5", BenchmarkSpec(
    ("CelebA",), _celeba5, ("T1", "T2", "T3", "T4", "T5"), (8, 8, 8, 8, 8),
    tuple(v / 255.0 for v in (72.39239876, 82.90891754, 73.15835921)), (1.0, 1.0, 1.0), Augment(),
    MultiLabel(((0, 9, 3, 15, 22, 33, 25, 29), (1, 8, 7, 10, 16, 32, 26, 34), (2, 11, 12, 14, 21, 28, 35, 39),
                (4, 6, 13, 18, 19, 20, 30, 31), (5, 17, 23, 24, 27, 36, 37, 38))),
    model="resnet18-gn", identities=lambda root: _celeba_identities(root),
))

#: The benchmark registry (kept under its former name for existing callers).
BUILDERS = BENCHMARKS
