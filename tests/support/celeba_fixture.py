"""Synthetic CelebA folders in the exact layout of the real data set (which may not be
redistributed): 178x218 JPEGs, attribute and partition lists as txt or csv."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from fedhv.data.celeba import ATTRIBUTES


def make_celeba(root: Path, n: int = 120, csv: bool = False, seed: int = 0,
                identities: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Write ``n`` images (70 % train, 15 % val, 15 % test) under ``root``; return (attrs, splits).

    ``identities > 0``: also ``Anno/identity_CelebA.txt`` assigning the images to that many celebrities
    with unequal counts (identity ``k`` drawn with probability ``∝ 1 / (k + 1)``).
    """
    rng = np.random.default_rng(seed)
    (root / "img_align_celeba").mkdir(parents=True)
    attrs = np.where(rng.random((n, 40)) < 0.4, 1, -1)
    splits = np.array([0] * int(0.7 * n) + [1] * int(0.15 * n) + [2] * (n - int(0.7 * n) - int(0.15 * n)))
    rng.shuffle(splits)
    names = [f"{i + 1:06d}.jpg" for i in range(n)]
    for i, name in enumerate(names):
        base = rng.integers(0, 256, (1, 1, 3))
        img = np.clip(base + rng.integers(-40, 40, (218, 178, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(root / "img_align_celeba" / name, quality=90)
    if csv:
        rows = ["image_id," + ",".join(ATTRIBUTES)] + [
            f"{name}," + ",".join(str(v) for v in attrs[i]) for i, name in enumerate(names)
        ]
        (root / "list_attr_celeba.csv").write_text("\n".join(rows) + "\n")
        (root / "list_eval_partition.csv").write_text(
            "image_id,partition\n" + "".join(f"{name},{s}\n" for name, s in zip(names, splits))
        )
    else:
        rows = [str(n), " ".join(ATTRIBUTES)] + [
            f"{name} " + " ".join(f"{v:2d}" for v in attrs[i]) for i, name in enumerate(names)
        ]
        (root / "list_attr_celeba.txt").write_text("\n".join(rows) + "\n")
        (root / "list_eval_partition.txt").write_text("".join(f"{name} {s}\n" for name, s in zip(names, splits)))
    if identities:
        weights = 1.0 / np.arange(1, identities + 1)
        who = rng.choice(identities, size=n, p=weights / weights.sum()) + 1
        (root / "Anno").mkdir()
        (root / "Anno" / "identity_CelebA.txt").write_text("".join(f"{name} {k}\n" for name, k in zip(names, who)))
    return (attrs > 0).astype(np.int8), splits
