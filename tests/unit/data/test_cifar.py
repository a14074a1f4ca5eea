"""CIFAR-10 readers and the CIFAR10-MNIST construction."""

from __future__ import annotations

import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedhv.data.cifar import CLASSES, load_cifar10, read_image_folder, read_image_tar, read_python_batches
from fedhv.data.cifar_mnist import overlay_digits
from fedhv.errors import DataError


def _synthetic_folder(root: Path, per_class: int = 2) -> np.ndarray:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (2, len(CLASSES), per_class, 32, 32, 3), dtype=np.uint8)
    for s, split in enumerate(("train", "test")):
        for c, cls in enumerate(CLASSES):
            (root / split / cls).mkdir(parents=True)
            for k in range(per_class):
                Image.fromarray(images[s, c, k]).save(root / split / cls / f"{k:04d}.png")
    return images


def test_workplace_jpeg_tar(data_root: Path) -> None:
    data = load_cifar10(data_root, download=False)
    x, y = data["train"]
    assert x.shape == (50000, 32, 32, 3) and x.dtype == np.uint8
    assert np.bincount(y).tolist() == [5000] * 10 and np.bincount(data["test"][1]).tolist() == [1000] * 10
    assert y[0] == 0 and y[-1] == 9  # sorted: airplane first, truck last


def test_image_folder_and_tar_layouts(tmp_path: Path) -> None:
    images = _synthetic_folder(tmp_path / "cifar10")
    from_folder = read_image_folder(tmp_path / "cifar10")
    assert np.array_equal(from_folder["train"][0][:2], images[0, 0])  # PNG is lossless
    assert from_folder["test"][1].tolist() == [c for c in range(10) for _ in range(2)]
    tar_path = tmp_path / "cifar10-jpg" / "imgs.tar"
    tar_path.parent.mkdir()
    with tarfile.open(tar_path, "w") as tar:
        tar.add(tmp_path / "cifar10" / "train", arcname="train")
        tar.add(tmp_path / "cifar10" / "test", arcname="test")
    from_tar = read_image_tar(tar_path)
    assert np.array_equal(from_tar["train"][0], from_folder["train"][0])
    # load_cifar10 finds the folder layout under the data root.
    assert np.array_equal(load_cifar10(tmp_path, download=False)["test"][0], from_folder["test"][0])


def test_python_batches_are_checksummed(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batch = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [1, 2]}
    for name in ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"]:
        (folder / name).write_bytes(pickle.dumps(batch))
    with pytest.raises(DataError, match=r"checksum mismatch for .*data_batch_1"):
        read_python_batches(folder)


def test_missing_cifar_offline(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="CIFAR-10 not found"):
        load_cifar10(tmp_path, download=False)


def test_overlay_matches_pil_paste() -> None:
    rng = np.random.default_rng(1)
    cifar = rng.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    digits = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    digits[digits < 128] = 0  # background
    ours = overlay_digits(cifar, digits)
    for i in range(5):
        img = Image.fromarray(cifar[i])
        mask = Image.fromarray(np.where(digits[i] > 0, 156, 0).astype(np.uint8))
        img.paste(Image.fromarray(digits[i]).convert("RGB"), (2, 2), mask)
        assert np.array_equal(ours[i], np.asarray(img))
    untouched = np.ones((32, 32), bool)
    untouched[2:30, 2:30] = digits[0] == 0
    assert np.array_equal(ours[0][untouched], cifar[0][untouched])


def test_cifar_mnist_benchmark(data_root: Path) -> None:
    from fedhv.data.benchmarks import load_benchmark
    from fedhv.data.idx import load_mnist

    bench = load_benchmark("cifar10-mnist", root=str(data_root))
    assert (len(bench.train_x), len(bench.val_x), len(bench.test_x)) == (40000, 10000, 10000)
    assert bench.train_x.shape[1:] == (32, 32, 3) and bench.task_names == ("cifar", "digit")
    assert np.array_equal(bench.test_y[:, 1], load_mnist(data_root, download=False)["test"][1])
    assert bench.augment.flip_prob == 0.4 and bench.augment.integer_angles
    assert len(np.unique(bench.strata("all-label"))) == 100
