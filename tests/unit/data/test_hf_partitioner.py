"""fedhv's paper partition as a Flower Datasets partitioner: for every preset, a Flower user who puts the
benchmark's label columns in a ``datasets.Dataset``, adds the joint label and partitions with
``FedHVPartitioner`` gets exactly the clients fedhv's own runs use (CelebA5 on a synthetic folder in the
real layout, the data set being user-supplied)."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest

from celeba_fixture import make_celeba
from fedhv.config import load_config, preset_names
from fedhv.data.celeba import ATTRIBUTES, FIRST_LABEL_ATTRIBUTES, GROUPS
from fedhv.data.configured import load_data, partition_sizes
from fedhv.errors import ConfigError
from fedhv.flower.partitioner import FedHVPartitioner, add_joint_label


def _strata_columns(rule: str, names: list[str], celeba: bool) -> list[str]:
    """The label columns whose joint label makes a preset's strata (docs/flower.md, "fedhv's partition")."""
    if not celeba:
        return names[:1] if rule == "first-label" else names
    if rule == "first-label":
        return [ATTRIBUTES[a] for a in FIRST_LABEL_ATTRIBUTES]
    assert rule == "all-attributes"
    return [ATTRIBUTES[a] for a in sorted({a for g in GROUPS for a in g})]


#: Every preset on the paper's Dirichlet rule (celeba5-identity is a natural federation, no Dirichlet draw).
DIRICHLET = sorted(s for s in preset_names() if load_config(s).partition.by == "dirichlet")


@pytest.mark.parametrize("setting", DIRICHLET)
def test_the_partitioner_gives_every_presets_clients(setting: str, tmp_path: Path, data_root: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    over = [f"data.root={str(data_root)!r}"]
    if setting.startswith("celeba5"):  # 62 synthetic training images: smaller clients, the preset's rule
        make_celeba(tmp_path / "celeba", n=90)
        over = [f"data.root={str(tmp_path)!r}", "partition.samples_per_client=20", "train.batch_size=10"]
        monkeypatch.setenv("FEDHV_CACHE", str(tmp_path / "cache"))
    cfg = load_config(setting, tuple(over))
    bench, parts = load_data(cfg)
    celeba = setting.startswith("celeba5")
    names = list(ATTRIBUTES) if celeba else list(bench.task_names)
    ds = datasets.Dataset.from_dict({name: bench.train_y[:, i].astype(np.int64) for i, name in enumerate(names)})
    ds = add_joint_label(ds, _strata_columns(cfg.partition.strata, names, celeba))
    assert np.array_equal(np.asarray(ds["joint_label"]), bench.strata(cfg.partition.strata))
    p = cfg.partition
    part = FedHVPartitioner(p.clients, "joint_label", partition_sizes(cfg, len(ds)), p.alpha, p.seed)
    part.dataset = ds.add_column("row", np.arange(len(ds)))
    assert part.num_partitions == p.clients == len(parts)
    for c in range(p.clients) if p.clients <= 50 else (0, 1, p.clients // 2, p.clients - 1):
        assert np.array_equal(np.asarray(part.load_partition(c)["row"]), np.asarray(parts[c]))
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(part.partition_rows, parts))


def test_the_joint_label_and_the_partitioner_refuse_what_they_cannot_use() -> None:
    ds = datasets.Dataset.from_dict({"a": [0, 1, 2, 1], "b": [1, 0, 1, 1], "f": [0.5, 1.0, 0.0, 1.0]})
    assert add_joint_label(ds, ["a", "b"])["joint_label"] == [1, 2, 5, 3]  # a * 2 + b
    assert add_joint_label(ds, ["a", "b"], sizes=[3, 4])["joint_label"] == [1, 4, 9, 5]
    for kwargs, names in (({"columns": ["f"]}, "column 'f' holds float64 values"),
                          ({"columns": ["z"]}, "column 'z' is not in the dataset"),
                          ({"columns": ["a"], "sizes": [2]}, "labels in 0..2, outside 0..1"),
                          ({"columns": []}, "columns = [] is empty")):
        with pytest.raises(ConfigError, match=names.replace("[", "\\[").replace("]", "\\]")):
            add_joint_label(ds, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="samples_per_client"):
        FedHVPartitioner(3, "a", [5, 5])
    with pytest.raises(ConfigError, match="alpha"):
        FedHVPartitioner(3, "a", 5, alpha=0.0)
    part = FedHVPartitioner(2, "label", 2)
    part.dataset = ds
    with pytest.raises(ConfigError, match="partition_by column 'label' is not in the dataset"):
        part.load_partition(0)
    with pytest.raises(ConfigError, match="outside 0..1"):
        part.load_partition(2)
