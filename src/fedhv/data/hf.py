"""Hugging Face ``datasets`` in: columns to tensors, a Flower Datasets partitioner to clients (issue 42).

What :meth:`fedhv.FederatedDataset.from_hf` is made of; ``pip install 'fedhv[hf]'`` (``datasets`` 4.x and
``flwr-datasets`` 0.6.1). Everything works offline on a local ``datasets.Dataset`` (``Dataset.from_dict``,
``load_dataset("parquet" | "csv" | "imagefolder", data_files=...)`` with ``HF_DATASETS_OFFLINE=1``);
nothing here downloads.

- **Inputs** (``features``): one ``Image`` column -- decoded once to ``uint8 [n, H, W(, C)]``, cached on
  disk under a digest of the images' bytes like the built-in benchmarks (:func:`fedhv.data.cache.fetch_arrays`),
  given to the model as ``float32 [n, C, H, W]`` in ``[0, 1]``; one array column (fixed-shape lists or
  ``ArrayND``); or several numeric columns stacked as ``[n, k]``.
- **Targets** (``tasks``): one column per task, named by the task or mapped with ``targets={task: column}``.
  A bare task name over a ``ClassLabel`` column becomes a classification task with its ``num_classes``;
  over an integer column, with ``max + 1`` classes. A classification task needs integer labels, a
  multilabel task integer or boolean values (one per attribute), a regression task numbers.
- **Clients** (``partitioner``): any ``flwr_datasets`` ``Partitioner`` not yet given a dataset
  (``DirichletPartitioner``, ``NaturalIdPartitioner``, ``PathologicalPartitioner``, ...): it is given the
  dataset with a row-index column, and partition ``c`` becomes client ``c``'s rows. A
  ``NaturalIdPartitioner``'s ids become :attr:`FederatedDataset.client_ids`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fedhv.errors import ConfigError
from fedhv.objectives import Task

#: What to install.
HF_EXTRA = "pip install 'fedhv[hf]'"
#: The row-index column added before a partitioner sees the dataset.
ROW = "__fedhv_row__"


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise ConfigError(f"from_hf needs Hugging Face datasets, which is not installed: {HF_EXTRA}") from exc
    return datasets


def check_dataset(dataset: Any, what: str = "dataset") -> Any:
    """Refuse anything but a ``datasets.Dataset`` (a ``DatasetDict`` names its splits)."""
    ds = _datasets()
    if isinstance(dataset, ds.DatasetDict):
        split = "train" if "train" in dataset else min(dataset)
        raise ConfigError(f"{what} is a DatasetDict with splits {sorted(dataset)}; pass one split, e.g. "
                          f"{what}['{split}'] (and the test split as test=)")
    if isinstance(dataset, ds.IterableDataset):
        raise ConfigError(f"{what} is an IterableDataset (streaming); load it as a Dataset (streaming=False) so its "
                          "rows can be partitioned")
    if not isinstance(dataset, ds.Dataset):
        raise ConfigError(f"{what} has type {type(dataset).__name__}; pass a datasets.Dataset (or use "
                          "FederatedDataset.from_tensors / from_datasets)")
    if len(dataset) == 0:
        raise ConfigError(f"{what} has no rows")
    return dataset


def _values(dataset: Any, name: str) -> np.ndarray:
    """A column as a numpy array of its own dtype (``float32`` stays ``float32``)."""
    return np.asarray(dataset.with_format("numpy")[name])


def _column(dataset: Any, name: str, what: str) -> None:
    if name not in dataset.column_names:
        raise ConfigError(f"{what} column {name!r} is not in the dataset (columns: {', '.join(dataset.column_names)}); "
                          "give one of them")


def resolve_tasks(dataset: Any, tasks: Sequence[Task | str], targets: Mapping[str, str] | None
                  ) -> tuple[tuple[Task, ...], dict[str, str]]:
    """The tasks (bare names typed from their columns) and each task's target column."""
    ds = _datasets()
    if isinstance(tasks, (str, Task)):
        tasks = [tasks]
    targets = dict(targets or {})
    out: list[Task] = []
    columns: dict[str, str] = {}
    for t in tasks:
        name = t.name if isinstance(t, Task) else str(t)
        col = targets.pop(name, name)
        _column(dataset, col, f"task {name!r}'s target")
        columns[name] = col
        if isinstance(t, Task):
            out.append(t)
            continue
        feature = dataset.features[col]
        if isinstance(feature, ds.ClassLabel):
            out.append(Task(name, "classification", int(feature.num_classes)))
        else:
            values = _values(dataset, col)
            if values.dtype.kind not in "iu":
                raise ConfigError(f"task {name!r}: column {col!r} holds {values.dtype} values; a task given by name "
                                  "needs integer class labels (or a ClassLabel column): pass a Task with its kind and "
                                  "size, e.g. Task(name, 'regression', 1)")
            out.append(Task(name, "classification", max(int(values.max()) + 1, 2)))
    if targets:
        raise ConfigError(f"targets names {sorted(targets)}, which are not tasks ({', '.join(columns)}); map each task "
                          "to its column")
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"tasks = {names} repeat a name; give every task its own name")
    return tuple(out), columns


def target_tensors(dataset: Any, tasks: Sequence[Task], columns: Mapping[str, str]) -> list[torch.Tensor]:
    """One tensor per task from its column, its values checked against the task's kind."""
    out = []
    for task in tasks:
        col = columns[task.name]
        values = _values(dataset, col)
        where = f"task {task.name!r} ({task.kind}): column {col!r}"
        if values.dtype == object:
            raise ConfigError(f"{where} holds values of mixed or ragged types; give one "
                              f"{'integer label' if task.kind == 'classification' else 'fixed-length row'} per sample")
        if task.kind == "classification":
            if values.dtype.kind not in "iu" or values.ndim != 1:
                shape = "" if values.ndim == 1 else f" of shape {values.shape[1:]}"
                raise ConfigError(f"{where} holds {values.dtype} values{shape}; a classification task needs one integer "
                                  "label in 0..size-1 per sample (cast the column, e.g. dataset.class_encode_column)")
            out.append(torch.from_numpy(values.astype(np.int64)))
        elif task.kind == "multilabel":
            if values.dtype.kind not in "iub":
                raise ConfigError(f"{where} holds {values.dtype} values; a multilabel task needs 0/1 (or boolean) "
                                  "values, one per attribute")
            out.append(torch.from_numpy(values.reshape(len(values), -1).astype(np.float32)))
        else:
            if values.dtype.kind not in "iuf":
                raise ConfigError(f"{where} holds {values.dtype} values; a regression task needs numbers")
            out.append(torch.from_numpy(values.reshape(len(values), -1).astype(np.float32)))
    return out


def _decode_images(dataset: Any, column: str, progress: bool) -> dict[str, np.ndarray]:
    import sys

    n = len(dataset)
    first = np.asarray(dataset[0][column].convert("RGB") if _is_color(dataset, column) else dataset[0][column])
    out = np.empty((n, *first.shape), dtype=np.uint8)
    for i, row in enumerate(dataset.select_columns([column])):
        img = row[column]
        arr = np.asarray(img.convert("RGB") if first.ndim == 3 else img.convert("L"))
        if arr.shape != first.shape:
            raise ConfigError(f"features column {column!r}: image {i} is {arr.shape[1::-1]} but image 0 is "
                              f"{first.shape[1::-1]}; resize them to one size first (dataset.map)")
        out[i] = arr
        if progress and (i + 1) % 5000 == 0:
            print(f"\rfedhv: decoding {column!r}: {i + 1}/{n} images", end="", file=sys.stderr, flush=True)
    if progress and n >= 5000:
        print(file=sys.stderr)
    return {"x": out}


def _is_color(dataset: Any, column: str) -> bool:
    return str(getattr(dataset[0][column], "mode", "L")) not in ("L", "1", "I", "F", "I;16")


def _image_digest(dataset: Any, column: str) -> str | None:
    """SHA-256 over the encoded bytes of every image of ``column``, row by row (``None``: not all local).

    What the decoded-image cache is keyed on, like the built-in benchmarks' caches on their sources' content: a
    row stored as a path is read from that file (bounded, regular files only); a row that is neither bytes nor a
    local file (a remote URL) makes the column uncacheable, so it is decoded every time.
    """
    import hashlib
    import os

    from fedhv import safe_io
    from fedhv.data.files import MAX_IMAGE_BYTES

    ds = _datasets()
    digest = hashlib.sha256()
    raw = dataset.select_columns([column]).cast_column(column, ds.Image(decode=False))
    for batch in raw.iter(batch_size=1024):
        for row in batch[column]:
            blob = row.get("bytes") if isinstance(row, dict) else None
            path = row.get("path") if isinstance(row, dict) else None
            if blob is None and isinstance(path, str) and os.path.isfile(path):
                blob = safe_io.read_regular(path, MAX_IMAGE_BYTES, follow=True)
            if not isinstance(blob, bytes):
                return None
            digest.update(len(blob).to_bytes(8, "little"))
            digest.update(blob)
    return digest.hexdigest()


#: Peak bytes per input value that :func:`input_tensor` and the partition hold for an image column (measured:
#: ten 1000 x 1000 RGB PNGs raised the peak by 313 MiB, 11 bytes a value: the decoded ``uint8`` array, its
#: ``float32`` tensor and the copy the dataset keeps), and per value over an array column's own item size.
IMAGE_BYTES = 11
ARRAY_EXTRA_BYTES = 8


def estimate_bytes(dataset: Any, features: str | Sequence[str], num_targets: int) -> tuple[int, str]:
    """``(bytes, description)``: what :func:`input_tensor` and the targets of ``dataset`` will take, estimated from
    its first row before anything is decoded (``from_hf``'s memory check, as ``from_datasets``')."""
    ds = _datasets()
    names = [features] if isinstance(features, str) else list(features)
    for name in names:
        _column(dataset, name, "features")
    n = len(dataset)
    if len(names) == 1 and isinstance(dataset.features[names[0]], ds.Image):
        img = dataset[0][names[0]]
        shape = np.asarray(img.convert("RGB") if _is_color(dataset, names[0]) else img.convert("L")).shape
        per_row = int(np.prod(shape)) * IMAGE_BYTES
        what = f"{n} images of {'x'.join(str(s) for s in shape)}"
    elif len(names) == 1:
        first = np.asarray(dataset[0][names[0]])
        per_row = first.size * (max(first.itemsize, 1) + ARRAY_EXTRA_BYTES)
        what = f"{n} rows of {names[0]!r} {list(first.shape)}"
    else:
        per_row = len(names) * (8 + ARRAY_EXTRA_BYTES)
        what = f"{n} rows of {len(names)} columns"
    return n * (per_row + 8 * num_targets), what


def input_tensor(dataset: Any, features: str | Sequence[str], cache: bool = True, progress: bool = True
                 ) -> tuple[torch.Tensor, dict[str, Any]]:
    """The model input ``x`` from the ``features`` column(s) (see the module docstring) and what it records."""
    ds = _datasets()
    names = [features] if isinstance(features, str) else list(features)
    if not names:
        raise ConfigError("features = [] is empty; name the input column(s), e.g. features='image'")
    for name in names:
        _column(dataset, name, "features")
    if len(names) == 1 and isinstance(dataset.features[names[0]], ds.Image):
        from fedhv.data.cache import cache_key, fetch_arrays

        col = names[0]
        content = _image_digest(dataset, col) if cache else None
        # keyed on the images' bytes, never on dataset._fingerprint (state.json: the sender's word, issue 52)
        key = cache_key(content=content, feature=str(dataset.features[col]), column=col, rows=len(dataset))
        arrays, info = fetch_arrays(f"hf-{col}", key, lambda: _decode_images(dataset, col, progress),
                                    enabled=cache and content is not None)
        x = torch.from_numpy(arrays["x"])
        x = (x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)).float().div_(255.0)
        return x, {"images": col, "cache": info}
    if len(names) == 1:
        values = np.asarray(dataset.with_format("numpy")[names[0]])
        if values.dtype == object or values.dtype.kind not in "iufb":
            raise ConfigError(f"features column {names[0]!r} holds {values.dtype} values; an input column must hold "
                              "numbers or fixed-shape arrays of numbers (or images)")
        return torch.from_numpy(values.astype(np.float32)), {"columns": names}
    stacked = []
    for name in names:
        values = _values(dataset, name)
        if values.ndim != 1 or values.dtype.kind not in "iufb":
            raise ConfigError(f"features column {name!r} holds {values.dtype} values of shape {values.shape[1:]}; "
                              "several input columns must each hold one number per sample")
        stacked.append(values.astype(np.float32))
    return torch.from_numpy(np.stack(stacked, axis=1)), {"columns": names}


def partition_rows(dataset: Any, partitioner: Any) -> tuple[list[np.ndarray], tuple[Any, ...] | None]:
    """Client ``c``'s rows: partition ``c`` of ``partitioner`` over ``dataset`` (and natural ids when it has them)."""
    # duck-typed (flwr-datasets' Partitioner interface), so this module never imports flwr_datasets
    if not all(hasattr(type(partitioner), a) for a in ("load_partition", "num_partitions", "is_dataset_assigned")):
        raise ConfigError(f"partitioner has type {type(partitioner).__name__}; pass a flwr_datasets Partitioner, e.g. "
                          "DirichletPartitioner(num_partitions=10, partition_by='label', alpha=0.5)")
    if partitioner.is_dataset_assigned():
        raise ConfigError("the partitioner already holds a dataset; give from_hf a fresh partitioner (it assigns "
                          "the dataset itself)")
    if ROW in dataset.column_names:
        raise ConfigError(f"the dataset has a column named {ROW!r}, which from_hf adds itself; rename it")
    partitioner.dataset = dataset.add_column(ROW, np.arange(len(dataset), dtype=np.int64))
    try:
        count = int(partitioner.num_partitions)
        rows = [np.asarray(partitioner.load_partition(c)[ROW], dtype=np.int64) for c in range(count)]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{type(partitioner).__name__} failed on this dataset: {exc}") from exc
    natural = getattr(partitioner, "partition_id_to_natural_id", None)
    ids = tuple(natural[c] for c in range(count)) if isinstance(natural, dict) and len(natural) == count else None
    return rows, ids
