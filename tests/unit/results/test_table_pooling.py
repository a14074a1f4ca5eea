"""Issue 28, item 5: ``fedhv table`` does not pool different configurations, nor a seed twice.

On the code before this stop two grids of seeds 0, 1 (one with ``train.lr_local = 0.01``) under one
folder gave one cell averaging four runs, seed 0 twice, without a warning.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedhv.results.collect import find_runs, group
from fedhv.results.tables import table1


def _run(root: Path, name: str, seed: int, lr: float | None, acc: float) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    train = f"\n[train]\nclients_per_round = 4\nlr_local = {lr}\n" if lr is not None else "\n[train]\nclients_per_round = 4\n"
    (folder / "config.toml").write_text(f'setting = "multimnist"\nmethod = "fedhv"\nseed = {seed}\ndevice = "cpu"'
                                        + train)
    (folder / "summary.json").write_text(json.dumps({"setting": "multimnist", "method": "fedhv", "seed": seed,
                                                     "tasks": ["L", "R"], "mean_acc": acc, "worst_acc": acc,
                                                     "final_eval_round": None}))


def test_two_grids_with_another_learning_rate_are_two_rows(tmp_path: Path) -> None:
    for seed, acc in ((0, 90.0), (1, 92.0)):
        _run(tmp_path / "a", f"s{seed}", seed, None, acc)
        _run(tmp_path / "b", f"s{seed}", seed, 0.01, acc - 10)
    runs, _ = find_runs(tmp_path)
    cells = group(runs)
    assert sorted(cells) == [("multimnist [train.lr_local=0.01]", None, "fedhv"),
                             ("multimnist [train.lr_local=unset]", None, "fedhv")]
    assert all(sorted(r.seed for r in rs) == [0, 1] for rs in cells.values())
    text = table1(runs).render("markdown") if hasattr(table1(runs), "render") else str(table1(runs))
    assert "train.lr_local=0.01" in text


def test_the_same_seed_twice_in_one_cell_is_refused(tmp_path: Path) -> None:
    _run(tmp_path / "a", "s0", 0, None, 90.0)
    _run(tmp_path / "b", "s0", 0, None, 91.0)
    from fedhv.results.collect import PooledRunsError

    with pytest.raises(PooledRunsError, match=r"are both fedhv seed 0 of multimnist"):
        find_runs(tmp_path)


def test_runs_differing_only_in_machine_keys_stay_one_cell(tmp_path: Path) -> None:
    _run(tmp_path / "a", "s0", 0, None, 90.0)
    _run(tmp_path / "b", "s1", 1, None, 91.0)
    cfg = tmp_path / "b" / "s1" / "config.toml"
    cfg.write_text(cfg.read_text().replace('device = "cpu"', 'device = "cuda"'))
    runs, _ = find_runs(tmp_path)
    assert list(group(runs)) == [("multimnist", None, "fedhv")]
