"""The loopback ports of a local Flower deployment (:mod:`fedhv.flower.procs`).

Ports are chosen free and released before the process that will listen there starts; another
process (a test, another deployment) may take one in between. The deployment names the port and
the cause, and starts the process again on a new port, three ports at most, before it gives up.
The race is made certain here by handing the deployment a port a socket of the test holds.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedhv.flower.procs import PORT_ATTEMPTS, FlowerRunError, PortTaken, free_ports, listens_on, wait_port
from flower_support import assert_gone, descendants, group_members, needs_flwr

from conftest import SMALL


@pytest.fixture
def held() -> Iterator[int]:
    """A loopback port on which a socket of this test listens."""
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen()
    try:
        yield other.getsockname()[1]
    finally:
        other.close()


def test_a_port_taken_by_another_process_is_named(tmp_path: Path, held: int) -> None:
    """Another process took the SuperLink's port between choosing and starting it: one line names
    the port and the cause (before, the other listener answered the connection check and the run
    failed 43 s later with only ``ReadTimeout``); a process that does listen passes."""
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(PortTaken, match=rf"superlink: port 127\.0\.0\.1:{held} was taken by another process"
                                            r".*address already in use.*run the command again"):
            wait_port(held, idle, "superlink", tmp_path)
    finally:
        idle.kill()
        idle.wait()
    port = free_ports(1)[0]
    code = f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(60)"
    owner = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_port(port, owner, "superlink", tmp_path)
    finally:
        owner.kill()
        owner.wait()


def test_a_process_that_exits_because_it_could_not_bind_is_a_taken_port(tmp_path: Path, held: int) -> None:
    """The process lost the race and exited before the check saw the other listener: its log's
    "address already in use" tells a taken port from any other failure to start."""
    code = f"import socket; socket.socket().bind(('127.0.0.1', {held}))"
    with open(tmp_path / "gate.log", "wb") as log:
        failed = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)
        failed.wait()
    with pytest.raises(PortTaken):
        wait_port(held, failed, "gate", tmp_path)
    with open(tmp_path / "other.log", "wb") as log:
        other = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], stdout=log, stderr=subprocess.STDOUT)
        other.wait()
    with pytest.raises(FlowerRunError, match="other exited with status 3 while starting") as failure:
        wait_port(held, other, "other", tmp_path)
    assert not isinstance(failure.value, PortTaken)


def _handing_out(monkeypatch: pytest.MonkeyPatch, taken: set[int], port: int) -> list[int]:
    """Make the deployment's ``free_ports`` hand out ``port`` on the calls numbered in ``taken``
    (1 = the first); returns the list of ports handed out."""
    from fedhv.flower import local

    handed: list[int] = []

    def ports(n: int) -> list[int]:
        chosen = [port] if len(handed) + 1 in taken else free_ports(n)
        handed.extend(chosen)
        return chosen

    monkeypatch.setattr(local, "free_ports", ports)
    return handed


@needs_flwr
@pytest.mark.needs_data
def test_a_deployment_starts_a_process_again_on_a_new_port_when_its_port_is_taken(
        tmp_path: Path, held: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The SuperLink's first port and its SuperNode's first port are taken: each is started again on a
    new port (a note on stderr, the first attempt's log kept), and a run on the deployment finishes."""
    from fedhv.config import load_config
    from fedhv.flower.local import local_deployment

    handed = _handing_out(monkeypatch, {1, 3}, held)  # 1, 2: the SuperLink's; 3, 4: supernode-0's
    cfg = load_config("multimnist", [*SMALL, "partition.clients=1", "train.clients_per_round=1", "rounds=1",
                                     'method="uniform"'])
    with local_deployment(1, keep_workdir=True) as dep:
        assert handed[0] == held and handed[2] == held and len(handed) == 4
        assert dep.port == handed[1] and listens_on(dep.procs[0][1].pid, dep.port)
        assert f'address = "127.0.0.1:{dep.port}"' in (dep.workdir / "flwr-home" / "config.toml").read_text()
        node = next(proc for name, proc in dep.procs if name == "supernode-0")
        assert listens_on(node.pid, handed[3])
        assert {name for name, _ in dep.procs} == {"superlink", "supernode-0", "clientapp-0"}
        for name in ("superlink", "supernode-0"):
            assert (dep.workdir / f"{name}.port-{held}.log").exists()
        run = dep.submit(cfg, tmp_path / "run", stage_timeout=120.0)
        seen = group_members(dep.pids) | set(dep.pids)
    assert (run / "summary.json").exists()
    assert_gone(seen)
    notes = capsys.readouterr().err
    for name in ("superlink", "supernode-0"):
        assert (f"note: {name}: port 127.0.0.1:{held} was taken by another process before {name} bound it; "
                f"starting {name} again on a new port (attempt 2 of {PORT_ATTEMPTS})") in notes


@needs_flwr
def test_a_deployment_gives_up_after_three_taken_ports(tmp_path: Path, held: int, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Every port handed to the SuperLink is taken: after three the deployment fails with the port,
    the cause and the count, and no process it started is left."""
    from fedhv.flower.local import local_deployment
    from fedhv.procfs import cmdline

    handed = _handing_out(monkeypatch, set(range(1, 10)), held)
    with pytest.raises(FlowerRunError, match=rf"superlink: port 127\.0\.0\.1:{held} was taken.*"
                                             rf"\({PORT_ATTEMPTS} ports in a row were taken\)"), local_deployment(1):
        pass
    assert handed == [held] * PORT_ATTEMPTS
    assert capsys.readouterr().err.count("note: superlink: port") == PORT_ATTEMPTS - 1
    left = [pid for pid in descendants(os.getpid()) if b"flower" in cmdline(pid) or b"fedhv.flower" in cmdline(pid)]
    assert_gone(set(left))
