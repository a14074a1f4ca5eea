"""Locating, verifying and downloading source data files.

A data root is chosen by ``--data-dir`` / ``data.root``, else ``$FEDHV_DATA``, else
``~/.cache/fedhv/data``. Each source data set declares its files with the md5 of
their *decompressed* content, so that any equivalent ``.gz`` wrapper (or the raw
file) is accepted and a corrupted file is named in the error.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from fedhv import safe_io
from fedhv.errors import DataError

DEFAULT_ROOT = Path("~/.cache/fedhv/data")


def data_root(root: str | os.PathLike[str] | None = None) -> Path:
    """Resolve the data root directory."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get("FEDHV_DATA")
    if env:
        return Path(env).expanduser()
    return DEFAULT_ROOT.expanduser()


def cache_root() -> Path:
    """Directory for derived data (``$FEDHV_CACHE`` or ``~/.cache/fedhv/derived``)."""
    env = os.environ.get("FEDHV_CACHE")
    return Path(env).expanduser() if env else Path("~/.cache/fedhv/derived").expanduser()


@dataclass(frozen=True)
class SourceFile:
    """One source file: its canonical name and the md5 of its decompressed bytes."""

    name: str
    md5: str


@dataclass(frozen=True)
class SourceDataset:
    """A named set of source files found under one of ``folders`` of the data root."""

    name: str
    folders: tuple[str, ...]
    files: tuple[SourceFile, ...]
    mirrors: tuple[str, ...]


def _candidates(folder: Path, name: str) -> list[Path]:
    return [folder / name, folder / f"{name}.gz"]


def find_file(root: Path, ds: SourceDataset, f: SourceFile) -> Path | None:
    """First existing raw or ``.gz`` copy of ``f`` under the data set's folders."""
    for sub in ds.folders:
        for cand in _candidates(root / sub, f.name):
            if cand.is_file():
                return cand
            if os.path.lexists(cand):  # a FIFO, a device, a folder or a broken link: named, not "missing"
                try:
                    what = safe_io.kind_of(cand.stat().st_mode)
                except OSError:
                    what = "a broken symbolic link"
                raise DataError(f"{cand} is {what}, not a regular file; fedhv reads only regular files: replace it "
                                "by the file itself")
    return None


#: Bound on one source file (an archive, an annotation list, an IDX file, also decompressed): the largest
#: canonical one, CIFAR-10's 163 MB archive, with room to spare.
MAX_SOURCE_BYTES = 1 << 30
#: Bound on one image file of an image-folder layout (a CIFAR-10 JPEG is ~1 kB, a CelebA one ~10 kB).
MAX_IMAGE_BYTES = 16 << 20


def source_error(path: Path, exc: BaseException) -> DataError:
    """The one-line :class:`DataError` for a source file fedhv refused or could not read."""
    if isinstance(exc, safe_io.UnsafeFileError):
        return DataError(str(exc))
    return DataError(f"cannot read {path}: {exc}; delete it and download or copy it again")


def read_source(path: Path, root: Path | None, max_bytes: int = MAX_SOURCE_BYTES) -> bytes:
    """The bytes of the regular file ``path`` under the data root ``root``, at most ``max_bytes``.

    A symbolic link is followed only when it resolves inside ``root`` (or its own folder); a
    FIFO, a device, a link out of the root or a larger file is a :class:`DataError` naming
    the file (:mod:`fedhv.safe_io`), never a hang or an unbounded read.
    """
    try:
        return safe_io.read_regular(path, max_bytes, follow=True, root=root if root is not None else path.parent)
    except OSError as exc:
        raise source_error(path, exc) from None


def open_source(path: Path, root: Path | None) -> BinaryIO:
    """``path`` opened for reading under the rules of :func:`read_source` (no size bound: stream it)."""
    try:
        return safe_io.open_regular(path, follow=True, root=root if root is not None else path.parent)
    except OSError as exc:
        raise source_error(path, exc) from None


def read_bytes(path: Path, root: Path | None = None) -> bytes:
    """File content, transparently gunzipped when the name ends in ``.gz`` (both bounded by
    :data:`MAX_SOURCE_BYTES`; see :func:`read_source` for the files refused)."""
    try:
        if path.suffix == ".gz":
            return safe_io.gunzip_regular(path, MAX_SOURCE_BYTES, follow=True,
                                          root=root if root is not None else path.parent)
        return read_source(path, root)
    except (OSError, EOFError, zlib.error) as exc:
        raise source_error(path, exc) from None


def verified_bytes(path: Path, f: SourceFile, root: Path | None = None) -> bytes:
    """Decompressed content of ``path``, checked against the published md5."""
    content = read_bytes(path, root)
    found = hashlib.md5(content).hexdigest()
    if found != f.md5:
        raise checksum_error(path, f, found)
    return content


def checksum_error(path: Path, f: SourceFile, found: str) -> DataError:
    """The error for a file whose decompressed content has md5 ``found`` instead of ``f.md5``."""
    return DataError(
        f"checksum mismatch for {path}: md5 of the decompressed content is {found}, "
        f"expected {f.md5}. The file is corrupted or not the canonical {f.name}; "
        "delete it and download or copy it again"
    )


def _download(url: str, target: Path) -> None:
    """Fetch ``url`` into ``target`` atomically (:func:`fedhv.safe_io.write_atomic`; a link there is replaced)."""
    target.parent.mkdir(parents=True, exist_ok=True)

    def fetch(out: BinaryIO) -> None:
        with urllib.request.urlopen(url, timeout=30) as resp:
            shutil.copyfileobj(resp, out)

    safe_io.write_atomic(target, fetch, replace_link=True)


def ensure_files(root: Path, ds: SourceDataset, download: bool) -> dict[str, Path]:
    """Locate every file of ``ds``; download missing ones when allowed.

    Returns
    -------
    dict
        Canonical file name -> path of the file found or downloaded.

    Raises
    ------
    DataError
        Listing the missing files and where to put them, when they are absent and
        cannot be downloaded.
    """
    found: dict[str, Path] = {}
    missing: list[SourceFile] = []
    for f in ds.files:
        path = find_file(root, ds, f)
        if path is None:
            missing.append(f)
        else:
            found[f.name] = path
    if missing and download:
        folder = root / ds.folders[0]
        errors: list[str] = []
        for f in list(missing):
            target = folder / f"{f.name}.gz"
            for mirror in ds.mirrors:
                try:
                    _download(mirror + f"{f.name}.gz", target)
                    verified_bytes(target, f)
                except (urllib.error.URLError, OSError, TimeoutError) as exc:
                    errors.append(f"{mirror}{f.name}.gz: {exc}")
                    if target.exists() and isinstance(exc, DataError):
                        target.unlink()
                    continue
                found[f.name] = target
                missing.remove(f)
                break
        if missing:
            detail = "; ".join(errors[-2:])
            raise DataError(
                f"{ds.name}: could not download {', '.join(m.name for m in missing)} ({detail}). "
                f"Copy the files (raw or .gz) into {folder}/ or point --data-dir / FEDHV_DATA "
                "at a folder that has them"
            )
    if missing:
        raise DataError(
            f"{ds.name}: missing {', '.join(m.name + '[.gz]' for m in missing)} under {root}. "
            f"Put them in {root / ds.folders[0]}/, point --data-dir / FEDHV_DATA at a folder "
            "that has them, or allow downloading (data.download = true)"
        )
    return found
