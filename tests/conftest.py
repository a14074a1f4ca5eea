"""Shared fixtures: the real data root, a per-session derived-data cache, small configs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Nothing in the suite may reach a hub: Hugging Face datasets and hub stay offline in every test process.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
#: What the tests share besides fixtures (``helpers``, ``flower_support``, the user benchmarks the
#: tests' runs import by name, e.g. ``bn_benchmark:make_benchmark``): importable as top-level
#: modules here and, through ``PYTHONPATH`` (:func:`_environment`), in every process the tests start.
SUPPORT = Path(__file__).resolve().parent / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))


#: The one reason line of every test skipped for want of the real data (``needs_data``).
NO_DATA = ("needs the real data (MNIST / Fashion-MNIST, CIFAR-10): set FEDHV_DATA to a folder with mnist/ and "
           "fashion-mnist/ (docs/testing.md)")
#: ``FEDHV_REQUIRE_DATA=1`` (CI: ``.ci/run``): no data is an error of the whole run, not a skip.
REQUIRE_DATA = os.environ.get("FEDHV_REQUIRE_DATA", "").strip().lower() not in ("", "0", "false", "no", "off")
#: Tests under ``tests/e2e/`` start real processes (Flower deployments, Ray, grid workers, ``fedhv``
#: commands): they are all ``deploy`` (docs/testing.md, "Tiers").
E2E = Path(__file__).resolve().parent / "e2e"


def _data_root() -> Path | None:
    """``$FEDHV_DATA`` if set, else the workplace copy ``../shared/data``; ``None`` when it holds no ``mnist/``
    (``FEDHV_DATA=/nowhere pytest`` runs the suite as on a machine without the data)."""
    env = os.environ.get("FEDHV_DATA")
    root = Path(env) if env else REPO.parent / "shared" / "data"
    return root.resolve() if (root / "mnist").is_dir() else None


DATA_ROOT = _data_root()


def _one_thread_per_worker() -> None:
    """Under xdist each worker (and every process it starts: CLI runs, Flower's SuperNodes and
    ClientApps, grid workers) computes with one torch / OpenMP thread: the workers already fill
    the cores, and two threads per process on two cores leave OpenMP threads spinning for a core.
    A test that compares a subprocess with an in-process result sees one thread count on both
    sides (the environment is inherited); a run's ``threads`` setting still applies."""
    import torch

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    torch.set_num_threads(1)


def _keep_freed_memory() -> None:
    """The allocator tuning ``fedhv run`` applies (:func:`fedhv._malloc.tune_allocator`), in the
    test process and, through glibc's environment variables, in every process it starts: without
    it glibc hands large freed blocks back to the OS after each step and the next step faults them
    in again (measured on test_engines.py + test_celeba.py, one thread: 4.7 M -> 1.3 M page
    faults, system time 12.8 -> 7.2 s, wall 50.9 -> 45.0 s)."""
    from fedhv._malloc import tune_allocator

    os.environ.setdefault("MALLOC_MMAP_MAX_", "0")
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 30))
    tune_allocator()


@pytest.fixture(scope="session", autouse=True)
def _environment(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Real data, and one derived-data cache per test session: shared by the xdist workers
    (their base folders ``popen-gwN`` sit in one session folder), so the CIFAR-10 JPEGs are
    decoded once per session, not once per worker (``fedhv.data.cache`` locks each build).
    Without the data, ``FEDHV_DATA`` names an empty folder: a test that reads data without
    being marked ``needs_data`` fails with fedhv's own "not found" error instead of reading
    (or downloading into) the user's ``~/.cache/fedhv/data``."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    if DATA_ROOT is None:
        empty = shared / "no-data"
        empty.mkdir(exist_ok=True)
        os.environ["FEDHV_DATA"] = str(empty)
    else:
        os.environ["FEDHV_DATA"] = str(DATA_ROOT)
    # user benchmarks of the tests (bn_benchmark:make_benchmark) import in every process, Flower nodes included
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SUPPORT), os.environ.get("PYTHONPATH", "")) if p)
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        _one_thread_per_worker()
    _keep_freed_memory()
    cache = shared / "fedhv-cache"
    cache.mkdir(exist_ok=True)
    os.environ.setdefault("FEDHV_CACHE", str(cache))


#: Test files by their cost on 2 cores, the heaviest first. With ``--no-loadscope-reorder``
#: (pyproject) the xdist scheduler hands work units out in collection order (one to each
#: worker, then the next to whichever runs dry), so the long Flower deployments start at once
#: instead of being left for the end of the run.
HEAVY_FIRST = ["test_flower.py", "test_flower_faults.py", "test_flower_secagg.py", "test_flower_process_lifetime.py",
               "test_flower_lockdown.py", "test_flower_app.py", "test_flower_process_deaths.py",
               "test_flower_app_deploy.py", "test_flower_cli.py", "test_flower_backend_checks.py", "test_engines.py",
               "test_cifar.py", "test_celeba.py", "test_node_data.py", "test_grid_processes.py", "test_resume.py",
               "test_grid_ray.py", "test_flower_gate.py", "test_code_trust.py", "test_node_trust.py",
               "test_grid_shipments.py"]

#: Files that share a session fixture form one xdist work unit (one worker, so the fixture is
#: built once): the Flower deployment (``test_flower_faults.py``'s SuperNode kill runs after
#: every other user of it, by file order) and the small grid of the result-reading tests.
SHARED_UNITS = {"test_flower.py": "flower_deployment", "test_flower_faults.py": "flower_deployment",
                "test_outputs_format.py": "small_grid", "test_results_robust.py": "small_grid",
                "test_file_safety.py": "small_grid", "test_received_values.py": "small_grid"}


def pytest_configure(config: pytest.Config) -> None:
    """Under ``FEDHV_REQUIRE_DATA=1`` a missing data folder stops the run before any test (exit 4)."""
    if DATA_ROOT is None and REQUIRE_DATA:
        raise pytest.UsageError(f"FEDHV_REQUIRE_DATA is set and no data was found: the suite {NO_DATA}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every test under ``tests/e2e/`` ``deploy`` and every test asking for the ``data_root``
    fixture ``needs_data``; orders the files heaviest first."""
    for item in items:
        if E2E in item.path.parents:
            item.add_marker(pytest.mark.deploy)
        if "data_root" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.needs_data)
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order otherwise


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` with the :data:`SHARED_UNITS` files merged into one unit each
    (any other ``--dist`` mode: xdist's own scheduler)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return SHARED_UNITS.get(scope.rsplit("/", 1)[-1], scope)

    return SharedFixtureScheduling(config, log)  # type: ignore[arg-type]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``needs_data`` test skips without the data, before its fixtures are built: one reason
    line for all of them (``-rs``: ``SKIPPED [n] tests/conftest.py:…``)."""
    if DATA_ROOT is None and item.get_closest_marker("needs_data") is not None:
        pytest.skip(NO_DATA)


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The real data's root; a test asking for it skips without the data (same reason line)."""
    if DATA_ROOT is None:
        pytest.skip(NO_DATA)
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
    seconds of process start-up); no process survives it. ``tests/e2e/flower/test_flower_faults.py``'s kill test
    kills a SuperNode and therefore runs last (file order, then its position in the module). Its nodes'
    operator allows the tests' user benchmarks (``bn_benchmark:make_benchmark``, ``frozen_benchmark:make_benchmark``,
    tests/e2e/flower/test_flower.py)."""
    from flower_support import NODES, checked_deployment

    with checked_deployment(request, NODES, min_procs=1 + 2 * NODES,
                            allow_benchmarks=("bn_benchmark:make_benchmark", "frozen_benchmark:make_benchmark")) as dep:
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

