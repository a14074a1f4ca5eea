"""MNIST / Fashion-MNIST IDX files.

The IDX format (LeCun et al.): a big-endian magic number whose third byte is the
element type (0x08 = uint8) and fourth the number of dimensions, then one
big-endian uint32 per dimension, then the data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedhv.data.files import (
    SourceDataset,
    SourceFile,
    checksum_error,
    data_root,
    ensure_files,
    find_file,
    verified_bytes,
)
from fedhv.data.provenance import DigestMemo, SourceRecord, fingerprint_of, relative
from fedhv.errors import DataError

# md5 of the decompressed canonical files (published with the data sets; shared/data/README.md).
MNIST = SourceDataset(
    name="MNIST",
    folders=("mnist", "MNIST/raw"),
    files=(
        SourceFile("train-images-idx3-ubyte", "6bbc9ace898e44ae57da46a324031adb"),
        SourceFile("train-labels-idx1-ubyte", "a25bea736e30d166cdddb491f175f624"),
        SourceFile("t10k-images-idx3-ubyte", "2646ac647ad5339dbf082846283269ea"),
        SourceFile("t10k-labels-idx1-ubyte", "27ae3e4e09519cfbb04c329615203637"),
    ),
    mirrors=(
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "http://yann.lecun.com/exdb/mnist/",
    ),
)

FASHION_MNIST = SourceDataset(
    name="Fashion-MNIST",
    folders=("fashion-mnist", "FashionMNIST/raw"),
    files=(
        SourceFile("train-images-idx3-ubyte", "f4a8712d7a061bf5bd6d2ca38dc4d50a"),
        SourceFile("train-labels-idx1-ubyte", "9018921c3c673c538a1fc5bad174d6f9"),
        SourceFile("t10k-images-idx3-ubyte", "8181f5470baa50b63fa0f6fddb340f0a"),
        SourceFile("t10k-labels-idx1-ubyte", "15d484375f8d13e6eb1aabb0c3f46965"),
    ),
    mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
)


def parse_idx(content: bytes, origin: str = "IDX data") -> np.ndarray:
    """Parse IDX bytes into a numpy array (uint8 data only).

    Raises
    ------
    DataError
        If the header is malformed or the size does not match the header.
    """
    if len(content) < 4 or content[0] != 0 or content[1] != 0:
        raise DataError(f"{origin}: not an IDX file (bad magic number)")
    if content[2] != 0x08:
        raise DataError(f"{origin}: unsupported IDX element type 0x{content[2]:02x} (expected uint8)")
    ndim = content[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(content[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(shape))
    if len(content) != expected:
        raise DataError(f"{origin}: {len(content)} bytes, header announces {expected}")
    return np.frombuffer(content, dtype=np.uint8, offset=header).reshape(shape)


def load_idx_dataset(
    ds: SourceDataset, root: str | Path | None = None, download: bool = True
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Load the train and test split of an IDX data set, checksum-verified.

    Returns
    -------
    dict
        ``{"train": (images [n, 28, 28] uint8, labels [n] int64), "test": ...}``.
    """
    base = data_root(root)
    paths = ensure_files(base, ds, download)
    arrays: dict[str, np.ndarray] = {}
    for f in ds.files:
        arrays[f.name] = parse_idx(verified_bytes(paths[f.name], f, base), str(paths[f.name]))
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = arrays[f"{prefix}-images-idx3-ubyte"]
        labels = arrays[f"{prefix}-labels-idx1-ubyte"].astype(np.int64)
        if len(images) != len(labels):
            raise DataError(f"{ds.name} {split}: {len(images)} images but {len(labels)} labels")
        out[split] = (images, labels)
    return out


def idx_source(ds: SourceDataset, root: Path, memo: DigestMemo) -> SourceRecord | None:
    """Verify the files of ``ds`` present under ``root``; their record, or ``None`` if any is missing.

    Every present file is checked against its published md5 (of the decompressed
    content), through the digest memo, so a warm derived cache never hides a corrupted
    source.

    Raises
    ------
    DataError
        When a present file is unreadable or its checksum does not match.
    """
    files: list[dict[str, object]] = []
    complete = True
    for f in ds.files:
        path = find_file(root, ds, f)
        if path is None:
            complete = False
            continue
        facts = memo.file(path, gunzip=path.suffix == ".gz", root=root)
        content_md5 = facts.get("md5_gunzip", facts["md5"])
        if content_md5 != f.md5:
            raise checksum_error(path, f, content_md5)
        files.append({"path": relative(path, root), "size": facts["size"], "sha256": facts["sha256"],
                      "md5_content": content_md5})
    if not complete:
        return None
    identity = (ds.name, tuple((f.name, f.md5) for f in ds.files))
    return SourceRecord(ds.name, str(root.resolve()), tuple(files), fingerprint_of(identity))


def load_mnist(root: str | Path | None = None, download: bool = True) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """MNIST train (60,000) and test (10,000) images and labels."""
    return load_idx_dataset(MNIST, root, download)


def load_fashion_mnist(
    root: str | Path | None = None, download: bool = True
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Fashion-MNIST train (60,000) and test (10,000) images and labels."""
    return load_idx_dataset(FASHION_MNIST, root, download)
