"""Issue 30: the experiment grid on Ray (``fedhv grid … --backend ray``).

A real two-node Ray cluster on 127.0.0.1 (Ray's ``cluster_utils``: a head node and a worker
node, one CPU each, in a private ``RAY_TMPDIR`` so no other Ray user on the machine joins it,
both registered and listening on the loopback only: :func:`fedhv.experiment.grid_ray.loopback_only`),
a tiny grid (2 settings × 2 methods × 2 seeds, 3 rounds, float64) driven by the ``fedhv grid``
command as its own process:

- runs shipped back to the driver (``--storage ship``); one run pauses after round 1 and the
  worker node is killed by PID (its raylet and every process under it, SIGKILL); the
  grid finishes, the lost runs are retried by Ray and resume from their last shipped
  checkpoint (``resumes.jsonl``), and ``fedhv table`` of the grid equals the local
  ``--workers 1`` grid's to the last digit;
- the same command again skips every run; a shared-filesystem grid writes in place;
- every process of the cluster is gone afterwards (by PID).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray grid needs ray: pip install -e '.[ray]'")

from e2e.flower.test_flower_process_lifetime import _cmdline
from fedhv.experiment.grid_ship import Collector, ShipError, pack_dir, write_members
from fedhv.flower.lifetime import alive, descendants

from helpers import from_a_shell, signal_state

SETS = ["partition.clients=4", "partition.samples_per_client=32", "train.clients_per_round=2",
        "train.local_steps=2", "train.batch_size=16", "calibration.rounds=1", "data.max_test_samples=200",
        "eval.test_period=1", "dtype='float64'", "checkpoint.period=1"]
GRID = ["multimnist", "mnist-fmnist", "--methods", "uniform,fedhv", "--seeds", "0,1", "--rounds", "3", "--quiet",
        *[x for s in SETS for x in ("--set", s)]]
PAUSED = "multimnist/uniform/s1"


def _fedhv(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedhv.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


def test_shipped_files_are_plain_names_only_and_links_are_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("a")
    (run / "rounds.jsonl").write_text("{}\n")
    (run / "checkpoint.pt").write_text("c")
    (run / ".lock").write_text("")
    (run / "link").symlink_to(tmp_path / "elsewhere")
    with tarfile.open(fileobj=io.BytesIO(pack_dir(run))) as tar:
        names = tar.getnames()
    assert sorted(names) == ["checkpoint.pt", "config.toml", "rounds.jsonl"]  # no lock, no link
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as tar:
        info = tarfile.TarInfo("../escape")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ShipError, match="not a plain file name"):
        write_members(evil.getvalue(), tmp_path / "dest")
    assert not (tmp_path / "escape").exists()
    (tmp_path / "dest2").mkdir()
    (tmp_path / "dest2" / "config.toml").symlink_to(tmp_path / "victim")
    with pytest.raises(ShipError, match="symbolic link"):
        write_members(pack_dir(run), tmp_path / "dest2")
    assert not (tmp_path / "victim").exists()
    with pytest.raises(ShipError, match="not the planned run folder"):
        Collector(str(tmp_path / "grid"), ["multimnist/uniform/s0"]).store("../run", pack_dir(run), 1)


def test_ray_flags_are_refused_on_the_local_pool_and_pool_flags_on_ray(tmp_path: Path) -> None:
    res = _fedhv("grid", "multimnist", "--address", "127.0.0.1:1", "--out", str(tmp_path / "g"))
    assert res.returncode == 2 and "--address: only with --backend ray" in res.stderr
    res = _fedhv("grid", "multimnist", "--backend", "ray", "--workers", "2", "--out", str(tmp_path / "g"))
    assert res.returncode == 2 and "--workers / --threads are the local pool's" in res.stderr
    res = _fedhv("grid", "multimnist", "--backend", "ray", "--cpus-per-run", "0", "--out", str(tmp_path / "g"))
    assert res.returncode == 2 and "--cpus-per-run 0.0" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "g").exists()


def _pid_holding(suffix: str) -> int | None:
    """The process with ``…/<suffix>/.lock`` open (the run's writer)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.endswith(f"/{suffix}/.lock"):
                    return int(proc.name)
        except OSError:
            continue
    return None


def _node_pids(node) -> set[int]:
    pids = {info.process.pid for infos in node.all_processes.values() for info in infos if info.process}
    return pids | {d for p in pids for d in descendants(p)}


def _table(folder: Path) -> list[str]:
    """``fedhv table`` as CSV rows, without the wall-clock rows (Table 13's seconds)."""
    res = _fedhv("table", str(folder), "--format", "csv")
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [r for r in res.stdout.splitlines() if not r.split(",")[3].endswith("_s")]
    assert len(rows) > 60 and any(",mean_acc," in r for r in rows)
    return rows


@pytest.mark.needs_data
def test_two_node_ray_grid_survives_a_killed_node_and_equals_the_local_grid(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.cluster_utils import Cluster

    from fedhv.experiment.grid_ray import loopback_only

    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths have a length limit
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    monkeypatch.setenv("FEDHV_TEST_PAUSE_AFTER_ROUND", "1")  # inherited by the cluster's processes only
    monkeypatch.setenv("FEDHV_TEST_PAUSE_RUN", PAUSED)
    # a killed node is declared dead within about a second (Ray's default waits for missed heartbeats
    # much longer; a later driver on this machine could attach to the dead node meanwhile)
    fast_death = {"health_check_period_ms": 300, "health_check_failure_threshold": 3,
                  "health_check_initial_delay_ms": 0, "health_check_timeout_ms": 300}
    with loopback_only():  # both nodes register as 127.0.0.1 and listen on it only
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                "_system_config": fast_death})
        worker = cluster.add_node(num_cpus=1)
    assert [n.node_ip_address for n in cluster.list_all_nodes()] == ["127.0.0.1", "127.0.0.1"]
    assert cluster.address.startswith("127.0.0.1:")
    monkeypatch.delenv("FEDHV_TEST_PAUSE_AFTER_ROUND")
    monkeypatch.delenv("FEDHV_TEST_PAUSE_RUN")
    seen = _node_pids(cluster.head_node) | _node_pids(worker)
    out, local = tmp_path / "ray-grid", tmp_path / "local-grid"
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    driver = None
    try:
        driver = subprocess.Popen([sys.executable, "-m", "fedhv.cli", "grid", *GRID, "--backend", "ray",
                                   "--address", cluster.address, "--storage", "ship", "--out", str(out)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 300
        paused = None
        while time.monotonic() < deadline and driver.poll() is None:
            pid = _pid_holding(PAUSED)
            if pid is not None and _paused(pid):
                paused = pid
                break
            time.sleep(0.2)
        assert paused is not None, "the run never paused after round 1"
        seen |= _node_pids(cluster.head_node) | _node_pids(worker)
        on_worker = paused in _node_pids(worker)
        for pid in sorted(_node_pids(worker)):  # the worker node dies: its raylet and everything under it
            with_suppress_kill(pid)
        if not on_worker:  # the paused run was on the head node: its worker process dies too
            with_suppress_kill(paused)
        stdout, stderr = driver.communicate(timeout=420)
        assert driver.returncode == 0, stderr[-3000:]
        assert "8 run(s) finished" in stdout, stdout
        resumed = [json.loads(x) for x in (out / PAUSED / "resumes.jsonl").read_text().splitlines()]
        assert resumed and resumed[0]["round"] >= 1  # from its shipped checkpoint, not from round 0
        again = _fedhv("grid", *GRID, "--backend", "ray", "--address", cluster.address, "--out", str(out), env=env)
        assert again.returncode == 0 and "0 run(s) finished, 8 already done" in again.stdout, again.stderr[-2000:]
        shared = _fedhv("grid", "multimnist", "--methods", "uniform", "--seeds", "0", "--rounds", "2", "--quiet",
                        *[x for s in SETS for x in ("--set", s)], "--backend", "ray", "--address", cluster.address,
                        "--storage", "shared", "--out", str(tmp_path / "shared"), env=env)
        assert shared.returncode == 0, shared.stderr[-2000:]
        assert (tmp_path / "shared" / "multimnist" / "uniform" / "s0" / "summary.json").exists()
        seen |= _node_pids(cluster.head_node)
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        cluster.shutdown()
        for pid in seen:
            with_suppress_kill(pid)
    gone_by = time.monotonic() + 30
    while time.monotonic() < gone_by and any(alive(p) for p in seen):
        time.sleep(0.2)
    assert not [p for p in seen if alive(p)], "Ray processes left behind"
    res = _fedhv("grid", *GRID, "--workers", "1", "--threads", "1", "--out", str(local))
    assert res.returncode == 0, res.stderr[-2000:]
    assert _table(out) == _table(local)


def _paused(pid: int) -> bool:
    """Whether the run held by ``pid`` wrote its pause marker (its lock's folder has ``.test-paused``)."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.endswith(f"/{PAUSED}/.lock"):
            return (Path(target).parent / ".test-paused").exists()
    return False


def with_suppress_kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _raylet_killed_task_worker(ray_tmpdir: Path) -> tuple[bool, str]:
    """Whether the only Ray session under ``ray_tmpdir`` logged ending the worker that ran ``task_job``
    (``raylet.out``: "Killing leased worker because its owner died" / "... its job finished", the worker's
    id named), as Ray's raylet does when it notices a dead driver before its own fate-sharing signal; with what
    the logs say, for the failure message."""
    sessions = sorted((ray_tmpdir / "ray").glob("session_2*"))
    if len(sessions) != 1:
        return False, f"expected one Ray session under {ray_tmpdir}, found {sessions}"
    logs = sessions[0] / "logs"
    task_workers = [f.name.split("-")[1] for f in logs.glob("worker-*.err") if ":task_name:task_job" in f.read_text()]
    raylet = (logs / "raylet.out").read_text(errors="replace").splitlines()
    lines = [x for x in raylet if "state-dump" not in x]
    killed = [x for x in lines if "Killing leased worker" in x and any(f"worker_id={w}" in x for w in task_workers)]
    tails = {f.name: f.read_text(errors="replace")[-1500:] for f in logs.glob("python-core-worker-*.log")
             if any(w in f.name for w in task_workers)}
    return bool(task_workers and killed), \
        f"task workers {task_workers}; raylet.out ends {lines[-8:]}; the task worker's log ends {tails}"


#: Ray's dashboard and runtime-env agents of a local instance outlive a driver killed by SIGKILL by
#: about a minute (they exit on their own once they miss their raylet); everything else dies with it. Either
#: name: an agent retitles itself once it has started, which on a loaded machine may come after the kill.
RAY_AGENTS = (b"ray::DashboardAgent", b"ray::RuntimeEnvAgent", b"ray/dashboard/agent.py",
              b"ray/_private/runtime_env/agent/main.py")


@pytest.mark.needs_data
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_a_stopped_or_killed_driver_checkpoints_the_running_run_and_the_same_command_continues(
        tmp_path: Path, how: signal.Signals) -> None:
    """A local Ray instance of one CPU (no --address), no checkpoint due at round 1; run s0 pauses
    after round 1 and the driver gets ``how``. Ctrl-C: exit 130 naming the stop. kill -9: the tasks
    see their driver gone and stop. Either way s0 holds a round-1 checkpoint (the interrupt wrote it;
    after kill -9 unless the raylet's log shows it ended the worker first, Ray's race in
    docs/cluster.md, and s0 then resumes from round 0) and no summary, s1 (queued) never started, the
    instance's processes are gone (Ray's two agents excepted after a kill -9, see above), and the same
    command finishes both, s0 resumed from its checkpoint's round."""
    out = tmp_path / "grid"
    args = ["grid", "multimnist", "--methods", "uniform", "--seeds", "0,1", "--rounds", "3", "--quiet",
            *[x for s in SETS for x in ("--set", s)], "--set", "checkpoint.period=0", "--set", "eval.test_period=3",
            "--backend", "ray", "--num-cpus", "1", "--out", str(out)]  # no checkpoint due at round 1
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="r", dir="/tmp"),
           "FEDHV_TEST_PAUSE_AFTER_ROUND": "1", "FEDHV_TEST_PAUSE_RUN": "multimnist/uniform/s0"}
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.Popen(from_a_shell([sys.executable, "-m", "fedhv.cli", *args]), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    s0 = out / "multimnist" / "uniform" / "s0"
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and driver.poll() is None:
            seen |= descendants(driver.pid)
            if (s0 / ".test-paused").exists():
                break
            time.sleep(0.2)
        assert (s0 / ".test-paused").exists(), driver.communicate()[1][-3000:]
        assert not (s0 / "checkpoint.pt").exists()
        seen |= descendants(driver.pid)
        # Ray's worker processes (retitled ray::task_job, ray::Collector, ray::IDLE; the agents are not workers)
        workers = [p for p in seen if _cmdline(p).startswith(b"ray::") and not any(a in _cmdline(p) for a in RAY_AGENTS)]
        assert workers, {p: _cmdline(p)[:80] for p in seen}
        for p in workers:  # fedhv's watch ends them, not Ray's check (which raced the checkpoint)
            environ = Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
            assert b"RAY_raylet_death_check_interval_milliseconds=0" in environ
            assert any(e.startswith(f"FEDHV_RAY_DRIVER={driver.pid}:".encode()) for e in environ), _cmdline(p)[:80]
        state = f"test process {signal_state(os.getpid())}; driver {signal_state(driver.pid)}"
        driver.send_signal(how)
        try:
            _, stderr = driver.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the driver did not stop after signal {how} ({state})") from None
    finally:
        if driver.poll() is None:
            driver.kill()
    if how == signal.SIGINT:
        assert driver.returncode == 130, stderr[-3000:]
        assert "stopped; queued runs were not started" in stderr
    else:
        assert driver.returncode == -signal.SIGKILL
    gone_by = time.monotonic() + 60  # Ray's head notices a killed driver late on a loaded machine (CI: > 30 s once)
    left = seen
    while time.monotonic() < gone_by:
        left = {p for p in seen if alive(p) and (how == signal.SIGINT or not any(a in _cmdline(p) for a in RAY_AGENTS))}
        if not left and (s0 / "checkpoint.pt").exists():
            break
        time.sleep(0.2)
    names = {p: _cmdline(p)[:120] for p in left}
    for p in seen:  # the agents of a killed driver's instance
        with_suppress_kill(p)
    assert not left, f"the local Ray instance outlived its driver: {names}"
    resumed_from = 1
    if how == signal.SIGKILL and not (s0 / "checkpoint.pt").exists():
        # Ray's race (docs/cluster.md): a raylet that outlives its driver by a few milliseconds ends the
        # driver's leased workers at once; accepted only when the raylet's own log says it did so
        killed, logs = _raylet_killed_task_worker(Path(env["RAY_TMPDIR"]))
        assert killed, "no round-1 checkpoint, and the raylet did not end the task's worker: " + logs
        resumed_from = 0
    else:
        assert (s0 / "checkpoint.pt").exists()
    assert not (s0 / "summary.json").exists()
    assert not (out / "multimnist" / "uniform" / "s1").exists()  # queued: never started
    env.pop("FEDHV_TEST_PAUSE_AFTER_ROUND")
    res = _fedhv(*args, env=env)
    assert res.returncode == 0 and "2 run(s) finished" in res.stdout, res.stderr[-3000:]
    assert [json.loads(x)["round"] for x in (s0 / "resumes.jsonl").read_text().splitlines()] == [resumed_from]
