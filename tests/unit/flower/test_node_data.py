"""A SuperNode serving data of its own (``--node-config data-path=FILE``, :mod:`fedhv.data.node_file`).

- a node serving the exported file of client K computes exactly (float64, 0.0) what the
  node of built-in partition K computes: reports, FedCMOO gradients and local training;
- the node never reads the benchmark when it has its own data;
- bad files are one-line errors naming the file and the fix;
- ``fedhv flower export`` writes one file per client, as ``flower local --nodes N`` partitions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedhv.config import dumps, load_config, to_dict
from fedhv.data.node_file import NodeDataError, export_partition, load_node_file, node_data_file
from fedhv.experiment.setup import load_data
from fedhv.flower.node import NodeWorker, StageOrder

from conftest import SMALL
from helpers import cli

CFG = [*SMALL, "partition.clients=4", 'dtype="float64"', 'engine="sequential"']


def _text() -> str:
    return dumps(to_dict(load_config("multimnist", CFG)))


@pytest.mark.needs_data
def test_own_file_node_equals_builtin_partition_node(tmp_path: Path) -> None:
    text = _text()
    cfg = load_config("multimnist", CFG)
    path = export_partition(cfg, 2, tmp_path / "client-2.npz")
    builtin, own = NodeWorker(text, 2, 4), NodeWorker(text, 2, 4, str(path))
    assert own.provenance["samples"] == cfg.partition.samples_per_client
    theta = torch.cat([p.detach().reshape(-1) for p in builtin.model.parameters()]) * 1.01
    w = np.array([[0.3, 0.7]])
    order = StageOrder(round=3, seed=cfg.seed, stream="train", report="all", gradients=np.eye(2), train=w)
    a, b = builtin.serve(theta, order, None), own.serve(theta, order, None)
    for x, y in ((a.report, b.report), (a.gradients, b.gradients), (a.deltas, b.deltas)):
        assert x is not None and y is not None
        np.testing.assert_array_equal(x, y)
    assert np.abs(a.deltas).max() > 0  # training really moved the model


@pytest.mark.needs_data
def test_own_file_node_never_reads_the_benchmark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config("multimnist", CFG)
    path = export_partition(cfg, 0, tmp_path / "c0.npz")
    # a data root without MNIST and an empty cache: the built-in node cannot load, the own-data node
    # does not need to (the node's own data root: its FEDHV_DATA, never the server's data.root)
    monkeypatch.setenv("FEDHV_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FEDHV_DATA", str(tmp_path / "empty"))
    text = dumps(to_dict(load_config("multimnist", [*CFG, "data.download=false"])))
    node = NodeWorker(text, 0, 4, str(path))
    assert node.data.train_x.shape[0] == cfg.partition.samples_per_client
    with pytest.raises(Exception, match="(?i)mnist"):
        NodeWorker(text, 0, 4)


@pytest.mark.needs_data
def test_exported_file_holds_the_partition_rows_in_order(tmp_path: Path) -> None:
    cfg = load_config("multimnist", CFG)
    bench, parts = load_data(cfg)
    path = export_partition(cfg, 1, tmp_path / "c1.npz")
    with np.load(path) as z:
        np.testing.assert_array_equal(z["x"], bench.train_x[parts[1]])
        np.testing.assert_array_equal(z["y"], bench.train_y[parts[1]])
        assert str(z["benchmark"]) == "multimnist"


def _write(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(("arrays", "match"), [
    ({"x": np.zeros((5, 28, 28), np.uint8)}, "needs arrays 'x'"),
    ({"x": np.zeros((5, 28, 28), np.float32), "y": np.zeros((5, 2), np.int64)}, "must be uint8"),
    ({"x": np.zeros((5, 28, 28), np.uint8), "y": np.zeros((4, 2), np.int64)}, "same number"),
    ({"x": np.zeros((5, 28, 28), np.uint8), "y": np.zeros((5, 3), np.int64)}, r"y must be \[samples, 2\]"),
    ({"x": np.zeros((5, 28, 28), np.uint8), "y": np.full((5, 2), 10)}, "must be in 0..9"),
    ({"x": np.zeros((5, 28, 28), np.uint8), "y": np.zeros((5, 2), np.float32)}, "must be integers"),
    ({"x": np.zeros((5, 28, 28), np.uint8), "y": np.zeros((5, 2), np.int64), "benchmark": np.array("celeba5")},
     "written for benchmark 'celeba5'"),
])
def test_bad_node_files_are_named_errors(tmp_path: Path, arrays: dict[str, np.ndarray], match: str) -> None:
    cfg = load_config("multimnist", CFG)
    path = _write(tmp_path / "bad.npz", **arrays)
    with pytest.raises(NodeDataError, match=match) as info:
        load_node_file(path, cfg, 0, 4)
    assert str(path) in str(info.value)


def test_missing_file_and_wrong_image_size_are_named_errors(tmp_path: Path) -> None:
    with pytest.raises(NodeDataError, match="is not a file"):
        NodeWorker(_text(), 0, 4, str(tmp_path / "nope.npz"))
    path = _write(tmp_path / "big.npz", x=np.zeros((5, 32, 32), np.uint8), y=np.zeros((5, 2), np.int64))
    with pytest.raises(NodeDataError, match=r"images \[1, 32, 32\].*do not fit the multimnist model"):
        NodeWorker(_text(), 0, 4, str(path))


@pytest.mark.needs_data
def test_flower_export_command_writes_one_file_per_node(tmp_path: Path) -> None:
    sets = [x for item in SMALL for x in ("--set", item)]
    res = cli("flower", "export", "multimnist", "--nodes", "3", *sets, "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    cfg = load_config("multimnist", [*SMALL, "partition.clients=3", "train.clients_per_round=3"])
    _, parts = load_data(cfg)
    for k in range(3):
        with np.load(node_data_file(tmp_path, k)) as z:
            assert len(z["x"]) == parts.shape[1]
    with np.load(node_data_file(tmp_path, 2)) as z, np.load(export_partition(cfg, 2, tmp_path / "x.npz")) as ref:
        np.testing.assert_array_equal(z["x"], ref["x"])
    bad = cli("flower", "export", "multimnist", "--nodes", "3", *sets, "--clients", "3", "--out", str(tmp_path))
    assert bad.returncode == 2 and "clients 0..2" in bad.stderr


@pytest.mark.parametrize("damage", ["truncated", "bit-flipped", "empty"])
def test_damaged_node_files_name_the_file_and_the_fix(tmp_path: Path, damage: str) -> None:
    """Issue 28, item 6: before, a damaged archive failed the handshake with ``zipfile.BadZipFile`` /
    ``EOFError`` and no file name or fix."""
    cfg = load_config("multimnist", CFG)
    path = _write(tmp_path / "client-0.npz", x=np.zeros((40, 36, 36), np.uint8), y=np.zeros((40, 2), np.int64))
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "bit-flipped":
        flipped = bytearray(data)
        flipped[len(data) // 3] ^= 0x10
        path.write_bytes(bytes(flipped))
    else:
        path.write_bytes(b"")
    with pytest.raises(NodeDataError, match=r"is not a readable \.npz archive .*fedhv flower export") as info:
        load_node_file(path, cfg, 0, 4)
    assert str(path) in str(info.value)


@pytest.mark.needs_data
def test_a_node_file_smaller_than_the_batch_trains_by_the_small_client_rule(tmp_path: Path) -> None:
    """Issue 28, item 6: a node with fewer samples than the batch was rejected every round; now its
    batches repeat its samples (fedhv.sim.plan's rule, the API's), so it trains and reports."""
    cfg = load_config("multimnist", CFG)
    full = export_partition(cfg, 1, tmp_path / "full.npz")
    with np.load(full) as z:
        x, y = z["x"][:3], z["y"][:3]
    small = _write(tmp_path / "client-1.npz", x=x, y=y, benchmark=np.array("multimnist"), format=np.array(1))
    node = NodeWorker(_text(), 1, 4, str(small))
    assert node.data.parts.shape[-1] == 3 < cfg.train.batch_size
    theta = torch.cat([p.detach().reshape(-1) for p in node.model.parameters()])
    order = StageOrder(round=0, seed=cfg.seed, stream="train", report="all", gradients=None, train=np.array([[0.5, 0.5]]))
    out = node.serve(theta, order, None)
    assert out.deltas is not None and np.isfinite(out.deltas).all() and np.abs(out.deltas).max() > 0
    assert out.report is not None and np.isfinite(out.report).all()
