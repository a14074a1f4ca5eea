"""fedhv.procfs, the one reader of /proc, against what the OS says by other means."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from fedhv import procfs

pytestmark = pytest.mark.skipif(not procfs.available(), reason="no /proc on this system")


def test_own_process_is_alive_with_its_start_time_and_a_reused_pid_is_not() -> None:
    me = os.getpid()
    ticks = procfs.start_ticks(me)
    assert ticks is not None and procfs.alive(me) and procfs.alive(me, ticks)
    assert not procfs.alive(me, ticks + 1)  # another process that got the same PID later
    assert me in procfs.pids()


def test_children_descendants_environ_and_cmdline_of_a_started_process() -> None:
    env = {**os.environ, "FEDHV_PROCFS_TEST": "marked"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while b"FEDHV_PROCFS_TEST=marked" not in (procfs.environ(child.pid) or []) and time.monotonic() < deadline:
            time.sleep(0.02)  # until the child has exec'd
        assert b"FEDHV_PROCFS_TEST=marked" in (procfs.environ(child.pid) or [])
        assert child.pid in procfs.descendants(os.getpid())
        assert child.pid in procfs.session_children(os.getpid())  # it leads its own session
        assert b"time.sleep(30)" in procfs.cmdline(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not procfs.alive(child.pid)
    assert procfs.environ(child.pid) is None and procfs.cmdline(child.pid) == b"" and procfs.stat_fields(child.pid) is None


def test_umask_memory_and_cpu_lines() -> None:
    mask = os.umask(0o027)
    try:
        assert procfs.self_status("Umask") == "0027"
    finally:
        os.umask(mask)
    assert procfs.self_status("NoSuchField") is None
    assert "MemAvailable:" in (procfs.read_text("meminfo") or "")
    assert procfs.read_text("no/such/entry") is None
    line = procfs.cpuinfo_line("processor")
    assert line is None or line.startswith("processor")


def test_listening_socket_is_found_in_the_process_fds() -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        inodes = procfs.listening_inodes(port)
        assert inodes, "the listening socket is in /proc/net/tcp"
        targets = procfs.fd_targets(os.getpid()) or []
        assert any(f"socket:[{inode}]" in targets for inode in inodes)
