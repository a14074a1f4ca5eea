"""Process plumbing of the local Flower deployment: free loopback ports, waiting for a port,
the interpreter's own console scripts, and a process's session-leading children (by PID)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from fedhv.errors import FedHVError


class FlowerRunError(FedHVError):
    """The local Flower deployment or its run failed (the message names the log to read)."""


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def session_children(parent: int) -> list[int]:
    """PIDs of ``parent``'s live child processes that lead their own session (Linux ``/proc``; else none)."""
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == parent and int(fields[3]) == int(entry) and fields[0] != "Z":
            found.append(int(entry))
    return found


def wait_port(port: int, proc: subprocess.Popen[bytes], name: str, workdir: Path, wait_s: float = 60.0) -> None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FlowerRunError(f"{name} exited with status {proc.returncode} while starting; see "
                                 f"{workdir / (name + '.log')}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.2)
    raise FlowerRunError(f"{name} did not listen on 127.0.0.1:{port} within {wait_s:.0f} s; see "
                         f"{workdir / (name + '.log')}")


def console_script(name: str) -> str:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name
