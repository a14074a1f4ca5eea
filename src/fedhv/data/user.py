"""User benchmarks: a user's tensors, tasks and model, named in a configuration.

A user benchmark is a function ``() -> UserBenchmark`` named by
``data.benchmark = "mypkg.tasks:make_benchmark"`` (imported on use) or registered with
:func:`fedhv.register_benchmark`. ``fedhv run`` / ``grid`` then partition its training
tensors with the configured Dirichlet rule (``partition.*``: client ``c`` draws
``p ~ Dir(alpha 1_K)`` over the ``K`` strata and takes ``floor(p_k S)`` samples of stratum
``k``, topped up to ``S``), evaluate on its test tensors, and train the model it returns.

Strata (``partition.strata``): the user's own ``strata`` when given; otherwise
``"first-label"`` is the first classification task's label and ``"all-label"`` the joint
label ``sum_i y_i prod_{j>i} C_j`` of all classification tasks (one stratum without
classification tasks).

fedhv does not cache user data (no derived-data cache file, so no key can collide); the
run's ``environment.json`` records ``module:attr``, the module file's SHA-256 and the
declared ``version``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedhv import safe_io
from fedhv.checks import check_heads, check_model
from fedhv.config.schema import PartitionConfig
from fedhv.data.dataset import FederatedDataset
from fedhv.data.federated import FederatedData
from fedhv.errors import ConfigError
from fedhv.models.base import MultiTaskModel
from fedhv.models.module import ModuleAdapter
from fedhv.objectives import Task, as_tasks
from fedhv.registry import MODELS, is_reference, resolve_benchmark
from fedhv.rng import numpy_rng

TensorLike = torch.Tensor | np.ndarray
Targets = TensorLike | Sequence[TensorLike]


@dataclass(frozen=True)
class UserBenchmark:
    """A user's multi-task benchmark.

    Parameters
    ----------
    tasks : sequence of Task or str
        One task per model output (a bare name = binary classification).
    train, test : (x, targets)
        ``x [n, ...]``; targets one tensor per task or one ``[n, sum_i width_i]``
        (:meth:`fedhv.FederatedDataset.from_tensors`).
    model : callable, nn.Module or str
        ``model() -> nn.Module`` returning one output per task, a module (deep-copied for every
        use), or the name of a registered model (``"lenet"``: ``factory(task sizes)``). Its
        ``Linear`` / ``Conv2d`` layers are re-initialised from the run's seed (PyTorch's
        default rule), so seeds reproduce, unless ``initialise = False``.
    heads : str
        Attribute of the module holding the per-task heads (FSMGDA, FedCMOO).
    strata : array ``[n]``, optional
        Dirichlet strata of the training samples (default: from the labels, see above).
    version : str
        Declared version of the data, recorded with the run.
    dataset : FederatedDataset, optional
        Data already split among clients (what :func:`fedhv.simulate` passes): its own
        partition and test set are used, ``partition.*`` and ``train`` / ``test`` are not.
    initialise : bool
        ``False``: ``theta^0`` is the module's own parameters (``fedhv.simulate``).
    """

    tasks: Sequence[Task | str]
    train: tuple[TensorLike, Targets] | None
    test: tuple[TensorLike, Targets] | None
    model: Callable[[], nn.Module] | nn.Module | str
    heads: str = "heads"
    strata: TensorLike | None = None
    version: str = ""
    dataset: Any = None
    initialise: bool = True


_LOADED: dict[tuple[str, int], UserBenchmark] = {}


def user_benchmark(name: str) -> UserBenchmark | None:
    """The user benchmark ``name`` names (built once per process), or ``None`` for a built-in one.

    Raises
    ------
    ConfigError
        When the factory does not return a :class:`UserBenchmark`.
    """
    from fedhv.data.benchmarks import BenchmarkSpec

    factory = resolve_benchmark(name)
    if isinstance(factory, BenchmarkSpec):
        return None
    key = (name, id(factory))
    if key not in _LOADED:
        ub = factory()
        if not isinstance(ub, UserBenchmark):
            raise ConfigError(f"data.benchmark = {name!r} returned a {type(ub).__name__}; return "
                              "fedhv.UserBenchmark(tasks=..., train=(x, targets), test=(x, targets), model=...)")
        _LOADED[key] = ub
    return _LOADED[key]


def _strata(ub: UserBenchmark, tasks: tuple[Task, ...], y: torch.Tensor, rule: str) -> np.ndarray:
    if ub.strata is not None:
        return np.asarray(ub.strata, dtype=np.int64)
    code = np.zeros(len(y), dtype=np.int64)
    col = 0
    for t in tasks:
        if t.kind == "classification":
            code = code * t.size + y[:, col].long().numpy()
            if rule == "first-label":
                return code
        col += t.width
    return code


def provenance(name: str, ub: UserBenchmark) -> dict[str, Any]:
    """What the run's data came from: the reference, the module file and its digest, the version."""
    out: dict[str, Any] = {"benchmark": name, "user": {"version": ub.version}}
    if is_reference(name):
        module = inspect.getmodule(resolve_benchmark(name))
        path = getattr(module, "__file__", None)
        if path:
            source = safe_io.read_regular(path, follow=True)
            out["user"].update(file=str(path), sha256=hashlib.sha256(source).hexdigest())
    return out


def user_federated_data(name: str, partition: PartitionConfig, dtype: torch.dtype, device: str,
                        max_test_samples: int = 0, ub: UserBenchmark | None = None) -> FederatedData:
    """The user benchmark's tensors on ``device``, partitioned by ``partition``.

    ``ub``: the benchmark itself; else the one ``name`` names.
    """
    ub = ub if ub is not None else user_benchmark(name)
    if ub is None:
        raise ConfigError(f"data.benchmark = {name!r} is a built-in benchmark; load it with load_benchmark")
    if ub.dataset is not None:  # split already (fedhv.simulate): its partition and test set as they are
        fd = ub.dataset
        data = fd.federated(dtype, device)
        return dataclasses.replace(data, provenance={"benchmark": name, **fd.provenance(), "digest": fd.digest()})
    if ub.train is None:
        raise ConfigError(f"data.benchmark = {name!r}: the UserBenchmark has neither train tensors nor a dataset")
    tasks = as_tasks(ub.tasks)
    plain = FederatedDataset.from_tensors(ub.train[0], ub.train[1], tasks, partition=[[0]])  # the targets [n, cols]
    strata = _strata(ub, tasks, plain.y, partition.strata)
    fd = FederatedDataset.from_tensors(
        ub.train[0], ub.train[1], tasks, partition="dirichlet", clients=partition.clients,
        samples_per_client=partition.samples_per_client, alpha=partition.alpha, seed=partition.seed,
        strata=strata, test=ub.test,
    )
    if fd.test is not None and max_test_samples and max_test_samples < len(fd.test[0]):
        keep = torch.from_numpy(np.sort(numpy_rng(0, "test-subset").permutation(len(fd.test[0]))[:max_test_samples]))
        fd.test = (fd.test[0][keep], fd.test[1][keep])
    data = fd.federated(dtype, device)
    prov = provenance(name, ub)
    prov["samples"] = {"train": len(fd.x), "test": 0 if fd.test is None else len(fd.test[0])}
    return dataclasses.replace(data, provenance=prov)


def user_model(name: str, data: FederatedData, batch_size: int | None = None,
               ub: UserBenchmark | None = None) -> MultiTaskModel:
    """The user benchmark's model as a :class:`MultiTaskModel` (float32 on the CPU, before init).

    Checked before round 1: an eval-mode forward on a few training rows (output shapes and
    dtypes, finite losses: :func:`fedhv.checks.check_model`), on two test rows (a test set
    the model cannot take fails here, not at the first evaluation) and, given
    ``batch_size``, a train-mode forward on a batch of that size (BatchNorm's batch of one).
    """
    ub = ub if ub is not None else user_benchmark(name)
    assert ub is not None
    if isinstance(ub.model, nn.Module):
        module = copy.deepcopy(ub.model)
    else:
        module = MODELS.get(ub.model)(data.num_classes) if isinstance(ub.model, str) else ub.model()
    if isinstance(module, MultiTaskModel):
        return module
    if not isinstance(module, nn.Module):
        raise ConfigError(f"data.benchmark = {name!r}: model() returned a {type(module).__name__}; return an "
                          "nn.Module with one output per task")
    module = module.cpu() if not ub.initialise else module.float().cpu()
    first = next(module.parameters(), None)
    if first is None:
        raise ConfigError(f"data.benchmark = {name!r}: the model has no parameters; pass an nn.Module with trainable "
                          "parameters")
    check_heads(module, ub.heads, data.num_tasks, False, explicit=ub.heads != "heads", task_names=data.task_names)
    x = data.train_x.to("cpu")
    x = x.to(first.dtype) if x.is_floating_point() else x
    adapter = ModuleAdapter(module, data.task_names, x[:2], ub.heads)
    check_model(adapter, x, data.train_y.to(device="cpu", dtype=first.dtype), data.objective.tasks
                if hasattr(data.objective, "tasks") else (), data.objective)
    _probe(module, x, data, first.dtype, batch_size)
    return adapter


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to("cpu", dtype) if x.is_floating_point() else x.to("cpu")


def _probe(module: nn.Module, x: torch.Tensor, data: FederatedData, dtype: torch.dtype,
           batch_size: int | None) -> None:
    """Forward passes the run will make, tried before round 1 (buffers, mode and RNG restored)."""
    saved = {n: b.clone() for n, b in module.named_buffers()}
    was = module.training
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            test = data.eval_sets.get("test")
            if test is not None and len(test[0]):
                module.eval()
                xt = _cast(test[0][:2], dtype)
                try:
                    module(xt)
                except Exception as exc:  # noqa: BLE001 - any failure: the test set does not fit the model
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    raise ConfigError(
                        f"the test set does not fit the model: it fails on 2 test rows (shape {list(xt.shape)}; "
                        f"training x has shape {list(x.shape[1:])} per row) with {type(exc).__name__}: {first}; "
                        "give test inputs of the training inputs' shape") from None
            if batch_size:
                module.train()
                rows = x[torch.arange(batch_size) % len(x)]
                try:
                    module(rows)
                except Exception as exc:  # noqa: BLE001 - the clients' training would fail the same way
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    fix = ("BatchNorm needs at least 2 samples per batch: use batch_size >= 2"
                           if "more than 1 value per channel" in first else "check the model's forward in train mode")
                    raise ConfigError(f"batch_size = {batch_size}: the model fails in train mode on a batch of "
                                      f"{batch_size} rows ({type(exc).__name__}: {first}); {fix}") from None
    finally:
        module.train(was)
        with torch.no_grad():
            for n, b in module.named_buffers():
                b.copy_(saved[n])
