"""A client's own training data in one file: what a SuperNode with data of its own serves.

A deployed client (a hospital, a phone) does not hold the benchmark; it holds its own
samples. This module defines the file it serves them from, a NumPy ``.npz`` archive:

- ``x``: ``uint8 [S, H, W]`` (grey) or ``[S, H, W, C]`` images, the benchmark's raw
  pixel layout (the node normalises them with the benchmark's mean and standard
  deviation, ``(x / 255 - mean_c) / std_c``, exactly as the simulator does);
- ``y``: integer labels ``[S, L]``: one class per task for classification benchmarks
  (``L = m``, ``0 <= y[:, i] < C_i``), the binary attribute columns for multi-label ones;
- ``benchmark`` (optional): the benchmark name the file was written for, checked when
  present; ``format``: :data:`FORMAT` (checked when present).

The setting (model, tasks, augmentation, local training) still comes from the run's
configuration, which the server sends in the handshake; only the samples are the
node's. :func:`export_partition` writes client ``K``'s samples of a built-in setting in
this format (a node serving that file computes exactly what the simulator computes for
client ``K``), which is also how to prepare files for a test deployment.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np
import torch

from fedhv import safe_io
from fedhv.config.schema import RunConfig
from fedhv.data.benchmarks import BUILDERS
from fedhv.data.configured import DTYPES, configured_augment, load_data
from fedhv.data.federated import FederatedData, to_tensor_images
from fedhv.errors import FedHVError
from fedhv.objectives import Classification, MultiLabel

#: Version of the node data file layout.
FORMAT = 1


class NodeDataError(FedHVError):
    """A node's data file is missing, unreadable or does not fit the run's setting."""


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes (names the data a node served, in logs and run records)."""
    h = hashlib.sha256()
    with safe_io.open_regular(path, follow=True) as f:  # a FIFO or a device: one line, never a hang
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def node_data_file(folder: str | Path, client: int) -> Path:
    """The data file of client ``client`` in a node data folder: ``client-K.npz``."""
    return Path(folder) / f"client-{client}.npz"


def export_partition(cfg: RunConfig, client: int, path: str | Path) -> Path:
    """Write client ``client``'s training samples of ``cfg``'s setting to ``path`` (``.npz``).

    The samples are the rows ``parts[client]`` of the setting's partition, in order, so a
    node serving the file draws exactly the simulator's batches for that client.
    """
    n = cfg.partition.clients
    if not 0 <= client < n:
        raise NodeDataError(f"client = {client} is not a client of this setting (partition.clients = {n}); "
                            f"choose 0..{n - 1}")
    bench, parts = load_data(cfg)
    own = parts[client]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    arrays = {"x": bench.train_x[own], "y": bench.train_y[own], "benchmark": np.array(cfg.data.benchmark),
              "format": np.array(FORMAT)}
    try:  # an exclusive temporary file under an unpredictable name, renamed over ``out`` (never through a link)
        safe_io.write_atomic_with(out, lambda fh: np.savez(fh, **arrays))
    except safe_io.UnsafeFileError as exc:
        raise NodeDataError(str(exc)) from None
    return out


def _read(path: Path) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    if not path.is_file():
        raise NodeDataError(f"node-config data-path = {str(path)!r} is not a file; give the path of this node's "
                            ".npz data file (see `fedhv flower export`)")
    try:
        with safe_io.open_regular(path, follow=True) as fh, np.load(fh, allow_pickle=False) as z:
            if "x" not in z.files or "y" not in z.files:
                raise NodeDataError(f"node data file {str(path)!r} holds {sorted(z.files)}; it needs arrays 'x' "
                                    "(uint8 images) and 'y' (integer labels)")
            meta = {k: str(z[k]) for k in ("benchmark", "format") if k in z.files}
            return np.asarray(z["x"]), np.asarray(z["y"]), meta
    except NodeDataError:
        raise
    except safe_io.UnsafeFileError as exc:
        raise NodeDataError(f"node-config data-path: {exc}") from None
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:  # truncated, bit-flipped, empty
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise NodeDataError(f"node data file {str(path)!r} is not a readable .npz archive ({why}); write it again "
                            "with `fedhv flower export` (or numpy.savez(path, x=..., y=...))") from None


def _check_labels(y: np.ndarray, objective: object, num_classes: tuple[int, ...], where: str) -> None:
    if isinstance(objective, Classification):
        m = len(num_classes)
        if y.ndim != 2 or y.shape[1] != m:
            raise NodeDataError(f"{where}: y has shape {list(y.shape)}, the setting has {m} classification tasks; "
                                f"y must be [samples, {m}] (one class per task)")
        for i, c in enumerate(num_classes):
            lo, hi = int(y[:, i].min()), int(y[:, i].max())
            if lo < 0 or hi >= c:
                raise NodeDataError(f"{where}: task {i} labels span {lo}..{hi}, the task has {c} classes; labels "
                                    f"must be in 0..{c - 1}")
    elif isinstance(objective, MultiLabel):
        need = 1 + max(max(g) for g in objective.groups)
        if y.ndim != 2 or y.shape[1] < need:
            raise NodeDataError(f"{where}: y has shape {list(y.shape)}, the setting's tasks read attribute "
                                f"columns up to {need - 1}; y must be [samples, >= {need}]")
        if not np.isin(y, (0, 1)).all():
            raise NodeDataError(f"{where}: multi-label attributes must be 0 or 1")


def load_node_file(path: str | Path, cfg: RunConfig, client: int, num_clients: int) -> FederatedData:
    """The node's :class:`FederatedData` from its own file, for client ``client`` of ``cfg``.

    Parameters
    ----------
    path : str or Path
        The ``.npz`` file (module docstring).
    cfg : RunConfig
        The run's configuration (benchmark family: normalisation, tasks, objective,
        augmentation).
    client, num_clients : int
        The node's client id and the number of clients: ``parts`` is ``[N, S]`` with
        row ``client = 0 .. S-1`` (the other rows are never read).

    Raises
    ------
    NodeDataError
        Missing or unreadable file, wrong dtypes or shapes, labels outside the tasks'
        classes, or a file written for another benchmark.
    """
    p = Path(path)
    x, y, meta = _read(p)
    where = f"node data file {str(p)!r}"
    bench = cfg.data.benchmark
    if "benchmark" in meta and meta["benchmark"] != bench:
        raise NodeDataError(f"{where} was written for benchmark {meta['benchmark']!r}, the run is {bench!r}; "
                            "serve a file of the run's benchmark")
    if "format" in meta and meta["format"] != str(FORMAT):
        raise NodeDataError(f"{where} has format {meta['format']}, this fedhv reads format {FORMAT}; re-export it")
    if x.dtype != np.uint8 or x.ndim not in (3, 4):
        raise NodeDataError(f"{where}: x is {x.dtype} {list(x.shape)}; it must be uint8 images [samples, H, W] "
                            "or [samples, H, W, C] (raw pixels, 0..255)")
    if not np.issubdtype(y.dtype, np.integer):
        raise NodeDataError(f"{where}: y is {y.dtype}; labels must be integers")
    if len(x) != len(y) or len(x) == 0:
        raise NodeDataError(f"{where}: x has {len(x)} samples and y {len(y)}; both need the same number (>= 1)")
    spec = BUILDERS[bench]
    _check_labels(y, spec.objective, spec.num_classes, where)
    dtype = DTYPES[cfg.dtype]
    parts = torch.zeros((num_clients, len(x)), dtype=torch.int64)
    parts[client] = torch.arange(len(x))
    augment = configured_augment(spec.augment, cfg)
    data = FederatedData(
        task_names=spec.task_names,
        num_classes=spec.num_classes,
        train_x=to_tensor_images(x, spec.mean, spec.std, dtype, cfg.device),
        train_y=torch.from_numpy(y.astype(np.int64)).to(cfg.device),
        parts=parts.to(cfg.device),
        eval_sets={},
        augment=augment if cfg.data.augment and augment.active else None,
        objective=spec.objective,
        provenance={"node_file": str(p), "sha256": file_sha256(p), "samples": len(x)},
    )
    return data
