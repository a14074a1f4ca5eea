from __future__ import annotations

import dataclasses
import functools
import gzip
import http.server
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from fedhv.data.benchmarks import load_benchmark, overlay
from fedhv.data.files import ensure_files
from fedhv.data.idx import MNIST, load_mnist, parse_idx
from fedhv.errors import DataError


def test_mnist_reads_and_verifies(data_root: Path) -> None:
    data = load_mnist(data_root, download=False)
    x, y = data["train"]
    assert x.shape == (60000, 28, 28) and x.dtype == np.uint8
    assert y[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert data["test"][1][:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert np.bincount(data["test"][1]).tolist()[:3] == [980, 1135, 1032]


def test_raw_files_are_accepted(tmp_path: Path, data_root: Path) -> None:
    folder = tmp_path / "MNIST" / "raw"
    folder.mkdir(parents=True)
    for f in MNIST.files:
        with gzip.open(data_root / "mnist" / f"{f.name}.gz") as src:
            (folder / f.name).write_bytes(src.read())
    data = load_mnist(tmp_path, download=False)
    assert data["train"][0].shape == (60000, 28, 28)


def test_corrupted_file_is_named_with_digests(tmp_path: Path, data_root: Path) -> None:
    shutil.copytree(data_root / "mnist", tmp_path / "mnist")
    target = tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz"
    with gzip.open(target) as fh:
        content = bytearray(fh.read())
    content[100] ^= 0xFF
    with gzip.open(target, "wb") as fh:
        fh.write(bytes(content))
    with pytest.raises(DataError) as info:
        load_mnist(tmp_path, download=False)
    msg = str(info.value)
    assert "t10k-labels-idx1-ubyte.gz" in msg and "27ae3e4e09519cfbb04c329615203637" in msg
    assert "checksum mismatch" in msg


def test_missing_files_offline_error_names_them(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        load_mnist(tmp_path, download=False)
    msg = str(info.value)
    assert "train-images-idx3-ubyte" in msg and str(tmp_path / "mnist") in msg


def test_download_from_mirror_with_checksum(tmp_path: Path, data_root: Path) -> None:
    """Serve the .gz files on 127.0.0.1 and download them through the real code path."""
    served = tmp_path / "mirror"
    shutil.copytree(data_root / "mnist", served)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        mirror = f"http://127.0.0.1:{server.server_address[1]}/"
        ds = dataclasses.replace(MNIST, mirrors=("http://127.0.0.1:9/unreachable/", mirror))
        root = tmp_path / "root"
        found = ensure_files(root, ds, download=True)
        assert set(found) == {f.name for f in MNIST.files}
        assert all(p.parent == root / "mnist" for p in found.values())
        # A mirror serving a wrong file is rejected and nothing corrupt is left behind.
        (served / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x00"))
        root2 = tmp_path / "root2"
        with pytest.raises(DataError, match="could not download t10k-labels-idx1-ubyte"):
            ensure_files(root2, dataclasses.replace(ds, mirrors=(mirror,)), download=True)
        assert not (root2 / "mnist" / "t10k-labels-idx1-ubyte.gz").exists()
    finally:
        server.shutdown()
        server.server_close()


def test_parse_idx_rejects_truncated() -> None:
    with pytest.raises(DataError, match="header announces"):
        parse_idx(b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02", "x")


def test_overlay_places_max_and_resizes_nearest() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (3, 28, 28), dtype=np.uint8)
    b = rng.integers(0, 256, (3, 28, 28), dtype=np.uint8)
    out = overlay(a, b, canvas=36, shift=6)
    canvas = np.zeros((3, 36, 36), np.uint8)
    canvas[:, :28, :28] = a
    canvas[:, 6:34, 6:34] = np.maximum(canvas[:, 6:34, 6:34], b)
    src = [int(np.floor(i * 36 / 28)) for i in range(28)]
    assert out.shape == (3, 28, 28)
    assert np.array_equal(out, canvas[:, src][:, :, src])


def test_multimnist_splits_and_labels(data_root: Path) -> None:
    bench = load_benchmark("multimnist", root=str(data_root))
    assert (len(bench.train_x), len(bench.val_x), len(bench.test_x)) == (48000, 12000, 10000)
    mnist = load_mnist(data_root, download=False)
    assert np.array_equal(bench.test_y[:, 0], mnist["test"][1])  # left digit = source image
    assert bench.strata("all-label").max() < 100 and len(np.unique(bench.strata("all-label"))) == 100
    assert np.array_equal(bench.strata("first-label"), bench.train_y[:, 0])
    other = load_benchmark("multimnist", root=str(data_root), pair_seed=1)
    assert not np.array_equal(other.test_y[:, 1], bench.test_y[:, 1])
    again = load_benchmark("multimnist", root=str(data_root), use_cache=False)
    assert np.array_equal(again.train_x, bench.train_x) and np.array_equal(again.val_y, bench.val_y)


def test_mnist_fmnist_pairs_are_a_permutation(data_root: Path) -> None:
    bench = load_benchmark("mnist-fmnist", root=str(data_root))
    counts = np.bincount(bench.test_y[:, 1], minlength=10)
    assert counts.tolist() == [1000] * 10  # every Fashion-MNIST test item used exactly once
    assert bench.task_names == ("digit", "fashion")


@pytest.mark.needs_data
def test_federated_data_holds_exactly_the_partitioned_samples_in_order() -> None:
    """``FederatedData.from_benchmark`` converts only the samples some client holds: every client's
    samples (images, labels, order) equal the normalised benchmark samples at its original
    indices, and no sample outside the partition is kept."""
    import torch

    from fedhv.config import load_config
    from fedhv.data.federated import FederatedData, to_tensor_images
    from fedhv.experiment.setup import load_data

    cfg = load_config("multimnist", ["partition.clients=5", "partition.samples_per_client=40", "train.clients_per_round=5"])
    bench, parts = load_data(cfg)
    data = FederatedData.from_benchmark(bench, parts, dtype=torch.float64)
    assert len(data.train_x) == len(np.unique(parts)) < len(bench.train_x) // 100
    assert data.parts.shape == parts.shape and data.parts.dtype == torch.int64
    for c in range(parts.shape[0]):
        want = to_tensor_images(bench.train_x[parts[c]], bench.mean, bench.std, torch.float64, "cpu")
        assert torch.equal(data.train_x[data.parts[c]], want)
        assert torch.equal(data.train_y[data.parts[c]], torch.from_numpy(bench.train_y[parts[c]]))
    # the same partition over all samples keeps them all, unpermuted
    everything = np.arange(len(bench.train_x)).reshape(1, -1)
    full = FederatedData.from_benchmark(bench, everything)
    assert torch.equal(full.parts, torch.from_numpy(everything)) and len(full.train_x) == len(bench.train_x)
