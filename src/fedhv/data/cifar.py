"""CIFAR-10 readers: the canonical python batches and image-folder layouts.

Searched under the data root, in order:

1. ``cifar-10-batches-py/`` (``data_batch_1..5``, ``test_batch``), each file checked
   against its published md5;
2. ``cifar-10-python.tar.gz`` (md5-checked, batches read from the archive);
3. an image-folder layout ``train/<class>/*`` + ``test/<class>/*`` (JPEG or PNG) in
   ``cifar10/`` or ``cifar10-jpg/``, or the same layout inside a ``.tar`` in those
   folders (e.g. ``cifar10-jpg/cifar10-jpg.tar``). Classes are the canonical CIFAR-10
   names, whose alphabetical order is the canonical label order; files are read in
   sorted name order.

When nothing is found and downloading is allowed, ``cifar-10-python.tar.gz`` is
downloaded from the canonical address and checked. Decoded image folders are cached
(``FEDHV_CACHE``) under the content fingerprint of the tar / of every image file
(:func:`cifar_source`, digests memoised by size and mtime).
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from fedhv.data.cache import cache_key, cached_arrays
from fedhv.data.files import MAX_IMAGE_BYTES, data_root, open_source, read_source
from fedhv.data.jpeg import decode_rgb
from fedhv.data.provenance import DigestMemo, SourceRecord, fingerprint_of, relative
from fedhv.errors import DataError

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
ARCHIVE = "cifar-10-python.tar.gz"
ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"
URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
BATCH_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
IMAGE_FOLDERS = ("cifar10", "cifar10-jpg")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")

Split = tuple[np.ndarray, np.ndarray]  # images uint8 [n, 32, 32, 3], labels int64 [n]


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _unpickle_batch(content: bytes, origin: str) -> Split:
    try:
        batch = pickle.loads(content, encoding="bytes")
        data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a data error
        raise DataError(f"{origin}: not a CIFAR-10 python batch ({exc})") from None
    return np.ascontiguousarray(data), labels


def _join(batches: list[Split]) -> Split:
    return np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])


def read_python_batches(folder: Path, root: Path | None = None) -> dict[str, Split]:
    """Read ``cifar-10-batches-py/``, verifying every batch file's md5 (``root``: the data root, the
    only place a linked batch may point into; :func:`fedhv.data.files.read_source`)."""
    out: dict[str, list[Split]] = {"train": [], "test": []}
    for name, md5 in BATCH_MD5.items():
        path = folder / name
        if not path.is_file():
            raise DataError(f"{folder}: missing {name}; the folder must hold data_batch_1..5 and test_batch")
        content = read_source(path, root if root is not None else folder)
        if _md5(content) != md5:
            raise DataError(f"checksum mismatch for {path}: md5 {_md5(content)}, expected {md5}; replace the file")
        out["test" if name == "test_batch" else "train"].append(_unpickle_batch(content, str(path)))
    return {k: _join(v) for k, v in out.items()}


def read_python_archive(path: Path, root: Path | None = None) -> dict[str, Split]:
    """Read the batches straight from ``cifar-10-python.tar.gz`` (md5-checked)."""
    content = read_source(path, root)
    if _md5(content) != ARCHIVE_MD5:
        raise DataError(f"checksum mismatch for {path}: md5 {_md5(content)}, expected {ARCHIVE_MD5}; "
                        "delete it and download it again")
    out: dict[str, list[Split]] = {"train": [], "test": []}
    with tarfile.open(fileobj=io.BytesIO(content), mode="r:gz") as tar:
        for name in BATCH_MD5:
            member = tar.extractfile(f"cifar-10-batches-py/{name}")
            if member is None:
                raise DataError(f"{path}: no cifar-10-batches-py/{name} inside")
            out["test" if name == "test_batch" else "train"].append(_unpickle_batch(member.read(), f"{path}:{name}"))
    return {k: _join(v) for k, v in out.items()}


def _decode(blob: bytes, origin: str) -> np.ndarray:
    fast = decode_rgb(blob, 32, 32)  # a 32x32 colour JPEG straight to libjpeg (fedhv.data.jpeg)
    if fast is not None:
        return fast
    try:
        with Image.open(io.BytesIO(blob)) as img:
            arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
    except Exception as exc:  # noqa: BLE001 - PIL raises many types
        raise DataError(f"{origin}: cannot decode image ({exc})") from None
    if arr.shape != (32, 32, 3):
        raise DataError(f"{origin}: expected a 32x32 RGB image, got {arr.shape}")
    return arr


def _from_entries(
    entries: list[tuple[str, str, str]], read: Callable[[tuple[str, str, str]], bytes], origin: str
) -> dict[str, Split]:
    """``entries``: (split, class, name) sorted; ``read(entry) -> bytes``."""
    out: dict[str, Split] = {}
    for split in ("train", "test"):
        rows = [e for e in entries if e[0] == split]
        if not rows:
            raise DataError(f"{origin}: no {split}/<class>/ images found")
        images = np.stack([_decode(read(e), f"{origin}:{'/'.join(e)}") for e in rows])
        labels = np.array([CLASSES.index(e[1]) for e in rows], dtype=np.int64)
        out[split] = (images, labels)
    return out


def _parse_member(name: str) -> tuple[str, str, str] | None:
    parts = Path(name).parts
    for i in range(len(parts) - 2):
        if parts[i] in ("train", "test") and parts[i + 1] in CLASSES and parts[-1].lower().endswith(IMAGE_SUFFIXES):
            return parts[i], parts[i + 1], parts[-1]
    return None


def read_image_tar(path: Path, root: Path | None = None) -> dict[str, Split]:
    """Image-folder layout inside an (uncompressed or compressed) tar archive (each image member
    bounded by :data:`~fedhv.data.files.MAX_IMAGE_BYTES`)."""
    try:
        with open_source(path, root) as fh, tarfile.open(fileobj=fh) as tar:
            members = {}
            for m in tar.getmembers():
                key = _parse_member(m.name) if m.isfile() else None
                if key is not None:
                    if m.size > MAX_IMAGE_BYTES:
                        raise DataError(f"{path}:{m.name} is {m.size:,} bytes, over fedhv's bound of "
                                        f"{MAX_IMAGE_BYTES:,} bytes for one image; this is not a CIFAR-10 image")
                    members[key] = m
            entries = sorted(members)
            return _from_entries(entries, lambda e: tar.extractfile(members[e]).read(), str(path))  # type: ignore[union-attr]
    except tarfile.TarError as exc:
        raise DataError(f"{path}: unreadable tar archive ({exc})") from None


def _folder_entries(folder: Path) -> list[tuple[str, str, str]]:
    return sorted(
        (split, cls, f.name)
        for split in ("train", "test")
        for cls in CLASSES
        if (folder / split / cls).is_dir()
        for f in (folder / split / cls).iterdir()
        if f.name.lower().endswith(IMAGE_SUFFIXES)
    )


def read_image_folder(folder: Path, root: Path | None = None) -> dict[str, Split]:
    """Image-folder layout ``train/<class>/*`` + ``test/<class>/*`` on disk (regular files of at most
    :data:`~fedhv.data.files.MAX_IMAGE_BYTES` each; a link only into ``root``)."""
    entries = _folder_entries(folder)
    inside = root if root is not None else folder
    return _from_entries(entries, lambda e: read_source(folder / e[0] / e[1] / e[2], inside, MAX_IMAGE_BYTES),
                         str(folder))


def _locate(base: Path) -> tuple[str, Path] | None:
    """The first CIFAR-10 layout under ``base``: ``(kind, path)``, kinds batches/archive/folder/tar."""
    if (base / "cifar-10-batches-py").is_dir():
        return "batches", base / "cifar-10-batches-py"
    if (base / ARCHIVE).is_file():
        return "archive", base / ARCHIVE
    for sub in IMAGE_FOLDERS:
        folder = base / sub
        if (folder / "train").is_dir():
            return "folder", folder
        if folder.is_dir():
            tars = sorted(p for p in folder.iterdir() if p.name.endswith((".tar", ".tar.gz", ".tgz")))
            if tars:
                return "tar", tars[0]
    return None


def cifar_source(base: Path, memo: DigestMemo) -> SourceRecord | None:
    """Record of the CIFAR-10 copy :func:`load_cifar10` would read, or ``None`` when there is none.

    The canonical batches and archive are checked against their published md5s; an image
    folder is fingerprinted by the content of every image, a tar by its sha256 (memoised).

    Raises
    ------
    DataError
        When a canonical file is missing from ``cifar-10-batches-py/`` or fails its checksum.
    """
    found = _locate(base)
    if found is None:
        return None
    kind, path = found
    files: list[dict[str, object]] = []
    if kind in ("batches", "archive"):
        expected = BATCH_MD5 if kind == "batches" else {ARCHIVE: ARCHIVE_MD5}
        for name, md5 in expected.items():
            file = path / name if kind == "batches" else path
            if not file.is_file():
                raise DataError(f"{path}: missing {name}; the folder must hold data_batch_1..5 and test_batch")
            facts = memo.file(file, root=base)
            if facts["md5"] != md5:
                raise DataError(f"checksum mismatch for {file}: md5 {facts['md5']}, expected {md5}; replace the file")
            files.append({"path": relative(file, base), "size": facts["size"], "sha256": facts["sha256"],
                          "md5": facts["md5"]})
        identity: tuple[object, ...] = ("CIFAR-10", "canonical")
    elif kind == "folder":
        images = [path / s / c / n for s, c, n in _folder_entries(path)]
        facts = memo.folder(path, images, root=base)
        files.append({"path": relative(path, base), "files": facts["files"], "size": facts["size"],
                      "sha256": facts["sha256"]})
        identity = ("CIFAR-10", "folder", facts["sha256"])
    else:
        facts = memo.file(path, root=base)
        files.append({"path": relative(path, base), "size": facts["size"], "sha256": facts["sha256"]})
        identity = ("CIFAR-10", "tar", facts["sha256"])
    return SourceRecord("CIFAR-10", str(base.resolve()), tuple(files), fingerprint_of(identity))


def _cached(kind: str, digest: str, build: Callable[[], dict[str, Split]]) -> dict[str, Split]:
    arrays = cached_arrays("cifar10", cache_key(kind=kind, digest=digest, version=2), lambda: {
        f"{s}_{k}": v for s, split in build().items() for k, v in zip(("x", "y"), split)
    })
    return {s: (arrays[f"{s}_x"], arrays[f"{s}_y"]) for s in ("train", "test")}


def load_cifar10(root: str | Path | None = None, download: bool = True) -> dict[str, Split]:
    """CIFAR-10 train (50,000) and test (10,000) images ``[n, 32, 32, 3]`` and labels."""
    base = data_root(root)
    found = _locate(base)
    if found is not None:
        kind, path = found
        if kind == "batches":
            return read_python_batches(path, base)
        if kind == "archive":
            return read_python_archive(path, base)
        memo = DigestMemo()
        record = cifar_source(base, memo)
        memo.save()
        assert record is not None
        reader = read_image_folder if kind == "folder" else read_image_tar
        return _cached(kind, record.fingerprint, functools.partial(reader, path, base))
    if download:
        from fedhv.data.files import _download

        target = base / ARCHIVE
        try:
            _download(URL, target)
        except OSError as exc:
            raise DataError(
                f"CIFAR-10 not found under {base} and the download from {URL} failed ({exc}). Put "
                f"cifar-10-batches-py/ or {ARCHIVE} there, or an image folder cifar10/train/<class>/ + "
                "cifar10/test/<class>/ (or a .tar of it in cifar10-jpg/)"
            ) from None
        return read_python_archive(target, base)
    raise DataError(
        f"CIFAR-10 not found under {base}: expected cifar-10-batches-py/, {ARCHIVE}, cifar10/train/<class>/ "
        "image folders or a .tar of them in cifar10-jpg/; or allow downloading (data.download = true)"
    )
