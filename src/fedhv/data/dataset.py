"""A user's data as a federated dataset: tensors, tasks and a client partition.

Public as :class:`fedhv.FederatedDataset`, also importable from :mod:`fedhv.api.dataset`.

Partitions (``partition=``):

- a sequence of index lists: client ``c`` holds ``x[partition[c]]`` (sizes may differ; an
  empty list is an empty client, which exists but is never sampled);
- ``"dirichlet"``: the built-in rule (:func:`fedhv.data.partition.dirichlet_partition`):
  every client draws label proportions ``p ~ Dir(alpha 1_K)`` over the ``K`` strata (by
  default the first classification task's labels) and gets ``floor(p_k S)`` samples of
  stratum ``k``, topped up to exactly ``S = samples_per_client``;
- ``"dirichlet-disjoint"``: every sample to exactly one client
  (:func:`fedhv.data.partition.disjoint_dirichlet_partition`: per stratum, shares
  ``q ~ Dir(alpha 1_N)`` over the clients); sizes vary, no sample is shared (the
  ``"dirichlet"`` rule recycles samples when a stratum runs dry, with a warning);
- ``"ids"``: a natural id column ``ids [n]`` (writer, hospital, ...): one client per
  distinct id, in natural id order: numbers ascending, strings compared by their digit runs
  as numbers (``"user_2"`` before ``"user_10"``), numbers before strings. A missing id
  (``None``, NaN) is refused naming its row; so is ``clients=`` (the ids make the clients)
  unless it equals the number of distinct ids. :attr:`FederatedDataset.client_ids` maps
  client ``c`` back to its id.

A server-side validation set (``validation=``), for choices made before the test set is read (tuning,
early stopping): tensors of its own, or a fraction ``f`` in (0, 1) of the training rows, drawn from the
stream ``(seed, "val-split")`` and carved off *before* the partition, so no client holds them (with a
partition given as index lists, drawn from the rows no client holds; more than that pool is refused).
Runs evaluate it beside the test set (``metrics.jsonl``'s ``"val"``).

A client with fewer samples than the batch size takes every minibatch from a stream of
its shuffled epochs, so a batch repeats samples (:func:`fedhv.sim.plan.epoch_batches`),
on every engine and on Flower.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedhv.checks import as_seed, check_inputs, check_lengths, check_targets
from fedhv.data.federated import FederatedData
from fedhv.data.partition import dirichlet_partition, disjoint_dirichlet_partition
from fedhv.data.parts import ClientParts, RaggedParts
from fedhv.errors import ConfigError
from fedhv.objectives import Task, TaskObjective, as_tasks
from fedhv.rng import numpy_rng

TensorLike = torch.Tensor | np.ndarray


def _tensor(v: TensorLike, what: str) -> torch.Tensor:
    if not isinstance(v, (torch.Tensor, np.ndarray)):
        raise ConfigError(f"{what} has type {type(v).__name__}; pass a torch.Tensor or numpy array")
    return torch.as_tensor(v)


def _targets(targets: TensorLike | Sequence[TensorLike], tasks: tuple[Task, ...], n: int, what: str) -> torch.Tensor:
    items: list[Any] = list(targets) if isinstance(targets, (list, tuple)) else [targets]
    parts = [_tensor(t, what) for t in items]
    if len(parts) == len(tasks) and len(parts) > 1:
        check_lengths(n, parts, tasks, what)
    elif len(parts) == 1 and len(parts[0]) != n:
        raise ConfigError(f"{what} has {len(parts[0])} rows for {n} inputs; give one target row per row of x")
    cols = [p.reshape(len(p), -1) for p in parts]
    y = torch.cat([c.double() for c in cols], 1) if len(cols) > 1 else cols[0].double()
    width = sum(t.width for t in tasks)
    if y.shape != (n, width):
        raise ConfigError(f"{what} has shape {tuple(y.shape)}; expected [{n}, {width}] (one column per class "
                          "label, per attribute or per regression target, in task order)")
    check_targets(y, tasks, what)
    return y


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isnan(float(v)))


def _plain(v: Any) -> Any:
    """A numpy / torch scalar id as the Python value it holds (``np.str_("a")`` -> ``"a"``)."""
    if isinstance(v, torch.Tensor):
        v = v.item()
    return v.item() if isinstance(v, np.generic) else v


def _natural(v: Any) -> tuple[Any, ...]:
    """Sort key: numbers by value, then strings by their text with digit runs compared as numbers."""
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return (0, float(v))
    text = str(v)
    return (1, tuple((0, int(p), p) if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text) if p), text)


def _id_clients(ids: TensorLike | Sequence[Any], n: int, clients: int | None) -> tuple[list[torch.Tensor], tuple]:
    """One client per distinct id (natural order), each client's rows ascending; and the ids."""
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    values = [_plain(v) for v in (ids.tolist() if isinstance(ids, np.ndarray) else list(ids))]
    if len(values) != n:
        raise ConfigError(f"partition = \"ids\" needs ids = one client id per sample ({n} values, got "
                          f"{len(values)}); pass ids=")
    bad = next((i for i, v in enumerate(values) if _missing(v)), None)
    if bad is not None:
        raise ConfigError(f"ids[{bad}] = {values[bad]!r} is not a client id; every sample needs one (drop row {bad} "
                          "or give it an id)")
    rows: dict[Any, list[int]] = {}
    for i, v in enumerate(values):
        rows.setdefault(v, []).append(i)
    order = sorted(rows, key=_natural)
    if clients is not None and clients != len(order):
        raise ConfigError(f"clients = {clients} with partition = \"ids\": the ids make {len(order)} clients (one "
                          f"per distinct id); drop clients= (or pass clients={len(order)})")
    return [torch.tensor(rows[v], dtype=torch.int64) for v in order], tuple(order)


def _partition(spec: str | Sequence[Sequence[int]], n: int, y: torch.Tensor, tasks: tuple[Task, ...],
               clients: int | None, samples_per_client: int | None, alpha: float, seed: int,
               strata: TensorLike | None, ids: TensorLike | None
               ) -> tuple[ClientParts, tuple[Any, ...] | None]:
    """The client index sets and, for ``partition="ids"``, each client's id."""
    if not isinstance(spec, str) or spec != "ids":
        if ids is not None:
            raise ConfigError(f"ids= is given but partition = {spec!r} does not use it; pass partition=\"ids\" "
                              "(one client per distinct id) or drop ids=")
        if not isinstance(spec, str) and clients is not None and clients != len(spec):
            raise ConfigError(f"clients = {clients} but the partition lists {len(spec)} clients; drop clients= "
                              f"(the list makes the clients) or pass clients={len(spec)}")
        clients = 10 if clients is None else clients
    if isinstance(spec, str) and spec in ("dirichlet", "dirichlet-disjoint") and (
            isinstance(clients, bool) or not isinstance(clients, numbers.Integral) or clients < 1):
        raise ConfigError(f"clients = {clients!r} must be an integer >= 1 (how many clients the rule makes)")
    ids_out = None
    if isinstance(spec, str) and spec == "dirichlet":
        assert clients is not None  # set above (the rule's default: 10 clients)
        if strata is None:
            first = next((i for i, t in enumerate(tasks) if t.kind == "classification"), None)
            col = sum(t.width for t in tasks[:first]) if first is not None else None
            strata = np.zeros(n, np.int64) if col is None else y[:, col].long().numpy()
        s = samples_per_client or n // clients
        return torch.from_numpy(dirichlet_partition(np.asarray(strata), clients, s, alpha, seed)), None
    if isinstance(spec, str) and spec == "dirichlet-disjoint":
        assert clients is not None  # set above (the rule's default: 10 clients)
        if strata is None:
            first = next((i for i, t in enumerate(tasks) if t.kind == "classification"), None)
            col = sum(t.width for t in tasks[:first]) if first is not None else None
            strata = np.zeros(n, np.int64) if col is None else y[:, col].long().numpy()
        rows = [torch.from_numpy(r) for r in disjoint_dirichlet_partition(np.asarray(strata), clients, alpha, seed)]
    elif isinstance(spec, str) and spec == "ids":
        if ids is None:
            raise ConfigError(f"partition = \"ids\" needs ids = one client id per sample ({n} values); pass ids=")
        if samples_per_client is not None:
            raise ConfigError(f"samples_per_client = {samples_per_client} with partition = \"ids\": each client "
                              "holds the rows of its id; drop samples_per_client=")
        rows, ids_out = _id_clients(ids, n, clients)
    elif isinstance(spec, str):
        raise ConfigError(f"partition = {spec!r} is unknown; use \"dirichlet\", \"dirichlet-disjoint\", \"ids\" or a "
                          "list of index lists")
    else:
        rows = [torch.as_tensor(np.asarray(r, dtype=np.int64)) for r in spec]
    flat = torch.cat([r.reshape(-1) for r in rows]) if rows else torch.zeros(0, dtype=torch.int64)
    if len(flat) and (int(flat.min()) < 0 or int(flat.max()) >= n):  # name the first bad client
        c = next(c for c, r in enumerate(rows) if len(r) and (int(r.min()) < 0 or int(r.max()) >= n))
        raise ConfigError(f"partition[{c}] has indices outside [0, {n}); give each client valid sample indices")
    if not any(len(r) for r in rows):
        raise ConfigError("partition: every client is empty; give at least one client samples")
    if len({len(r) for r in rows}) == 1:
        return torch.stack(rows), ids_out
    return RaggedParts(rows), ids_out


def _carve(validation: float, n: int, listed: Sequence[Sequence[int]] | None, seed: int) -> np.ndarray:
    """The sorted rows of a validation fraction.

    ``round(f n)`` rows from the stream ``(seed, "val-split")``, among all ``n`` rows, or (a partition
    given as index lists) among the rows no client holds.
    """
    if isinstance(validation, bool) or not isinstance(validation, numbers.Real) or not 0 < float(validation) < 1:
        raise ConfigError(f"validation = {validation!r} must be a fraction in (0, 1) of the training rows or "
                          "(x_val, targets_val); e.g. validation=0.1")
    k = round(float(validation) * n)
    if k < 1:
        raise ConfigError(f"validation = {validation} of {n} training rows is no row; give a larger fraction "
                          f"(at least {1 / n:.2g})")
    pool = np.arange(n)
    if listed is not None:
        held = np.zeros(n, dtype=bool)
        for rows in listed:
            held[np.asarray(rows, dtype=np.int64)] = True
        pool = np.flatnonzero(~held)
        if k > len(pool):
            raise ConfigError(f"validation = {validation} needs {k} rows but only {len(pool)} of the {n} training "
                              "rows are held by no client (the partition lists the others); give a fraction of at "
                              f"most {len(pool) / n:.3g} or (x_val, targets_val)")
    order = numpy_rng(seed, "val-split").permutation(len(pool))
    return np.sort(pool[order[:k]])


def _given_split(pair: tuple[Any, Any], tasks: tuple[Task, ...], what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, targets)`` of a test or validation set, checked as the training rows are."""
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise ConfigError(f"{what} must be a pair (x, targets); got {type(pair).__name__}")
    tx = _tensor(pair[0], f"{what}[0]")
    check_inputs(tx, f"{what}[0]")
    return tx, _targets(pair[1], tasks, len(tx), f"{what}[1]")


@dataclass
class FederatedDataset:
    """Training tensors split among clients, optional test tensors, and the tasks.

    Build with :meth:`from_tensors` or :meth:`from_datasets`. ``x`` is any input the model accepts (one row per
    sample); targets ``y [n, sum_i width_i]`` hold each task's columns in task order.
    """

    tasks: tuple[Task, ...]
    x: torch.Tensor
    y: torch.Tensor
    parts: ClientParts
    test: tuple[torch.Tensor, torch.Tensor] | None = None
    extra: dict[str, object] = field(default_factory=dict)
    #: Client ``c``'s id: its natural id under ``partition="ids"``, else ``c`` itself.
    client_ids: tuple[Any, ...] = ()
    #: The server-side validation set ``(x, y)`` (no client holds it), or ``None``.
    validation: tuple[torch.Tensor, torch.Tensor] | None = None

    def __post_init__(self) -> None:
        """Give each client its id (``c`` by default); refuse a wrong number of ids."""
        if not self.client_ids:
            self.client_ids = tuple(range(self.num_clients))
        elif len(self.client_ids) != self.num_clients:
            raise ConfigError(f"client_ids has {len(self.client_ids)} ids for {self.num_clients} clients; give one "
                              "id per client")

    @property
    def num_clients(self) -> int:
        """The number of clients ``N`` of the partition."""
        return int(self.parts.shape[0])

    @property
    def client_sizes(self) -> list[int]:
        """Samples per client (``0`` for an empty client, which is never sampled)."""
        return [len(self.parts[c]) for c in range(self.num_clients)]

    @classmethod
    def from_tensors(cls, x: TensorLike, targets: TensorLike | Sequence[TensorLike], tasks: Sequence[Task | str], *,
                     partition: str | Sequence[Sequence[int]] = "dirichlet", clients: int | None = None,
                     samples_per_client: int | None = None, alpha: float = 0.5, seed: int = 10,
                     strata: TensorLike | None = None, ids: TensorLike | None = None,
                     test: tuple[TensorLike, TensorLike | Sequence[TensorLike]] | None = None,
                     validation: float | tuple[TensorLike, TensorLike | Sequence[TensorLike]] | None = None
                     ) -> FederatedDataset:
        """Partition ``(x, targets)`` among clients (see the module docstring for ``partition``).

        Parameters
        ----------
        x : Tensor ``[n, ...]``
        targets : Tensor ``[n, cols]`` or one Tensor per task (``[n]`` or ``[n, width]``)
        tasks : sequence of Task or str (a bare name = binary classification)
        clients, samples_per_client, alpha, seed, strata
            The Dirichlet rule's ``N`` (default 10), ``S`` (default ``n // N``), ``alpha``,
            partition seed (any integer, ``numpy.int64`` too) and strata (default: the first
            classification task's labels). With ``partition="ids"`` or a list, the partition
            makes the clients: ``clients=`` other than their number is refused.
        ids : Tensor, array or sequence ``[n]``
            Natural client ids for ``partition="ids"`` (numbers or strings; ``None`` / NaN
            refused); refused with another partition.
        test : (x_test, targets_test), optional
            Evaluation data (no evaluation without it).
        validation : float or (x_val, targets_val), optional
            The server-side validation set (module docstring): its own tensors, or a fraction in
            (0, 1) of the training rows carved off before the partition (``seed`` draws them).
        """
        ts = as_tasks(tasks)
        seed = as_seed("seed", seed)
        xt = _tensor(x, "x")
        check_inputs(xt, "x")
        y = _targets(targets, ts, len(xt), "targets")
        val_t = None
        if isinstance(validation, (tuple, list)):
            val_t = _given_split(validation, ts, "validation")
        elif validation is not None:
            listed = None if isinstance(partition, str) else partition
            rows = _carve(validation, len(xt), listed, seed)
            val_t = (xt[torch.from_numpy(rows)], y[torch.from_numpy(rows)])
            if listed is None:  # the rule partitions the remaining rows
                keep = torch.from_numpy(np.setdiff1d(np.arange(len(xt)), rows))
                xt, y = xt[keep], y[keep]
                strata = None if strata is None else np.asarray(strata)[keep.numpy()]
                if ids is not None:
                    ids = (np.asarray(ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else ids,
                                      dtype=object)[keep.numpy()])
        parts, client_ids = _partition(partition, len(xt), y, ts, clients, samples_per_client, alpha, seed, strata,
                                       ids)
        test_t = None if test is None else _given_split(test, ts, "test")
        return cls(ts, xt, y, parts, test_t, client_ids=client_ids or (), validation=val_t)

    @classmethod
    def from_datasets(cls, train: Any, test: Any | None = None, tasks: Sequence[Task | str] = (), *,
                      partition: str | Sequence[Sequence[int]] = "dirichlet", clients: int | None = None,
                      samples_per_client: int | None = None, alpha: float = 0.5, seed: int = 10,
                      strata: TensorLike | None = None, ids: TensorLike | None = None,
                      validation: float | Any | None = None,
                      max_bytes: int | None = None, progress: bool = True) -> FederatedDataset:
        """Materialise map-style datasets once to tensors, then partition as :meth:`from_tensors`.

        Parameters
        ----------
        train, test : torch.utils.data.Dataset (map-style: ``len`` and ``[i]``)
            Items ``(x, y)`` or ``(x, y, client_id)``: ``x`` a tensor, array or number (same
            shape for every item); ``y`` the targets of all tasks: one value or tensor per task
            (a tuple/list) or one tensor of ``sum_i width_i`` values. ``client_id`` (third
            element) is the natural id used by ``partition="ids"`` when ``ids`` is not given.
        tasks, partition, clients, samples_per_client, alpha, seed, strata, ids
            As for :meth:`from_tensors`.
        validation : float or torch.utils.data.Dataset, optional
            A fraction of ``train`` carved off before the partition (:meth:`from_tensors`), or a
            map-style dataset of validation items.
        max_bytes : int, optional
            Memory the materialised tensors may take (default: half of the available RAM,
            ``os.sysconf``). The size is estimated before loading as
            ``len(dataset) * (bytes(x_0) + 8 * sum_i width_i)`` over train and test; a larger
            estimate raises :class:`DatasetTooLarge`.
        progress : bool
            A one-line progress count on stderr while loading.
        """
        from fedhv.data.materialize import materialize

        ts = as_tasks(tasks)
        width = sum(t.width for t in ts)
        x, y, found_ids, x_test, y_test = materialize(train, test, width, max_bytes, progress)
        if ids is None and partition == "ids":
            if found_ids is None:
                raise ConfigError("partition = \"ids\" needs one client id per sample; pass ids= or let the "
                                  "dataset return (x, y, client_id) items")
            ids = found_ids
        test_t = None if x_test is None or y_test is None else (x_test, y_test)
        val: Any = validation
        if validation is not None and not isinstance(validation, numbers.Real):
            x_val, y_val, _, _, _ = materialize(validation, None, width, max_bytes, progress)
            val = (x_val, y_val)
        data = cls.from_tensors(x, y, ts, partition=partition, clients=clients, samples_per_client=samples_per_client,
                                alpha=alpha, seed=seed, strata=strata, ids=ids, test=test_t, validation=val)
        data.extra["source"] = {"train": type(train).__name__, "test": None if test is None else type(test).__name__}
        return data

    @classmethod
    def from_hf(cls, dataset: Any, tasks: Sequence[Task | str], *, features: str | Sequence[str],
                targets: dict[str, str] | None = None, partitioner: Any = None, test: Any | None = None,
                partition: str | Sequence[Sequence[int]] = "dirichlet", clients: int | None = None,
                samples_per_client: int | None = None, alpha: float = 0.5, seed: int = 10,
                strata: TensorLike | None = None, ids: str | None = None, cache: bool = True,
                validation: float | Any | None = None, progress: bool = True,
                max_bytes: int | None = None) -> FederatedDataset:
        """A Hugging Face ``datasets.Dataset`` split among clients (``pip install 'fedhv[hf]'``).

        Parameters
        ----------
        dataset, test : datasets.Dataset
            Training rows and, optionally, test rows with the same columns (one split each: a
            ``DatasetDict`` is refused naming its splits).
        tasks : sequence of Task or str
            A bare name over a ``ClassLabel`` or integer column is a classification task sized by the
            column (:func:`fedhv.data.hf.resolve_tasks`).
        features : str or sequence of str
            The input column: images (decoded once and cached), a fixed-shape array column, or
            several numeric columns stacked.
        targets : dict, optional
            ``{task name: column}`` where a task's column is not named like the task.
        partitioner : flwr_datasets.partitioner.Partitioner, optional
            Decides the clients (partition ``c`` = client ``c``; a ``NaturalIdPartitioner``'s ids
            become :attr:`client_ids`). Without it, ``partition``, ``clients``,
            ``samples_per_client``, ``alpha``, ``seed``, ``strata`` act as in :meth:`from_tensors`, and
            ``ids`` names the natural-id column of ``partition="ids"``.
        cache : bool
            Keep decoded images in fedhv's cache folder (keyed by a SHA-256 of the images' encoded
            bytes, never by the dataset's declared fingerprint).
        validation : float or datasets.Dataset, optional
            A fraction of ``dataset``'s rows carved off before the partition (:meth:`from_tensors`;
            not with a ``partitioner``, which places every row), or validation rows with ``dataset``'s
            columns.
        max_bytes : int, optional
            The memory the tensors may take (default: half of the available memory), as in
            :meth:`from_datasets`: estimated from each split's first row before any image is decoded; a
            larger estimate raises :class:`DatasetTooLarge`.
        """
        from fedhv.data.hf import (
            check_dataset,
            estimate_bytes,
            input_tensor,
            partition_rows,
            resolve_tasks,
            target_tensors,
        )
        from fedhv.data.materialize import check_budget

        check_dataset(dataset)
        ts, columns = resolve_tasks(dataset, tasks, targets)
        splits = [dataset]
        for split, what in ((test, "test"), (validation, "validation")):
            if split is not None and not isinstance(split, numbers.Real):
                splits.append(check_dataset(split, what))
        estimates = [estimate_bytes(s, features, len(ts)) for s in splits]
        check_budget(sum(e[0] for e in estimates), max_bytes, " + ".join(e[1] for e in estimates),
                     "pass fewer rows (dataset.select(range(n))), smaller images (dataset.map with a resize), or a "
                     "larger max_bytes=")
        x, source = input_tensor(dataset, features, cache, progress)
        y = target_tensors(dataset, ts, columns)
        test_t = None
        if test is not None:
            check_dataset(test, "test")
            test_t = (input_tensor(test, features, cache, progress)[0], target_tensors(test, ts, columns))
        val: Any = validation
        if validation is not None and not isinstance(validation, numbers.Real):
            check_dataset(validation, "validation")
            val = (input_tensor(validation, features, cache, progress)[0], target_tensors(validation, ts, columns))
        if partitioner is not None:
            if val is not None and not isinstance(val, tuple):
                raise ConfigError(f"validation = {validation!r} with a partitioner: the partitioner places every row; "
                                  "pass validation rows as a datasets.Dataset instead of a fraction")
            given = {"partition": partition != "dirichlet", "clients": clients is not None, "ids": ids is not None,
                     "samples_per_client": samples_per_client is not None, "strata": strata is not None}
            if any(given.values()):
                raise ConfigError(f"{', '.join(k for k, v in given.items() if v)}: the partitioner decides the clients; "
                                  "drop these or the partitioner")
            rows, natural = partition_rows(dataset, partitioner)
            data = cls.from_tensors(x, y, ts, partition=[r.tolist() for r in rows], test=test_t, validation=val)
            if natural is not None:
                data.client_ids = natural
            source["partitioner"] = type(partitioner).__name__
        else:
            id_values = None
            if ids is not None:
                if ids not in dataset.column_names:
                    raise ConfigError(f"ids column {ids!r} is not in the dataset (columns: "
                                      f"{', '.join(dataset.column_names)}); give one of them")
                id_values = np.asarray(dataset[ids])
            data = cls.from_tensors(x, y, ts, partition=partition, clients=clients,
                                    samples_per_client=samples_per_client, alpha=alpha, seed=seed, strata=strata,
                                    ids=id_values, test=test_t, validation=val)
        data.extra["source"] = {"hf": getattr(dataset, "_fingerprint", None), "features": features, **{
            k: v for k, v in source.items() if k != "cache"}}
        return data

    def provenance(self) -> dict[str, Any]:
        """What ``environment.json`` records about the data (``"data"``)."""
        sizes = self.client_sizes
        return {"source": "fedhv.FederatedDataset", "train_samples": len(self.x),
                "test_samples": 0 if self.test is None else len(self.test[0]),
                "validation_samples": 0 if self.validation is None else len(self.validation[0]),
                "clients": self.num_clients,
                "empty_clients": sum(1 for s in sizes if s == 0),
                "samples_per_client": {"min": min(sizes), "max": max(sizes)},
                "x_shape": list(self.x.shape[1:]), "x_dtype": str(self.x.dtype), **self.extra}

    def digest(self) -> str:
        """SHA-256 of the training and test tensors and the partition (a resume checks it)."""
        h = hashlib.sha256()
        tensors = [self.x, self.y, *(self.parts[c] for c in range(self.num_clients))]
        if self.test is not None:
            tensors += list(self.test)
        if self.validation is not None:
            tensors += [*self.validation]
        for t in tensors:
            t = t.detach().cpu().contiguous()
            h.update(f"{t.dtype}{list(t.shape)}".encode())
            h.update(t.numpy().tobytes() if t.numel() else b"")
        return h.hexdigest()

    def federated(self, dtype: torch.dtype, device: torch.device | str) -> FederatedData:
        """The engines' :class:`~fedhv.data.federated.FederatedData` on ``device`` (floats in ``dtype``)."""
        def conv(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)

        sets = {"test": self.test, "val": self.validation}
        evals = {name: (conv(pair[0]), pair[1].to(device, dtype)) for name, pair in sets.items() if pair is not None}
        return FederatedData(
            task_names=tuple(t.name for t in self.tasks), num_classes=tuple(t.size for t in self.tasks),
            train_x=conv(self.x), train_y=self.y.to(device, dtype), parts=self.parts.to(device),
            eval_sets=evals, augment=None, objective=TaskObjective(self.tasks),
        )
