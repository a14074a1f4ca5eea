"""Derived-data caches follow their sources, survive damage, and runs record data provenance.

Every test uses its own ``FEDHV_CACHE``; corrupted sources are copies in ``tmp_path``
(the shared data folder is never modified).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from celeba_fixture import make_celeba
from fedhv.data.benchmarks import load_benchmark
from fedhv.data.cache import cached_arrays
from fedhv.data.cifar import CLASSES, load_cifar10
from fedhv.errors import DataError

from conftest import REPO, SMALL
from helpers import cli


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FEDHV_CACHE", str(cache))
    return cache


def _cifar_folder(root: Path, seed: int, per_class: int = 2) -> None:
    rng = np.random.default_rng(seed)
    for split in ("train", "test"):
        for cls in CLASSES:
            (root / "cifar10" / split / cls).mkdir(parents=True)
            for k in range(per_class):
                img = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(img).save(root / "cifar10" / split / cls / f"{k:04d}.png")


def _age(folder: Path, seconds: float = 3600) -> None:
    """Backdate every file, as for a data folder that was copied long ago (so its digests are memoised)."""
    old = time.time_ns() - int(seconds * 1e9)
    for p in folder.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(old, old))


def _mnist_copy(tmp_path: Path, data_root: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(data_root / "mnist", root / "mnist")  # copy2 keeps the (old) modification times
    for p in (root / "mnist").iterdir():
        p.chmod(0o644)
    return root


# -- item 7: cache keys follow the source content; damaged or failed cache files ------------------


def test_cifar_mnist_cache_follows_the_cifar_copy(tmp_path: Path, data_root: Path) -> None:
    roots = []
    for seed in (1, 2):
        root = tmp_path / f"copy{seed}"
        _cifar_folder(root, seed)
        (root / "mnist").symlink_to(data_root / "mnist")
        roots.append(root)
    first = load_benchmark("cifar10-mnist", root=str(roots[0]))
    second = load_benchmark("cifar10-mnist", root=str(roots[1]))
    fresh = load_benchmark("cifar10-mnist", root=str(roots[1]), use_cache=False)
    assert not np.array_equal(first.test_x, second.test_x)
    assert np.array_equal(second.test_x, fresh.test_x) and np.array_equal(second.train_x, fresh.train_x)
    fps = [{s["dataset"]: s["fingerprint"] for s in b.provenance["sources"]} for b in (first, second)]
    assert fps[0]["CIFAR-10"] != fps[1]["CIFAR-10"] and fps[0]["MNIST"] == fps[1]["MNIST"]


def test_image_folder_cache_notices_changed_pixels(tmp_path: Path) -> None:
    _cifar_folder(tmp_path, seed=3)
    _age(tmp_path / "cifar10")
    before = load_cifar10(tmp_path, download=False)
    target = tmp_path / "cifar10" / "test" / "cat" / "0001.png"
    new = np.full((32, 32, 3), 7, np.uint8)
    Image.fromarray(new).save(target)  # same name, same folder listing, new content
    after = load_cifar10(tmp_path, download=False)
    idx = CLASSES.index("cat") * 2 + 1
    assert np.array_equal(after["test"][0][idx], new) and not np.array_equal(before["test"][0][idx], new)


def test_truncated_cache_file_is_rebuilt(data_root: Path, _own_cache: Path) -> None:
    first = load_benchmark("multimnist", root=str(data_root))
    (path,) = _own_cache.glob("multimnist-*.npz")
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size // 2)  # np.load would raise zipfile.BadZipFile
    again = load_benchmark("multimnist", root=str(data_root))
    assert np.array_equal(again.train_x, first.train_x) and np.array_equal(again.test_y, first.test_y)
    assert again.provenance["cache"] == {"file": str(path), "status": "built"}
    with np.load(path) as npz:  # the rebuilt file is whole again
        assert np.array_equal(npz["test_y"], first.test_y)


class _Unsaveable:
    def __array__(self, *args: object, **kwargs: object) -> np.ndarray:
        raise RuntimeError("cannot be converted")


def test_failed_cache_write_leaves_no_temporary_file(_own_cache: Path) -> None:
    build = lambda: {"a": np.arange(1000), "b": _Unsaveable()}
    with pytest.raises(RuntimeError, match="cannot be converted"):
        cached_arrays("thing", "k", build)  # type: ignore[arg-type, return-value]
    assert [p for p in _own_cache.iterdir() if p.name != ".locks"] == []  # the build lock's file is kept


# -- item 8: sources are verified with a warm cache; missing sources are announced ---------------


def test_corrupted_source_with_warm_cache_is_an_error(tmp_path: Path, data_root: Path) -> None:
    root = _mnist_copy(tmp_path, data_root)
    load_benchmark("multimnist", root=str(root))
    target = root / "mnist" / "train-labels-idx1-ubyte.gz"
    content = bytearray(gzip.decompress(target.read_bytes()))
    content[100] ^= 0xFF
    target.write_bytes(gzip.compress(bytes(content)))
    with pytest.raises(DataError, match=r"checksum mismatch for .*train-labels-idx1-ubyte\.gz.*a25bea736e30d166"):
        load_benchmark("multimnist", root=str(root))


def test_empty_data_dir_with_warm_cache_says_so(
    tmp_path: Path, data_root: Path, _own_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = load_benchmark("multimnist", root=str(data_root))
    empty = tmp_path / "empty"
    empty.mkdir()
    # The CLI says it in one line.
    proc = cli("partition-stats", "multimnist", "--data-dir", str(empty), env={"FEDHV_CACHE": str(_own_cache)},
               cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "sources missing" in ln]
    assert len(lines) == 1 and f"data: sources missing under {empty}; using the cached derived arrays built from " \
        f"{data_root} (MNIST " in lines[0]
    warm = load_benchmark("multimnist", root=str(empty), download=False)
    assert np.array_equal(warm.train_x, built.train_x)
    prov = warm.provenance
    assert prov["sources_missing"] == ["MNIST"] and prov["cache"]["status"] == "loaded; sources missing"
    assert prov["built_from"]["root"] == str(data_root) and prov["built_from"]["sources"][0]["dataset"] == "MNIST"
    assert prov["warnings"] == [lines[0].removeprefix("warning: ")]
    # Without a cache built from them, missing sources are still an error naming the files.
    monkeypatch.setenv("FEDHV_CACHE", str(tmp_path / "other-cache"))
    with pytest.raises(DataError, match="missing train-images-idx3-ubyte"):
        load_benchmark("multimnist", root=str(empty), download=False)


@pytest.mark.filterwarnings("ignore:.*not the full CelebA")
def test_celeba_subset_warning_is_recorded_on_a_warm_cache(tmp_path: Path) -> None:
    make_celeba(tmp_path / "celeba", n=40)
    cold = load_benchmark("celeba5", root=str(tmp_path))
    with pytest.warns(UserWarning, match="has 40 images, not the full CelebA's 202599"):
        warm = load_benchmark("celeba5", root=str(tmp_path))
    assert (cold.provenance["cache"]["status"], warm.provenance["cache"]["status"]) == ("built", "loaded")
    assert any("not the full CelebA" in w for w in warm.provenance["warnings"])
    assert warm.provenance["samples"] == {"train": 28, "val": 6, "test": 6}
    paths = {f["path"] for f in warm.provenance["sources"][0]["files"]}
    assert {"celeba/list_attr_celeba.txt", "celeba/img_align_celeba"} <= paths


def test_environment_json_records_data_provenance(tmp_path: Path, data_root: Path) -> None:
    from fedhv.config import load_config
    from fedhv.experiment import run_experiment

    cfg = load_config("multimnist", [*SMALL, "rounds=1", "method='uniform'", f"data.root='{data_root}'"])
    run_experiment(cfg, tmp_path / "run", progress=False)
    data = json.loads((tmp_path / "run" / "environment.json").read_text())["data"]
    sums = dict(reversed(ln.split()) for ln in (data_root / "SHA256SUMS").read_text().splitlines())
    files = data["sources"][0]["files"]
    assert data["root"] == str(data_root) and data["benchmark"] == "multimnist"
    assert {f["path"] for f in files} == {k for k in sums if k.startswith("mnist/")}
    assert all(f["sha256"] == sums[f["path"]] for f in files)
    assert data["samples"] == {"train": 48000, "val": 12000, "test": 10000, "test_evaluated": 500}
    assert data["cache"]["status"] in ("built", "loaded") and data["warnings"] == []
