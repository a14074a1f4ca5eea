"""Shared fixtures: the real data root, a per-session derived-data cache, small configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _data_root() -> Path:
    env = os.environ.get("FEDHV_DATA")
    candidates = [Path(env)] if env else []
    candidates += [REPO.parent / "shared" / "data"]
    for c in candidates:
        if (c / "mnist").is_dir():
            return c.resolve()
    raise RuntimeError(
        "tests need the MNIST / Fashion-MNIST files: set FEDHV_DATA to a folder with mnist/ and fashion-mnist/"
    )


DATA_ROOT = _data_root()


@pytest.fixture(scope="session", autouse=True)
def _environment(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["FEDHV_DATA"] = str(DATA_ROOT)
    os.environ.setdefault("FEDHV_CACHE", str(tmp_path_factory.mktemp("fedhv-cache")))


@pytest.fixture(scope="session")
def data_root() -> Path:
    return DATA_ROOT


#: Overrides that shrink a preset to a seconds-long run on real data.
SMALL = [
    "partition.clients=6",
    "partition.samples_per_client=64",
    "train.clients_per_round=4",
    "train.batch_size=16",
    "train.local_steps=3",
    "calibration.rounds=2",
    "data.max_test_samples=500",
    "eval.test_period=1",
]


@pytest.fixture(scope="session")
def flower_deployment(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """One SuperLink and ``NODES`` SuperNodes shared by the Flower test modules (starting one costs
    seconds of process start-up); no process survives it. ``tests/test_flower_faults.py``'s kill test
    kills a SuperNode and therefore runs last (file order, then its position in the module)."""
    from flower_support import NODES, checked_deployment

    with checked_deployment(request, NODES, min_procs=1 + 2 * NODES) as dep:
        yield dep


@pytest.fixture(scope="session")
def small_grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real grid shared by the result-reading tests (read only: damage a copy):
    multimnist x (uniform, fedhv) x seeds 0, 1, three rounds each (SMALL setting)."""
    from fedhv.cli import main

    out = tmp_path_factory.mktemp("grid")
    sets = [a for o in SMALL for a in ("--set", o)]
    assert main(["grid", "multimnist", "--methods", "uniform,fedhv", "--seeds", "0,1", "--rounds", "3",
                 "--out", str(out), "--workers", "1", "--threads", "1", "--quiet", *sets]) == 0
    return out

