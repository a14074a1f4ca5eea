"""Hugging Face datasets in (``FederatedDataset.from_hf``) and fedhv's partition as a Flower Datasets
partitioner: tensors equal to the columns, clients equal to what the partitioner itself hands out, the
paper's partition equal to fedhv's own for every preset, and one-line refusals. All offline."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, NaturalIdPartitioner
from PIL import Image

from fedhv import FederatedDataset, Task
from fedhv.errors import ConfigError


def _images(n: int = 60, color: bool = False, seed: int = 0) -> tuple[datasets.Dataset, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (6, 5, 3) if color else (6, 5)
    pixels = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    features = datasets.Features({"img": datasets.Image(), "digit": datasets.ClassLabel(num_classes=10),
                                  "odd": datasets.Value("int64"), "writer": datasets.Value("string"),
                                  "size": datasets.Value("float32")})
    ds = datasets.Dataset.from_dict({
        "img": [Image.fromarray(p) for p in pixels], "digit": rng.integers(0, 10, n).tolist(),
        "odd": rng.integers(0, 2, n).tolist(), "writer": [f"user_{i % 4 * 5}" for i in range(n)],
        "size": rng.random(n).astype(np.float32).tolist()}, features=features)
    return ds, pixels


@pytest.mark.parametrize("color", [False, True])
def test_columns_become_the_tensors_they_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, color: bool) -> None:
    monkeypatch.setenv("FEDHV_CACHE", str(tmp_path / "cache"))
    ds, pixels = _images(color=color)
    data = FederatedDataset.from_hf(ds, ["digit", "odd", Task("size", "regression", 1)], features="img",
                                    partition=[list(range(30)), list(range(30, 60))], progress=False)
    want = torch.from_numpy(pixels).float() / 255
    want = want.permute(0, 3, 1, 2) if color else want.unsqueeze(1)
    assert torch.equal(data.x, want)
    assert [(t.name, t.kind, t.size) for t in data.tasks] == [("digit", "classification", 10),
                                                               ("odd", "classification", 2), ("size", "regression", 1)]
    assert torch.equal(data.y[:, 0], torch.tensor(ds["digit"], dtype=data.y.dtype))
    assert torch.equal(data.y[:, 1], torch.tensor(ds["odd"], dtype=data.y.dtype))
    np.testing.assert_array_equal(data.y[:, 2].numpy(), np.asarray(ds["size"], dtype=np.float32))
    # the same data through from_tensors: the same dataset, bit for bit
    same = FederatedDataset.from_tensors(want, [torch.tensor(ds["digit"]), torch.tensor(ds["odd"]),
                                                torch.tensor(ds["size"]).reshape(-1, 1)], list(data.tasks),
                                         partition=[list(range(30)), list(range(30, 60))])
    assert same.digest() == data.digest()
    # decoded once: the second call reads fedhv's cache (the cache file exists, the tensors are equal)
    assert list((tmp_path / "cache").glob("hf-img-*.npz"))
    again = FederatedDataset.from_hf(ds, ["digit"], features="img", partition=[list(range(60))], progress=False)
    assert torch.equal(again.x, data.x)


def test_a_partitioner_decides_the_clients() -> None:
    ds, _ = _images()
    data = FederatedDataset.from_hf(ds, ["digit"], features="img", progress=False, partitioner=DirichletPartitioner(
        num_partitions=4, partition_by="digit", alpha=0.5, min_partition_size=0, seed=3))
    fresh = DirichletPartitioner(num_partitions=4, partition_by="digit", alpha=0.5, min_partition_size=0, seed=3)
    fresh.dataset = ds
    for c in range(4):  # client c holds exactly the rows flwr-datasets' own partition c holds
        theirs = fresh.load_partition(c)
        assert data.client_sizes[c] == len(theirs)
        assert sorted(data.y[data.parts[c], 0].long().tolist()) == sorted(theirs["digit"])
    natural = FederatedDataset.from_hf(ds, ["digit"], features="img", progress=False,
                                       partitioner=NaturalIdPartitioner(partition_by="writer"))
    assert sorted(natural.client_ids) == ["user_0", "user_10", "user_15", "user_5"]
    for c, uid in enumerate(natural.client_ids):
        rows = natural.parts[c].tolist()
        assert [ds[i]["writer"] for i in rows] == [uid] * len(rows) and len(rows) == 15
    by_ids = FederatedDataset.from_hf(ds, ["digit"], features="img", partition="ids", ids="writer", progress=False)
    assert by_ids.client_ids == ("user_0", "user_5", "user_10", "user_15")  # natural order of the digit runs


def test_numeric_columns_stack_into_the_input() -> None:
    ds = datasets.Dataset.from_dict({"a": [1.0, 2.0, 3.0, 4.0], "b": [0, 1, 0, 1], "t": [0, 1, 1, 0]})
    data = FederatedDataset.from_hf(ds, ["t"], features=["a", "b"], partition=[[0, 1], [2, 3]])
    assert data.x.tolist() == [[1.0, 0.0], [2.0, 1.0], [3.0, 0.0], [4.0, 1.0]] and data.tasks[0].size == 2


@pytest.mark.parametrize(("call", "names"), [
    (lambda ds: FederatedDataset.from_hf(datasets.DatasetDict({"train": ds, "test": ds}), ["digit"], features="img"),
     "DatasetDict with splits ['test', 'train']; pass one split, e.g. dataset['train']"),
    (lambda ds: FederatedDataset.from_hf(ds, ["digit"], features="image"),
     "features column 'image' is not in the dataset (columns: img, digit, odd, writer, size)"),
    (lambda ds: FederatedDataset.from_hf(ds, ["label"], features="img"), "task 'label''s target column 'label' is not"),
    (lambda ds: FederatedDataset.from_hf(ds, [Task("size", "classification", 3)], features="img"),
     "column 'size' holds float32 values"),
    (lambda ds: FederatedDataset.from_hf(ds, ["writer"], features="img"), "column 'writer' holds <U7 values"),
    (lambda ds: FederatedDataset.from_hf(ds, ["digit"], features="img", partitioner=IidPartitioner(3), clients=3),
     "clients: the partitioner decides the clients"),
    (lambda ds: FederatedDataset.from_hf(ds, ["digit"], features="img", partitioner="iid"),
     "partitioner has type str; pass a flwr_datasets Partitioner"),
    (lambda ds: FederatedDataset.from_hf(ds, ["digit"], features="img", targets={"x": "odd"}),
     "targets names ['x'], which are not tasks"),
    (lambda ds: FederatedDataset.from_hf(ds, ["digit"], features="img", partition="ids", ids="user"),
     "ids column 'user' is not in the dataset"),
])
def test_bad_input_is_one_line_naming_the_column_or_the_fix(call: object, names: str) -> None:
    ds, _ = _images()
    with pytest.raises(ConfigError) as err:
        call(ds)  # type: ignore[operator]
    assert names in str(err.value) and "\n" not in str(err.value)


def test_the_memory_is_estimated_before_any_image_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 52: 40 compressible 2000 x 2000 images (a few KB each) took 5.5 GB as tensors; ``from_hf`` now
    estimates them from the first row, as ``from_datasets`` does, and refuses with ``DatasetTooLarge``."""
    import io

    from fedhv import DatasetTooLarge
    from fedhv.data import hf

    png = io.BytesIO()
    Image.fromarray(np.zeros((2000, 2000, 3), dtype=np.uint8)).save(png, format="PNG")
    ds = datasets.Dataset.from_dict({"img": [{"bytes": png.getvalue(), "path": None}] * 40, "digit": [1] * 40},
                                    features=datasets.Features({"img": datasets.Image(),
                                                                "digit": datasets.ClassLabel(num_classes=2)}))

    def never(*args: object) -> None:
        raise AssertionError("an image was decoded before the memory check")

    monkeypatch.setattr(hf, "_decode_images", never)
    with pytest.raises(DatasetTooLarge) as err:
        FederatedDataset.from_hf(ds, ["digit"], features="img", partition=[list(range(40))], max_bytes=2**30,
                                 test=ds, progress=False)
    message = str(err.value)
    assert "40 images of 2000x2000x3 + 40 images of 2000x2000x3" in message and "max_bytes = 1073741824" in message
    assert "dataset.select" in message and "\n" not in message
    assert hf.estimate_bytes(ds, "img", 1)[0] == 40 * (2000 * 2000 * 3 * hf.IMAGE_BYTES + 8)


def test_a_partitioner_that_already_holds_a_dataset_is_refused() -> None:
    ds, _ = _images()
    used = IidPartitioner(2)
    used.dataset = ds
    with pytest.raises(ConfigError, match="already holds a dataset"):
        FederatedDataset.from_hf(ds, ["digit"], features="img", partitioner=used)


def test_the_image_cache_is_keyed_on_the_pixels_not_on_the_declared_fingerprint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A saved dataset B whose ``state.json`` carries dataset A's fingerprint (anyone who sends a dataset can write
    it) is decoded from its own images, never served A's cached ones (issue 52)."""
    import json

    monkeypatch.setenv("FEDHV_CACHE", str(tmp_path / "cache"))
    a, _ = _images(seed=0)
    b, b_pixels = _images(seed=1)
    a.save_to_disk(str(tmp_path / "a"))
    b.save_to_disk(str(tmp_path / "b"))
    a_state = json.loads((tmp_path / "a" / "state.json").read_text())
    b_state = json.loads((tmp_path / "b" / "state.json").read_text())
    b_state["_fingerprint"] = a_state["_fingerprint"]
    (tmp_path / "b" / "state.json").write_text(json.dumps(b_state))
    a, b = datasets.load_from_disk(str(tmp_path / "a")), datasets.load_from_disk(str(tmp_path / "b"))
    assert a._fingerprint == b._fingerprint  # the sender's word: the same dataset
    FederatedDataset.from_hf(a, ["digit"], features="img", partition=[list(range(60))], progress=False)
    got = FederatedDataset.from_hf(b, ["digit"], features="img", partition=[list(range(60))], progress=False)
    assert torch.equal(got.x, torch.from_numpy(b_pixels).float().div(255).unsqueeze(1))
    assert len(list((tmp_path / "cache").glob("hf-img-*.npz"))) == 2
    # the same pixels under another fingerprint (a re-saved copy, a selection of all rows) share one entry
    FederatedDataset.from_hf(b.select(range(60)), ["digit"], features="img", partition=[list(range(60))],
                             progress=False)
    assert len(list((tmp_path / "cache").glob("hf-img-*.npz"))) == 2
