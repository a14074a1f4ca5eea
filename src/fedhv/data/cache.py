"""A small on-disk cache for derived arrays (never written next to source data).

Every file is written through :func:`atomic_write`: a temporary file in the target
folder, flushed and ``fsync``'ed, renamed over the target, then the folder is
``fsync``'ed; the temporary file is removed on any failure (also ``KeyboardInterrupt``).
A reader therefore sees the previous or the new file, never a partial one. A cache
file that cannot be read for any reason (truncated ``.npz`` -> ``zipfile.BadZipFile``,
CRC errors, a missing member, ...) is treated as absent and rebuilt.

Concurrent processes (a grid's workers, parallel runs, test workers) sharing one cache
folder build each entry once: :func:`fetch_arrays` builds under an exclusive advisory
lock (``fcntl.flock`` on ``.locks/name-key.npz.lock`` in the cache folder; lock
files are kept, since removing one races with a process waiting on it) and loads again once it holds it, so a
process that waited for another's build loads the result instead of decoding the
sources a second time. The kernel releases the lock when its holder dies (a killed
builder never blocks the others); without ``fcntl`` (Windows) or a writable folder the
build simply runs unlocked.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from fedhv import safe_io
from fedhv.data.files import cache_root


def cache_key(**params: object) -> str:
    """Stable hash of construction parameters (JSON, sorted keys)."""
    blob = json.dumps(params, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write the cache file ``path`` atomically and durably through ``write(fh)``.

    :func:`fedhv.safe_io.write_atomic` with the cache's options: the folder is created, a
    link at ``path`` is replaced (never followed) and the folder is fsync'ed after the rename.

    Raises
    ------
    OSError
        When the folder cannot be created or written (the temporary file is removed), or
        ``path`` is a FIFO, a device or a directory.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    safe_io.write_atomic(path, write, replace_link=True, fsync_dir=True)


def _is_link(path: Path) -> bool:
    """Whether ``path`` is a symbolic link (one warning says it is ignored)."""
    if not os.path.islink(path):
        return False
    warnings.warn(f"{path} is a symbolic link; fedhv never follows links in its cache: it is ignored (and replaced "
                  "by a file when the entry is written)", stacklevel=3)
    return True


def _open_nofollow(path: Path) -> IO[bytes]:
    """``path`` opened for reading with ``O_NOFOLLOW`` (a link planted after the check fails to open)."""
    return safe_io.open_regular(path)  # O_NOFOLLOW, O_NONBLOCK + fstat: a FIFO or a device is refused at once


def load_arrays(path: Path) -> dict[str, np.ndarray] | None:
    """All arrays of the ``.npz`` file ``path``, or ``None`` when it is absent or unreadable.

    A symbolic link is never followed: it counts as absent (with one warning), and the
    rebuilt file replaces the link itself (``os.replace``), never its target.
    """
    if _is_link(path) or not path.is_file():
        return None
    try:
        with _open_nofollow(path) as fh, np.load(fh) as npz:  # our handle: closed even when np.load fails
            return {k: npz[k] for k in npz.files}
    except Exception:  # noqa: BLE001 - BadZipFile, CRC errors, pickle refusals, OSError: all mean "rebuild"
        return None


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> str | None:
    """Save ``arrays`` to ``path`` atomically; return ``None`` or the reason it failed.

    A cache folder that cannot be written only costs a rebuild next time, so an
    ``OSError`` is reported (returned and warned), not raised.
    """
    try:
        atomic_write(path, lambda fh: np.savez(fh, **arrays))  # type: ignore[arg-type]
    except OSError as exc:
        warnings.warn(f"could not write the data cache {path} ({exc}); set FEDHV_CACHE to a writable folder")
        return str(exc)
    return None


@contextlib.contextmanager
def build_lock(path: Path) -> Iterator[bool]:
    """Hold an exclusive advisory lock on ``.locks/<name of path>.lock`` while building ``path``.

    Yields ``True`` when the lock is held, ``False`` when no lock could be taken (no
    ``fcntl``, or a folder that cannot be written): the caller then builds unlocked.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield False
        return
    try:
        locks = path.parent / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        fd = os.open(locks / f"{path.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            warnings.warn(f"{locks / (path.name + '.lock')} is a symbolic link; fedhv never follows links in its "
                          "cache: the entry is built without the lock (remove the link)", stacklevel=2)
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits for another process's build of the same entry
        yield True
    finally:
        os.close(fd)  # closing releases the lock


def fetch_arrays(
    name: str, key: str, build: Callable[[], dict[str, np.ndarray]], enabled: bool = True
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Load ``name-key.npz`` from the cache, or build it, save it and return it.

    Returns
    -------
    arrays : dict
    info : dict
        ``{"file": path, "status": "loaded" | "built" | "built, not saved" | "disabled"}``.
    """
    path = cache_root() / f"{name}-{key}.npz"
    if not enabled:
        return build(), {"file": None, "status": "disabled"}
    arrays = load_arrays(path)
    if arrays is not None:
        return arrays, {"file": str(path), "status": "loaded"}
    with build_lock(path):
        arrays = load_arrays(path)  # another process may have built it while this one waited
        if arrays is not None:
            return arrays, {"file": str(path), "status": "loaded"}
        arrays = build()
        failed = save_arrays(path, arrays)
    return arrays, {"file": str(path), "status": "built" if failed is None else "built, not saved"}


def cached_arrays(
    name: str, key: str, build: Callable[[], dict[str, np.ndarray]], enabled: bool = True
) -> dict[str, np.ndarray]:
    """:func:`fetch_arrays` without the cache information."""
    return fetch_arrays(name, key, build, enabled)[0]


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``, or ``None`` when absent or unreadable."""
    if _is_link(path):
        return None
    try:
        with _open_nofollow(path) as fh:
            value = json.loads(fh.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_json(path: Path, value: dict[str, Any]) -> bool:
    """Write a JSON object with :func:`fedhv.safe_io.write_json` (as :func:`atomic_write`);
    ``False`` (no exception) when the folder is not writable."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        safe_io.write_json(path, value, replace_link=True, fsync_dir=True)
    except OSError:
        return False
    return True
