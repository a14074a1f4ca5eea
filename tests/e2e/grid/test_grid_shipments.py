"""Shipped run directories of a Ray grid, one driver per grid folder, and a loopback-only local Ray.

- The collector (:class:`fedhv.experiment.grid_ship.Collector`, called directly with crafted
  shipments): a task ships only into its planned run folder (never ``calibration/`` or another
  run's), a late shipment of an older attempt or of an earlier round never replaces newer
  state, a finished run is never overwritten, and the shipment that finishes a run leaves no
  ``checkpoint.pt``.
- A second driver on a grid folder whose driver is running (a real local-pool driver paused
  after round 1) is refused with one line naming the running driver's PID, on both back-ends.
- One local Ray instance for the file, started as ``fedhv grid --backend ray`` starts it
  (:func:`fedhv.experiment.grid_ray._connect`): a real shipped grid run ends clean and records
  its storage mode, ``--storage auto`` records ``shared`` on one machine; the instance's node
  registers as 127.0.0.1 and every socket its processes listen on is a loopback address
  (``/proc/net/tcp`` and ``tcp6`` mapped to the processes' socket inodes).
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedhv.experiment.grid_ship import Collector, ShipError, pack_dir
from listening import is_loopback, listening, process_name

from helpers import from_a_shell

RUN = "multimnist/uniform/s0"
SETS = ["partition.clients=4", "partition.samples_per_client=32", "train.clients_per_round=2",
        "train.local_steps=2", "train.batch_size=16", "calibration.rounds=1", "data.max_test_samples=200",
        "eval.test_period=1", "dtype='float64'", "checkpoint.period=1"]


def _blob(tmp: Path, rounds: int, finished: bool = False) -> bytes:
    """A run directory of ``rounds`` rounds as a task ships it (finished: summary and model, no checkpoint)."""
    run = Path(tempfile.mkdtemp(dir=tmp))
    (run / "config.toml").write_text("rounds = 150\n")
    (run / "rounds.jsonl").write_text("".join(f'{{"round": {t}}}\n' for t in range(1, rounds + 1)))
    (run / "metrics.jsonl").write_text("".join(f'{{"round": {t}, "acc": 0.5}}\n' for t in range(1, rounds + 1)))
    if finished:
        (run / "summary.json").write_text(f'{{"rounds": {rounds}}}\n')
        (run / "model.pt").write_bytes(b"model")
    else:
        (run / "checkpoint.pt").write_bytes(b"checkpoint at %d" % rounds)
    return pack_dir(run)


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n")


def test_a_task_ships_only_into_its_planned_run_folder(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    grid = tmp_path / "grid"
    (grid / "calibration").mkdir(parents=True)
    (grid / "calibration" / "multimnist-abc.json").write_text('{"reference": [1, 1]}\n')
    col = Collector(str(grid), [RUN])
    blob = _blob(tmp_path, 3)
    with caplog.at_level(logging.WARNING, logger="fedhv"):
        for rel in ("calibration", "multimnist/uniform/s1", "multimnist/uniform", "multimnist/uniform/s0/../s1",
                    "../elsewhere", "", "."):
            with pytest.raises(ShipError, match="not the planned run folder"):
                col.store(rel, blob, 1)
            with pytest.raises(ShipError, match="not the planned run folder"):
                col.begin(rel)
    assert sorted(p.relative_to(grid).as_posix() for p in grid.rglob("*")) == [
        "calibration", "calibration/multimnist-abc.json"]  # nothing written, the calibration untouched
    assert not (tmp_path / "elsewhere").exists()
    assert len([r for r in caplog.records if "not the planned run folder" in r.getMessage()]) == 14
    assert len(col.take_refusals()) == 14 and col.take_refusals() == []
    attempt, start = col.begin(RUN)
    assert (attempt, start) == (1, None)
    assert col.store(RUN, blob, attempt) == 3 and _lines(grid / RUN / "rounds.jsonl") == 3


def test_a_late_shipment_of_an_older_attempt_never_replaces_a_newer_one(tmp_path: Path) -> None:
    grid = tmp_path / "grid"
    col = Collector(str(grid), [RUN])
    first, _ = col.begin(RUN)
    assert col.store(RUN, _blob(tmp_path, 5), first) == 5
    second, start = col.begin(RUN)  # the retry after a lost node starts from the driver's copy
    assert second == first + 1 and start is not None
    with tarfile.open(fileobj=io.BytesIO(start)) as tar:
        assert tar.extractfile("rounds.jsonl").read().count(b"\n") == 5  # type: ignore[union-attr]
    assert col.store(RUN, _blob(tmp_path, 40), second) == 40
    with pytest.raises(ShipError, match="attempt 1, but attempt 2 is the newest"):
        col.store(RUN, _blob(tmp_path, 20), first)  # the lost node's worker was still alive
    assert _lines(grid / RUN / "rounds.jsonl") == 40
    assert (grid / RUN / "checkpoint.pt").read_bytes() == b"checkpoint at 40"
    with pytest.raises(ShipError, match="20 rounds after one with 40 rounds from the same attempt 2"):
        col.store(RUN, _blob(tmp_path, 20), second)
    with pytest.raises(ShipError, match="attempt 3, but attempt 2 is the newest"):
        col.store(RUN, _blob(tmp_path, 60), 3)  # an attempt that never began
    with pytest.raises(ShipError, match="is not a run directory"):
        col.store(RUN, b"not a tar", second)
    assert _lines(grid / RUN / "rounds.jsonl") == 40 and _lines(grid / RUN / "metrics.jsonl") == 40
    third = col.register(RUN)  # an attempt writing in place (--storage auto on a node that sees OUT)
    with pytest.raises(ShipError, match="attempt 2, but attempt 3 is the newest"):
        col.store(RUN, _blob(tmp_path, 60), second)
    assert third == 3 and _lines(grid / RUN / "rounds.jsonl") == 40


def test_a_finished_run_is_never_overwritten_and_keeps_no_checkpoint(tmp_path: Path) -> None:
    """The issue's case: rounds.jsonl 150 -> 20 lines and metrics.jsonl emptied by a late shipment."""
    grid = tmp_path / "grid"
    col = Collector(str(grid), [RUN])
    attempt, _ = col.begin(RUN)
    col.store(RUN, _blob(tmp_path, 140), attempt)
    assert (grid / RUN / "checkpoint.pt").exists()
    col.store(RUN, _blob(tmp_path, 150, finished=True), attempt)
    files = sorted(p.name for p in (grid / RUN).iterdir() if not p.name.startswith("."))
    assert files == ["config.toml", "metrics.jsonl", "model.pt", "rounds.jsonl", "summary.json"]  # no checkpoint
    late, _ = col.begin(RUN)  # even the newest attempt: a finished run stays as it is
    for blob in (_blob(tmp_path, 20), _blob(tmp_path, 0), _blob(tmp_path, 150, finished=True)):
        with pytest.raises(ShipError, match="is finished"):
            col.store(RUN, blob, late)
    assert _lines(grid / RUN / "rounds.jsonl") == 150 and _lines(grid / RUN / "metrics.jsonl") == 150
    assert not (grid / RUN / "checkpoint.pt").exists()


def _fedhv(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedhv.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


@pytest.mark.needs_data
def test_a_second_driver_on_a_busy_grid_folder_is_refused_naming_the_first(tmp_path: Path) -> None:
    from fedhv.flower.lifetime import alive, descendants

    out = tmp_path / "grid"
    args = ["grid", "multimnist", "--methods", "uniform", "--seeds", "0", "--rounds", "3", "--quiet",
            *[x for s in SETS for x in ("--set", s)], "--out", str(out)]
    env = {**os.environ, "FEDHV_TEST_PAUSE_AFTER_ROUND": "1"}
    # from a shell's signal state: a test process started in the background passes SIGINT on ignored
    first = subprocess.Popen(from_a_shell([sys.executable, "-m", "fedhv.cli", *args, "--workers", "1", "--threads", "1"]),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and first.poll() is None and not (out / RUN / ".test-paused").exists():
            seen |= descendants(first.pid)
            time.sleep(0.2)
        assert (out / RUN / ".test-paused").exists(), "the first driver's run never paused"
        seen |= descendants(first.pid)
        env.pop("FEDHV_TEST_PAUSE_AFTER_ROUND")
        for backend in (["--workers", "1"], ["--backend", "ray", "--num-cpus", "1"]):
            second = _fedhv(*args, *backend, env=env)
            assert second.returncode == 2, (backend, second.stdout, second.stderr[-2000:])
            assert f"is in use by another fedhv grid driver (PID {first.pid} on " in second.stderr
            assert len(second.stderr.strip().splitlines()) == 1 and "Traceback" not in second.stderr
        assert _lines(out / RUN / "rounds.jsonl") == 1  # the second drivers touched nothing
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    from fedhv.experiment.grid_lock import driver_lock

    with driver_lock(out):  # released when its driver ended
        pass


# --------------------------------------------------------------------------- one local Ray instance


@pytest.fixture(scope="module")
def local_ray() -> Iterator[object]:
    """A local Ray instance of one CPU started as ``fedhv grid --backend ray`` starts one; every
    process it started is gone afterwards (by PID)."""
    ray = pytest.importorskip("ray", reason="the Ray grid needs ray: pip install -e '.[ray]'")
    from fedhv.experiment.grid_ray import RayOptions, _connect
    from fedhv.flower.lifetime import alive, descendants

    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAY_ADDRESS")}
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: socket paths have a limit
    os.environ.pop("RAY_ADDRESS", None)
    before = descendants(os.getpid())
    seen: set[int] = set()
    try:
        assert not ray.is_initialized(), "a Ray instance was already running in this process"
        _connect(ray, RayOptions(num_cpus=1))
        assert ray.is_initialized()
        yield ray
    finally:
        seen = descendants(os.getpid()) - before
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        gone_by = time.monotonic() + 30
        while time.monotonic() < gone_by and any(alive(p) for p in seen):
            time.sleep(0.2)
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def _grid(out: Path, rounds: int) -> tuple[list, list]:
    from fedhv.experiment.grid import plan_grid

    return plan_grid(["multimnist"], ["uniform"], [0], out, [*SETS, f"rounds={rounds}"])


@pytest.mark.needs_data
def test_a_shipped_run_ends_clean_and_each_run_records_its_storage_mode(local_ray: object, tmp_path: Path) -> None:
    from fedhv.experiment.grid_ray import RayOptions, run_grid_ray
    from fedhv.results.collect import find_runs

    for storage, expected in (("ship", "ship"), ("auto", "shared")):
        out = tmp_path / storage
        jobs, cals = _grid(out, 3)
        report = run_grid_ray(jobs, cals, out, RayOptions(num_cpus=1, storage=storage), progress=False)
        assert report.done == [str(out / RUN)] and not report.failed, report.failed
        run = out / RUN
        assert (run / "summary.json").exists() and _lines(run / "rounds.jsonl") == 3
        assert not (run / "checkpoint.pt").exists(), f"{storage}: a finished run keeps a stale checkpoint"
        assert json.loads((run / "grid-job.json").read_text())["storage"] == expected
        runs, unfinished = find_runs(out)
        assert [r.path for r in runs] == [run] and not unfinished


def test_a_local_ray_instance_binds_and_advertises_loopback_only(local_ray: object) -> None:
    ray = local_ray

    @ray.remote  # type: ignore[attr-defined]
    class Probe:
        def pid(self) -> int:
            return os.getpid()

    @ray.remote  # type: ignore[attr-defined]
    def task_pid() -> int:
        return os.getpid()

    actor = Probe.remote()
    worker_pids = {ray.get(actor.pid.remote()), ray.get(task_pid.remote())}  # type: ignore[attr-defined]
    nodes = ray.nodes()  # type: ignore[attr-defined]
    assert [n["NodeManagerAddress"] for n in nodes] == ["127.0.0.1"], nodes
    ray_pids = descendants_of_this_process()
    assert worker_pids <= ray_pids
    sockets = listening(ray_pids)
    names = {process_name(pid) for pid, _, _ in sockets}
    assert len(sockets) >= 5 and {"gcs_server", "raylet"} <= names, sockets  # not vacuous
    exposed = [(pid, process_name(pid), str(addr), port) for pid, addr, port in sockets if not is_loopback(addr)]
    assert not exposed, f"Ray processes listen beyond the loopback: {exposed}"
    ray.kill(actor)  # type: ignore[attr-defined]


def descendants_of_this_process() -> set[int]:
    from fedhv.flower.lifetime import descendants

    return descendants(os.getpid()) | {os.getpid()}  # the driver's own core worker listens too
