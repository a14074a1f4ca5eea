"""A small on-disk cache for derived arrays (never written next to source data)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Callable

import numpy as np

from fedhv.data.files import cache_root


def cache_key(**params: object) -> str:
    """Stable hash of construction parameters (JSON, sorted keys)."""
    blob = json.dumps(params, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def cached_arrays(
    name: str, key: str, build: Callable[[], dict[str, np.ndarray]], enabled: bool = True
) -> dict[str, np.ndarray]:
    """Load ``name-key.npz`` from the cache, or build, save atomically and return it.

    A cache folder that cannot be written only costs the rebuild next time
    (a warning says so); a damaged cache file is rebuilt.
    """
    path = cache_root() / f"{name}-{key}.npz"
    if enabled and path.is_file():
        try:
            with np.load(path) as npz:
                return {k: npz[k] for k in npz.files}
        except (OSError, ValueError, EOFError):
            pass
    arrays = build()
    if not enabled:
        return arrays
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{name}-", suffix=".npz")
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, path)
    except OSError as exc:
        warnings.warn(f"could not write the data cache {path} ({exc}); set FEDHV_CACHE to a writable folder")
    return arrays
