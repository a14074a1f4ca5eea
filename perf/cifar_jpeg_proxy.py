"""The JPEG proxy of the CIFAR10–MNIST gap (issue 31): re-encode the workplace CIFAR-10 JPEGs once more.

    python perf/cifar_jpeg_proxy.py --data-dir ../shared/data --out /tmp/cifar-q75 --quality keep
    python perf/cifar_jpeg_proxy.py --data-dir ../shared/data --out /tmp/cifar-q50 --quality 50
    FEDHV_DATA=/tmp/cifar-q75 fedhv run cifar10-mnist-b --method uniform --rounds 150

The workplace CIFAR-10 is a JPEG re-encoding (quality ≈ 75, 4:2:0 chroma subsampling; the data
README) of the canonical images, which this machine cannot reach. Encoding it once more shows
how much one more lossy generation moves a run: ``--quality keep`` writes every image again
with its own quantisation tables and subsampling (the same quality), ``--quality 50`` with
libjpeg's quality-50 tables and the same 4:2:0 subsampling. The output is a data root holding
``cifar10/{train,test}/<class>/<name>.jpg`` in the source's names and order (so the partition
and the image–digit pairing are unchanged) and a copy of ``mnist/`` (CIFAR10–MNIST overlays
MNIST digits). Prints the pixel change against the source decode: mean absolute error and PSNR.
"""

from __future__ import annotations

import argparse
import io
import math
import shutil
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image


def reencode(blob: bytes, quality: str) -> tuple[bytes, np.ndarray, np.ndarray]:
    """``(new JPEG, source pixels, new pixels)``."""
    src = Image.open(io.BytesIO(blob))
    src.load()
    out = io.BytesIO()
    if quality == "keep":
        src.save(out, "JPEG", quality="keep", subsampling="keep", qtables="keep")
    else:
        src.save(out, "JPEG", quality=int(quality), subsampling=2)  # 2 = 4:2:0, as the source
    new = np.asarray(Image.open(io.BytesIO(out.getvalue())).convert("RGB"), dtype=np.float64)
    return out.getvalue(), np.asarray(src.convert("RGB"), dtype=np.float64), new


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="data root holding cifar10-jpg/cifar10-jpg.tar and mnist/")
    parser.add_argument("--out", required=True, help="new data root (must not exist)")
    parser.add_argument("--quality", default="keep", help="'keep' (the source's tables) or a libjpeg quality 1-95")
    args = parser.parse_args()
    root, out = Path(args.data_dir), Path(args.out)
    if out.exists():
        raise SystemExit(f"--out {out} exists; give a new folder")
    if args.quality != "keep" and not 1 <= int(args.quality) <= 95:
        raise SystemExit(f"--quality {args.quality}: give 'keep' or 1-95")
    abs_err = sq_err = count = 0.0
    images = 0
    with tarfile.open(root / "cifar10-jpg" / "cifar10-jpg.tar") as tar:
        for member in tar:
            if not (member.isfile() and member.name.lower().endswith(".jpg")):
                continue
            fh = tar.extractfile(member)
            assert fh is not None
            data, before, after = reencode(fh.read(), args.quality)
            target = out / "cifar10" / member.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            diff = after - before
            abs_err += float(np.abs(diff).sum())
            sq_err += float((diff * diff).sum())
            count += diff.size
            images += 1
    shutil.copytree(root / "mnist", out / "mnist")
    mse = sq_err / count
    print(f"{images} images re-encoded at quality {args.quality} into {out}: mean |change| "
          f"{abs_err / count:.3f} of 255, PSNR {10 * math.log10(255 ** 2 / mse):.2f} dB against the source decode")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
