"""Materialise map-style datasets once to tensors.

For :meth:`fedhv.FederatedDataset.from_datasets`; the public names: :mod:`fedhv.api.materialize`.

The engines index one tensor per split, so a ``torch.utils.data.Dataset`` is read item by
item into preallocated tensors, once. A PIL image becomes what
``torchvision.transforms.ToTensor`` makes of it (:func:`pil_to_tensor`: float32 ``[C, H, W]``,
8-bit values divided by 255). Before reading, the memory is estimated from the first item::

    bytes ~ sum over splits of len(split) * (x_0.numel() * x_0.element_size() + 8 * W)

(``W`` = target columns, stored as float64) and compared with ``max_bytes`` (default: half
of the available memory, ``os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2``);
a larger estimate raises :class:`DatasetTooLarge` before anything is allocated.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np
import torch

from fedhv.errors import ConfigError


class DatasetTooLarge(ConfigError):
    """The materialised tensors would not fit in the memory allowed (``max_bytes``)."""


def available_bytes() -> int | None:
    """Available physical memory in bytes (``os.sysconf``), or None where it cannot be read."""
    try:
        pages = os.sysconf("SC_AVPHYS_PAGES")
        size = os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return int(pages) * int(size) if pages > 0 and size > 0 else None


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_budget(need: int, max_bytes: int | None, what: str, fix: str) -> None:
    """Refuse ``need`` bytes over ``max_bytes`` (``None``: half of the available memory) before any allocation.

    A one-line :class:`DatasetTooLarge` naming both, what ``what`` would take and ``fix``.
    """
    limit = max_bytes
    if limit is None:
        avail = available_bytes()
        limit = None if avail is None else avail // 2
    if limit is not None and need > limit:
        raise DatasetTooLarge(
            f"max_bytes = {limit} ({_gib(limit)}{', half of the available memory' if max_bytes is None else ''}) "
            f"is less than the ~{need} bytes ({_gib(need)}) that {what} would take as tensors; {fix}"
        )


def _check_dataset(ds: Any, what: str) -> int:
    if isinstance(ds, torch.utils.data.IterableDataset) or not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
        raise ConfigError(f"{what} has type {type(ds).__name__}, not a map-style dataset; pass a "
                         "torch.utils.data.Dataset with __len__ and __getitem__ (or use from_tensors)")
    n = len(ds)
    if n < 1:
        raise ConfigError(f"{what} is empty (len 0); pass a dataset with at least one item")
    return n


def _is_pil(v: object) -> bool:
    """Whether ``v`` is a PIL image (checked by type, so PIL need not be installed)."""
    return any(c.__module__.startswith("PIL.") and c.__name__ == "Image" for c in type(v).__mro__)


def pil_to_tensor(image: Any) -> torch.Tensor:
    """A PIL image as ``torchvision.transforms.ToTensor`` makes it: float32 ``[C, H, W]``.

    Images of 8-bit modes (``"L"``, ``"RGB"``, ``"RGBA"``, ``"P"`` is converted to ``"RGB"``)
    are scaled to ``[0, 1]`` (``value / 255``); 16- and 32-bit modes (``"I"``, ``"I;16"``,
    ``"F"``) keep their values as float32.
    """
    if image.mode in ("P", "PA", "CMYK", "YCbCr", "LAB", "HSV", "1", "LA"):
        image = image.convert("RGBA" if image.mode in ("PA", "LA") else "RGB" if image.mode != "1" else "L")
    arr = np.array(image)
    t = torch.from_numpy(arr if arr.ndim == 3 else arr[:, :, None]).permute(2, 0, 1).contiguous()
    return t.float().div(255.0) if t.dtype == torch.uint8 else t.float()


def _item(ds: Any, i: int, what: str) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """``(x, y row, client id or None)`` of item ``i``."""
    item = ds[i]
    if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
        raise ConfigError(f"{what}[{i}] is a {type(item).__name__}; items must be (x, y) or (x, y, client_id) "
                         "tuples (wrap the dataset to return them)")
    try:
        if _is_pil(item[0]):
            x = pil_to_tensor(item[0])
        else:
            x = item[0] if isinstance(item[0], torch.Tensor) else torch.as_tensor(np.array(item[0]))
        parts = item[1] if isinstance(item[1], (tuple, list)) else [item[1]]
        y = torch.cat([torch.as_tensor(np.asarray(p, dtype=np.float64)).reshape(-1) for p in parts])
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"{what}[{i}] cannot be read as tensors ({exc}); return x as a tensor, array or "
                         "number and y as numbers or tensors (one per task)") from None
    return x, y, item[2] if len(item) == 3 else None


class _Progress:
    r"""``\r{what}: i/n items`` on stderr, at most every 0.2 s, ending with a newline."""

    def __init__(self, what: str, n: int, enabled: bool) -> None:
        self.what, self.n, self.enabled, self.last = what, n, enabled, 0.0

    def update(self, i: int) -> None:
        now = time.monotonic()
        if self.enabled and (i == self.n or now - self.last >= 0.2):
            self.last = now
            sys.stderr.write(f"\rmaterialising {self.what}: {i}/{self.n} items ({100 * i // self.n} %)")
            if i == self.n:
                sys.stderr.write("\n")
            sys.stderr.flush()


def _read(ds: Any, n: int, first: tuple[torch.Tensor, torch.Tensor, Any], width: int, what: str,
          progress: bool) -> tuple[torch.Tensor, torch.Tensor, np.ndarray | None]:
    x0, _, id0 = first
    xs = torch.empty((n, *x0.shape), dtype=x0.dtype)
    ys = torch.empty((n, width), dtype=torch.float64)
    ids: list[Any] | None = [] if id0 is not None else None
    bar = _Progress(what, n, progress)
    for i in range(n):
        x, y, cid = first if i == 0 else _item(ds, i, what)
        if x.shape != x0.shape:
            raise ConfigError(f"{what}[{i}] has x of shape {tuple(x.shape)} but {what}[0] has {tuple(x0.shape)}; "
                             "give every item the same shape (e.g. a Resize / padding transform)")
        if y.numel() != width:
            raise ConfigError(f"{what}[{i}] has {y.numel()} target values; the tasks need {width} (one per class "
                             "label, per attribute or per regression target, in task order)")
        if (cid is None) != (ids is None):
            raise ConfigError(f"{what}[{i}] has {2 if cid is None else 3} elements but {what}[0] has "
                             f"{2 if ids is None else 3}; return (x, y) or (x, y, client_id) for every item")
        xs[i], ys[i] = x, y
        if ids is not None:
            ids.append(cid.item() if isinstance(cid, torch.Tensor) else cid)
        bar.update(i + 1)
    return xs, ys, None if ids is None else np.asarray(ids)


def materialize(train: Any, test: Any | None, width: int, max_bytes: int | None, progress: bool
                ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray | None, torch.Tensor | None, torch.Tensor | None]:
    """``(x, y, ids, x_test, y_test)`` of ``train`` and ``test`` (see the module docstring).

    Raises
    ------
    DatasetTooLarge
        When the estimate exceeds ``max_bytes``.
    ConfigError
        For a dataset that is not map-style, empty, or has items of another form or shape.
    """
    splits = [("train", train)] + ([("test", test)] if test is not None else [])
    sizes = {what: _check_dataset(ds, what) for what, ds in splits}
    firsts = {what: _item(ds, 0, what) for what, ds in splits}
    need = sum(sizes[w] * (firsts[w][0].numel() * firsts[w][0].element_size() + 8 * width) for w, _ in splits)
    x0 = firsts["train"][0]
    counts = " + ".join(f"{sizes[w]} {w}" for w, _ in splits)
    check_budget(need, max_bytes, f"{counts} items of x {tuple(x0.shape)} {x0.dtype}",
                 "pass a torch.utils.data.Subset, smaller inputs, or a larger max_bytes=")
    out: dict[str, tuple[torch.Tensor, torch.Tensor, np.ndarray | None]] = {
        what: _read(ds, sizes[what], firsts[what], width, what, progress) for what, ds in splits
    }
    x, y, ids = out["train"]
    x_test, y_test = (out["test"][0], out["test"][1]) if "test" in out else (None, None)
    return x, y, ids, x_test, y_test
