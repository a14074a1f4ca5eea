"""A natural federation: CelebA's celebrities (``identity_CelebA.txt``) with at least ``min_identity_images``
training images grouped into clients (``partition.by = "identity"``, the ``celeba5-identity`` preset), on a
synthetic CelebA folder in the real layout; the grouping rule's properties on its own."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from celeba_fixture import make_celeba
from fedhv.config import load_config
from fedhv.data.celeba import read_attributes, read_partition
from fedhv.data.configured import load_data
from fedhv.data.partition import identity_partition
from fedhv.errors import ConfigError, DataError


def test_identities_are_dealt_whole_into_clients_of_equal_identity_counts() -> None:
    rng = np.random.default_rng(0)
    groups = rng.choice([f"id{k}" for k in range(40)], size=500, p=np.r_[np.full(30, 0.03), np.full(10, 0.01)])
    counts = Counter(groups.tolist())
    parts = identity_partition(groups, 6, 8, seed=10)
    kept = {g for g, c in counts.items() if c >= 8}
    owners: dict[str, set[int]] = {}
    for c, rows in enumerate(parts):
        assert np.all(np.diff(rows) > 0)  # sorted, no repeats
        for g in set(groups[rows].tolist()):
            owners.setdefault(g, set()).add(c)
    assert set(owners) == kept and all(len(o) == 1 for o in owners.values())  # each identity in one client
    rows = np.concatenate(parts)
    assert sorted(rows.tolist()) == [i for i, g in enumerate(groups) if g in kept]  # every kept sample, once
    per_client = [len(set(groups[r].tolist())) for r in parts]
    assert max(per_client) - min(per_client) <= 1 and sum(per_client) == len(kept)
    again = identity_partition(groups, 6, 8, seed=10)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = identity_partition(groups, 6, 8, seed=11)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))
    with pytest.raises(ConfigError, match="partition.clients = 50 but only"):
        identity_partition(groups, 50, 8, seed=10)


def test_the_celeba_identity_preset_partitions_a_celeba_folder_by_celebrity(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDHV_CACHE", str(tmp_path / "cache"))
    make_celeba(tmp_path / "celeba", n=150, identities=12)
    cfg = load_config("celeba5-identity", (f"data.root={str(tmp_path)!r}", "partition.clients=4",
                                           "partition.min_identity_images=3", "train.clients_per_round=2"))
    bench, parts = load_data(cfg)
    # the identities of the training images, read here from the files themselves
    base = tmp_path / "celeba"
    attrs, split = read_attributes(base), read_partition(base)
    train = [n for n in sorted(set(attrs) & set(split)) if split[n] == 0]
    who = dict(line.split() for line in (base / "Anno" / "identity_CelebA.txt").read_text().splitlines())
    ids = np.asarray([who[n] for n in train])
    assert len(ids) == len(bench.train_y)
    counts = Counter(ids.tolist())
    kept = {g for g, c in counts.items() if c >= 3}
    assert sorted(np.concatenate(parts).tolist()) == [i for i, g in enumerate(ids) if g in kept]
    for rows in parts:  # a client holds whole celebrities
        for g in set(ids[rows].tolist()):
            assert sorted(rows[ids[rows] == g].tolist()) == [i for i, h in enumerate(ids) if h == g]
    assert len(parts) == 4 and cfg.partition.by == "identity"
    # the identity file is recorded with the data's provenance (its digest), beside the annotation lists
    (source,) = [s for s in bench.provenance["sources"] if s["dataset"] == "CelebA"]
    recorded = {f["path"]: f for f in source["files"]}
    import hashlib

    ident = recorded["celeba/Anno/identity_CelebA.txt"]
    assert ident["sha256"] == hashlib.sha256((base / "Anno" / "identity_CelebA.txt").read_bytes()).hexdigest()


def test_a_partition_by_identity_needs_identities(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  data_root: Path) -> None:
    monkeypatch.setenv("FEDHV_CACHE", str(tmp_path / "cache"))
    make_celeba(tmp_path / "celeba", n=60)
    cfg = load_config("celeba5-identity", (f"data.root={str(tmp_path)!r}", "train.clients_per_round=2",
                                           "partition.clients=2"))
    with pytest.raises(DataError, match="no identity_CelebA.txt"):
        load_data(cfg)
    mm = load_config("multimnist", (f"data.root={str(data_root)!r}", 'partition.by="identity"'))
    with pytest.raises(ConfigError, match="multimnist has no natural identities \\(benchmarks with them: celeba5\\)"):
        load_data(mm)
    with pytest.raises(ConfigError, match="partition.by"):
        load_config("multimnist", ('partition.by="writers"',))
