"""``fedhv.data.jpeg``: the direct libjpeg decode equals Pillow's ``Image.open`` path, and every
file it does not handle falls back to it (and from there to the named errors)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedhv.data.cifar import _decode
from fedhv.data.jpeg import decode_rgb, frame_header
from fedhv.errors import DataError


def _pillow(blob: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(blob)) as img:
        return np.asarray(img.convert("RGB"), dtype=np.uint8)


def _encode(arr: np.ndarray, fmt: str = "JPEG", **kw: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt, **kw)
    return buf.getvalue()


def test_workplace_jpegs_decode_as_pillow_does(data_root: Path) -> None:
    """Every 25th image of the workplace CIFAR-10 tar (2,400): same pixels as Image.open."""
    tars = sorted((data_root / "cifar10-jpg").glob("*.tar"))
    if not tars:
        pytest.skip("no CIFAR-10 JPEG tar under FEDHV_DATA")
    checked = 0
    with tarfile.open(tars[0]) as tar:
        for k, member in enumerate(m for m in tar if m.isfile() and m.name.lower().endswith(".jpg")):
            if k % 25:
                continue
            blob = tar.extractfile(member).read()  # type: ignore[union-attr]
            fast = decode_rgb(blob, 32, 32)
            assert fast is not None and np.array_equal(fast, _pillow(blob)), member.name
            checked += 1
    assert checked == 2400


def test_other_files_fall_back_to_pillow() -> None:
    rng = np.random.default_rng(0)
    colour = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    baseline = _encode(colour, quality=90)
    assert frame_header(baseline) == (0xC0, 32, 32, 3)
    assert np.array_equal(decode_rgb(baseline, 32, 32), _pillow(baseline))  # type: ignore[arg-type]
    grey = _encode(colour[..., 0])
    progressive = _encode(colour, progressive=True)
    big = _encode(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    png = _encode(colour, "PNG")
    assert frame_header(grey)[1:] == (32, 32, 1) and frame_header(progressive)[0] == 0xC2  # type: ignore[index]
    for blob in (grey, progressive, big, png, baseline[:200], b"", b"\xff\xd8\xff\xda\x00\x02"):
        assert decode_rgb(blob, 32, 32) is None
    # ... and _decode gives what Pillow gives for them, or the named error
    assert np.array_equal(_decode(grey, "g.jpg"), _pillow(grey))
    assert np.array_equal(_decode(progressive, "p.jpg"), _pillow(progressive))
    assert np.array_equal(_decode(png, "c.png"), colour)
    with pytest.raises(DataError, match=r"big\.jpg: expected a 32x32 RGB image, got \(64, 64, 3\)"):
        _decode(big, "big.jpg")
    with pytest.raises(DataError, match=r"cut\.jpg: cannot decode image"):
        _decode(baseline[:200], "cut.jpg")
