"""CelebA reader and the CelebA5 benchmark (paper B.1 Table 2; reference notes §1.4).

Layout under the data root (``celeba/`` or the root itself): ``img_align_celeba/``
(``NNNNNN.jpg``, 178x218), ``list_attr_celeba.txt`` (count line, header of the 40
attribute names, one row per image with 1/-1) and ``list_eval_partition.txt``
(``NNNNNN.jpg 0|1|2`` = train/val/test), or the Kaggle CSV variants
``list_attr_celeba.csv`` / ``list_eval_partition.csv``. Images are taken in sorted
file-name order (the reference code's order depends on Python's set hashing).
Each image is resized directly to 32x32 with PIL bilinear interpolation (no crop);
normalisation subtracts the per-channel mean (R 72.392, G 82.909, B 73.158 in
0..255 units) and divides by 255 (no std). Attributes -1 become 0.

CelebA may not be redistributed; fedhv never downloads it. Full-size annotation files
are checked against their published md5 sums; smaller files (e.g. test fixtures) are
read as they are, with a warning.
"""

from __future__ import annotations

import csv
import hashlib
import io
import warnings
from pathlib import Path

import numpy as np
from PIL import Image

from fedhv.data.files import MAX_IMAGE_BYTES, data_root, read_source
from fedhv.data.provenance import DigestMemo, SourceRecord, fingerprint_of, relative
from fedhv.errors import DataError

ATTRIBUTES = (
    "5_o_Clock_Shadow", "Arched_Eyebrows", "Attractive", "Bags_Under_Eyes", "Bald", "Bangs", "Big_Lips", "Big_Nose",
    "Black_Hair", "Blond_Hair", "Blurry", "Brown_Hair", "Bushy_Eyebrows", "Chubby", "Double_Chin", "Eyeglasses",
    "Goatee", "Gray_Hair", "Heavy_Makeup", "High_Cheekbones", "Male", "Mouth_Slightly_Open", "Mustache",
    "Narrow_Eyes", "No_Beard", "Oval_Face", "Pale_Skin", "Pointy_Nose", "Receding_Hairline", "Rosy_Cheeks",
    "Sideburns", "Smiling", "Straight_Hair", "Wavy_Hair", "Wearing_Earrings", "Wearing_Hat", "Wearing_Lipstick",
    "Wearing_Necklace", "Wearing_Necktie", "Young",
)
#: Paper Table 2: the five groups of eight attributes (indices into ATTRIBUTES; the same
#: tuples define the CelebA5 objective in fedhv.data.benchmarks).
GROUPS: tuple[tuple[int, ...], ...] = (
    (0, 9, 3, 15, 22, 33, 25, 29),
    (1, 8, 7, 10, 16, 32, 26, 34),
    (2, 11, 12, 14, 21, 28, 35, 39),
    (4, 6, 13, 18, 19, 20, 30, 31),
    (5, 17, 23, 24, 27, 36, 37, 38),
)
#: Reference code's 'first-label' strata for CelebA: Attractive, Male, Mouth_Slightly_Open.
FIRST_LABEL_ATTRIBUTES = (2, 20, 21)
FULL_ROWS = 202_599
ANNOTATION_MD5 = {
    "list_attr_celeba.txt": "75e246fa4810816ffd6ee81facbd244c",
    "list_eval_partition.txt": "d32c9cbf5e040fd4025c592c306e6668",
}


def _find_root(base: Path) -> Path:
    for cand in (base / "celeba", base / "CelebA", base):
        if (cand / "img_align_celeba").is_dir():
            return cand
    raise DataError(
        f"CelebA not found under {base}: expected img_align_celeba/ with list_attr_celeba.txt and "
        "list_eval_partition.txt (or the .csv variants) in celeba/ or the data root. CelebA cannot be "
        "redistributed or downloaded automatically; obtain it from the MMLAB site and point --data-dir at it"
    )


ANNOTATIONS = ("list_attr_celeba.txt", "list_attr_celeba.csv", "list_eval_partition.txt", "list_eval_partition.csv")


def _subset_warning(path: Path, rows: int) -> str:
    return f"{path} has {rows} images, not the full CelebA's {FULL_ROWS}; using it as it is"


def _text(path: Path, root: Path | None) -> str:
    """UTF-8 text of an annotation file (a regular file under the data root, bounded; ``read_source``)."""
    try:
        return read_source(path, root).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"cannot read {path}: not UTF-8 text ({exc.reason}); replace the file") from None


def _check_md5(path: Path, rows: int, root: Path | None = None) -> None:
    if rows != FULL_ROWS:
        warnings.warn(_subset_warning(path, rows))
        return
    expected = ANNOTATION_MD5.get(path.name)
    if expected is not None:
        found = hashlib.md5(read_source(path, root)).hexdigest()
        if found != expected:
            raise DataError(f"checksum mismatch for {path}: md5 {found}, expected {expected}; replace the file")


def read_attributes(root: Path, data: Path | None = None) -> dict[str, np.ndarray]:
    """``{file name: int8 [40] in {0, 1}}`` from the txt or csv attribute list (``data``: the data root,
    the only place a linked list may point into; default ``root``)."""
    txt, csv_path = root / "list_attr_celeba.txt", root / "list_attr_celeba.csv"
    out: dict[str, np.ndarray] = {}
    if txt.is_file():
        lines = _text(txt, data or root).splitlines()
        header = lines[1].split() if len(lines) > 1 else []
        rows = [ln.split() for ln in lines[2:] if ln.strip()]
        _check_md5(txt, len(rows), data or root)
    elif csv_path.is_file():
        table = list(csv.reader(io.StringIO(_text(csv_path, data or root), newline="")))
        header, rows = table[0][1:], table[1:]
    else:
        raise DataError(f"{root}: missing list_attr_celeba.txt (or list_attr_celeba.csv)")
    if tuple(header) != ATTRIBUTES:
        raise DataError(f"{root}: attribute header does not list the 40 CelebA attributes in the standard order")
    for row in rows:
        if len(row) != 41:
            raise DataError(f"{root}: attribute row for {row[:1]} has {len(row) - 1} values, expected 40")
        out[row[0]] = (np.asarray(row[1:], dtype=np.int64) > 0).astype(np.int8)
    return out


def read_partition(root: Path, data: Path | None = None) -> dict[str, int]:
    """``{file name: 0 train | 1 val | 2 test}``."""
    txt, csv_path = root / "list_eval_partition.txt", root / "list_eval_partition.csv"
    if txt.is_file():
        rows = [ln.split() for ln in _text(txt, data or root).splitlines() if ln.strip()]
        _check_md5(txt, len(rows), data or root)
    elif csv_path.is_file():
        rows = list(csv.reader(io.StringIO(_text(csv_path, data or root), newline="")))[1:]
    else:
        raise DataError(f"{root}: missing list_eval_partition.txt (or list_eval_partition.csv)")
    return {name: int(split) for name, split in rows}


#: CelebA's identity list (``Anno/identity_CelebA.txt``: ``NNNNNN.jpg <identity>`` per line), read from the
#: CelebA folder or its ``Anno/`` sub-folder.
IDENTITY_FILE = "identity_CelebA.txt"


def train_identities(root: str | Path | None = None) -> np.ndarray:
    """The identity of every CelebA training image, in the training split's order (:func:`load_celeba`'s:
    sorted file names with both annotations and partition ``0``).

    Raises
    ------
    DataError
        When ``identity_CelebA.txt`` is missing, unreadable, or lacks a training image.
    """
    top = data_root(root)
    base = _find_root(top)
    path = next((c for c in (base / IDENTITY_FILE, base / "Anno" / IDENTITY_FILE) if c.is_file()), None)
    if path is None:
        raise DataError(f"{base}: no {IDENTITY_FILE} (CelebA's Anno/ folder) next to img_align_celeba/; a partition "
                        "by identity (partition.by = \"identity\", the celeba5-identity preset) needs it")
    identity: dict[str, str] = {}
    for number, line in enumerate(_text(path, top).splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise DataError(f"{path}: line {number} is {line!r}, expected '<image> <identity>'; replace the file")
        identity[fields[0]] = fields[1]
    attrs, parts = read_attributes(base, top), read_partition(base, top)
    chosen = [n for n in sorted(set(attrs) & set(parts)) if parts[n] == 0]
    missing = [n for n in chosen if n not in identity]
    if missing:
        raise DataError(f"{path} names no identity for {len(missing)} training image(s), e.g. {missing[0]}; replace "
                        "the file with CelebA's full identity list")
    values = [identity[n] for n in chosen]
    return np.asarray([int(v) for v in values] if all(v.isdigit() for v in values) else values)


def load_celeba(root: str | Path | None = None, size: int = 32) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """CelebA splits as ``(images uint8 [n, size, size, 3], attributes int8 [n, 40])``."""
    top = data_root(root)
    base = _find_root(top)
    attrs = read_attributes(base, top)
    parts = read_partition(base, top)
    names = sorted(set(attrs) & set(parts))
    if not names:
        raise DataError(f"{base}: no image appears in both the attribute and the partition lists")
    out = {}
    for split, code in (("train", 0), ("val", 1), ("test", 2)):
        chosen = [n for n in names if parts[n] == code]
        images = np.empty((len(chosen), size, size, 3), dtype=np.uint8)
        for i, name in enumerate(chosen):
            path = base / "img_align_celeba" / name
            blob = read_source(path, top, MAX_IMAGE_BYTES)  # a FIFO, a device or a link out of the root: refused
            try:
                with Image.open(io.BytesIO(blob)) as img:
                    images[i] = np.asarray(img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR))
            except (OSError, ValueError) as exc:
                raise DataError(f"{path}: cannot read image ({exc})") from None
        labels = np.stack([attrs[n] for n in chosen]) if chosen else np.zeros((0, 40), np.int8)
        out[split] = (images, labels)
    return out


def celeba_source(base: Path, memo: DigestMemo) -> SourceRecord | None:
    """Record of the CelebA copy under ``base`` (``None`` when there is none).

    Annotation files are hashed (full-size ones checked against their published md5s) and
    the image folder is fingerprinted by the content of every image (memoised). A subset
    (fewer rows than the full CelebA's 202,599 in the partition list) is recorded as a
    warning, so that it reaches ``environment.json`` even when the derived arrays come
    from the cache.

    Raises
    ------
    DataError
        When a full-size annotation file fails its checksum, or a file is unreadable.
    """
    try:
        root = _find_root(base)
    except DataError:
        return None
    files: list[dict[str, object]] = []
    warn: list[str] = []
    partition = next((root / n for n in ANNOTATIONS[2:] if (root / n).is_file()), None)
    rows = None
    if partition is not None:
        lines = [ln for ln in _text(partition, base).splitlines() if ln.strip()]
        rows = len(lines) - (1 if partition.suffix == ".csv" else 0)
        if rows != FULL_ROWS:
            warn.append(_subset_warning(partition, rows))
    identity: list[object] = ["CelebA"]
    for name in ANNOTATIONS:
        path = root / name
        if not path.is_file():
            continue
        facts = memo.file(path, root=base)
        expected = ANNOTATION_MD5.get(name)
        if rows == FULL_ROWS and expected is not None and facts["md5"] != expected:
            raise DataError(f"checksum mismatch for {path}: md5 {facts['md5']}, expected {expected}; replace the file")
        files.append({"path": relative(path, base), "size": facts["size"], "sha256": facts["sha256"]})
        identity.append((name, facts["sha256"]))
    ids = next((c for c in (root / IDENTITY_FILE, root / "Anno" / IDENTITY_FILE) if c.is_file()), None)
    if ids is not None:  # recorded (a partition by identity reads it), not part of the cache key: it makes no array
        facts = memo.file(ids, root=base)
        files.append({"path": relative(ids, base), "size": facts["size"], "sha256": facts["sha256"]})
    images = root / "img_align_celeba"
    facts = memo.folder(images, [p for p in images.iterdir() if p.is_file()], root=base)
    files.append({"path": relative(images, base), "files": facts["files"], "size": facts["size"],
                  "sha256": facts["sha256"]})
    identity.append(("img_align_celeba", facts["sha256"]))
    return SourceRecord("CelebA", str(base.resolve()), tuple(files), fingerprint_of(tuple(identity)), tuple(warn))
