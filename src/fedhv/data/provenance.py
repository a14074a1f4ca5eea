"""Source fingerprints and the digest memo behind them.

A *source record* describes the source files of one data set as found under a data
root: for each file (or image folder) its path relative to the root, its size and a
content digest, plus a short *fingerprint* of the content that identifies the data set
copy. Derived-data cache keys include the fingerprints of every source they were built
from, so a different copy (another ``--data-dir``, an edited image) never reuses arrays
built from the first one.

Hashing 100 MB of archives or 200,000 JPEGs on every run would be slow, so digests are
memoised in ``$FEDHV_CACHE/source-digests.json`` under (absolute path, size, mtime_ns)
-- for a folder, under the sha256 of its listing of (relative path, size, mtime_ns).
A file changed in place gets a new mtime and is hashed again. A file modified within
:data:`RACY_SECONDS` of being hashed is not memoised (its mtime could still repeat with
different content, the "racy clean" case of git), so it is hashed on every use until it
settles. Contents changed without changing size or mtime (deliberately reset with
``touch -d``) are not noticed; delete the memo to force a full re-hash.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhv.data.cache import read_json, write_json
from fedhv.data.files import (
    MAX_IMAGE_BYTES,
    MAX_SOURCE_BYTES,
    cache_root,
    open_source,
    read_source,
    source_error,
)
from fedhv.errors import DataError
from fedhv.safe_io import too_large

MEMO_FILE = "source-digests.json"
RACY_SECONDS = 2.0
_CHUNK = 1 << 20


@dataclass(frozen=True)
class SourceRecord:
    """The source files of one data set under one data root.

    Attributes
    ----------
    dataset : str
        ``"MNIST"``, ``"Fashion-MNIST"``, ``"CIFAR-10"``, ``"CelebA"``.
    root : str
        The absolute data root.
    files : tuple of dict
        ``{"path": relative to root, "size": bytes, "sha256": ..., ...}``; an image
        folder is one entry with ``"files"`` (its image count) and a combined digest.
    fingerprint : str
        16 hex digits of the sha256 of the content identity (canonical file names and
        content digests), independent of where the copy lives and of gzip wrappers.
    warnings : tuple of str
        Facts about the copy a user must know (e.g. a CelebA subset).
    """

    dataset: str
    root: str
    files: tuple[dict[str, Any], ...]
    fingerprint: str
    warnings: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able form for ``environment.json`` and the cache records."""
        return {"dataset": self.dataset, "root": self.root, "files": [dict(f) for f in self.files],
                "fingerprint": self.fingerprint, "warnings": list(self.warnings)}


def fingerprint_of(identity: object) -> str:
    """16 hex digits of the sha256 of ``repr(identity)`` (tuples / strings / ints only)."""
    return hashlib.sha256(repr(identity).encode()).hexdigest()[:16]


def relative(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` when below it, else absolute."""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path.resolve())


class DigestMemo:
    """Digests of source files and image folders, memoised by (path, size, mtime_ns).

    Parameters
    ----------
    path : Path, optional
        The memo file (default ``$FEDHV_CACHE/source-digests.json``). It is read once
        and merged back by :meth:`save`; an unreadable or unwritable memo only costs
        re-hashing.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else cache_root() / MEMO_FILE
        entries = read_json(self.path) or {}
        self._entries: dict[str, dict[str, Any]] = {k: v for k, v in entries.items() if isinstance(v, dict)}
        self._new: dict[str, dict[str, Any]] = {}

    def file(self, path: Path, gunzip: bool = False, root: Path | None = None) -> dict[str, Any]:
        """``{"size", "sha256", "md5"}`` of the file's bytes, plus ``"md5_gunzip"`` (md5 of the
        decompressed content) when ``gunzip``.

        Raises
        ------
        DataError
            When the file cannot be read or (``gunzip``) is not a valid gzip stream, or is
            refused (:func:`fedhv.data.files.read_source`: a FIFO, a device, a link out of
            ``root``, decompressed content over :data:`~fedhv.data.files.MAX_SOURCE_BYTES`).
        """
        st = _stat(path)
        key = str(path.resolve())
        entry = self._entries.get(key)
        wanted = ("sha256", "md5") + (("md5_gunzip",) if gunzip else ())
        if entry and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns \
                and all(k in entry for k in wanted):
            return {k: entry[k] for k in ("size",) + wanted}
        sha, md5 = hashlib.sha256(), hashlib.md5()
        try:
            size = 0
            with open_source(path, root) as fh:  # regular files only, links inside the root only
                for chunk in iter(lambda: fh.read(_CHUNK), b""):
                    sha.update(chunk)
                    md5.update(chunk)
                    size += len(chunk)
                    if size > MAX_SOURCE_BYTES:
                        raise too_large(path, MAX_SOURCE_BYTES)
            new: dict[str, Any] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                   "sha256": sha.hexdigest(), "md5": md5.hexdigest()}
            if gunzip:
                content, size = hashlib.md5(), 0
                with open_source(path, root) as fh, gzip.GzipFile(fileobj=fh, mode="rb") as gz:
                    for chunk in iter(lambda: gz.read(_CHUNK), b""):
                        content.update(chunk)
                        size += len(chunk)
                        if size > MAX_SOURCE_BYTES:
                            raise too_large(path, MAX_SOURCE_BYTES, " decompressed")
                new["md5_gunzip"] = content.hexdigest()
        except (OSError, EOFError, zlib.error) as exc:
            raise source_error(path, exc) from None
        self._remember(key, new, st.st_mtime_ns)
        return {k: new[k] for k in ("size",) + wanted}

    def folder(self, folder: Path, files: list[Path], root: Path | None = None) -> dict[str, Any]:
        """``{"files": count, "size": total bytes, "sha256": combined digest}`` of ``files``.

        The combined digest is the sha256 over the sorted ``relative path NUL sha256(file)``
        lines, so renaming, adding, removing or editing any file changes it.
        """
        stats = [(str(p.relative_to(folder)), _stat(p)) for p in sorted(files)]
        listing = hashlib.sha256("\n".join(f"{r}\0{s.st_size}\0{s.st_mtime_ns}" for r, s in stats).encode())
        key = "dir:" + str(folder.resolve())
        entry = self._entries.get(key)
        if entry and entry.get("listing") == listing.hexdigest():
            return {k: entry[k] for k in ("files", "size", "sha256")}
        combined = hashlib.sha256()
        for rel, _ in stats:
            # Each image bounded by MAX_IMAGE_BYTES; a FIFO, a device or a link out of the root is refused by name.
            digest = hashlib.sha256(read_source(folder / rel, root if root is not None else folder,
                                                MAX_IMAGE_BYTES)).hexdigest()
            combined.update(f"{rel}\0{digest}\n".encode())
        new = {"listing": listing.hexdigest(), "files": len(stats), "size": sum(s.st_size for _, s in stats),
               "sha256": combined.hexdigest()}
        self._remember(key, new, max((s.st_mtime_ns for _, s in stats), default=0))
        return {k: new[k] for k in ("files", "size", "sha256")}

    def _remember(self, key: str, entry: dict[str, Any], mtime_ns: int) -> None:
        if time.time_ns() - mtime_ns > RACY_SECONDS * 1e9:
            self._entries[key] = entry
            self._new[key] = entry

    def save(self) -> None:
        """Merge the new digests into the memo file (atomically; silently skipped when not writable)."""
        if not self._new:
            return
        merged = read_json(self.path) or {}
        merged.update(self._new)
        if write_json(self.path, merged):
            self._new = {}


def _stat(path: Path) -> os.stat_result:
    try:
        return path.stat()
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc}; check the data folder") from None
