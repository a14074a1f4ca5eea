"""Locating, verifying and downloading source data files.

A data root is chosen by ``--data-dir`` / ``data.root``, else ``$FEDHV_DATA``, else
``~/.cache/fedhv/data``. Each source data set declares its files with the md5 of
their *decompressed* content, so that any equivalent ``.gz`` wrapper (or the raw
file) is accepted and a corrupted file is named in the error.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

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
    return None


def read_bytes(path: Path) -> bytes:
    """File content, transparently gunzipped when the name ends in ``.gz``."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        return path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"cannot read {path}: {exc}; delete it and download or copy it again") from None


def verified_bytes(path: Path, f: SourceFile) -> bytes:
    """Decompressed content of ``path``, checked against the published md5."""
    content = read_bytes(path)
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
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".download-")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=30) as resp:
            shutil.copyfileobj(resp, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


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
