"""Process plumbing of the local Flower deployment: free loopback ports, waiting for a port,
the interpreter's own console scripts, and a process's session-leading children (by PID)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

from fedhv import procfs
from fedhv.errors import FedHVError
from fedhv.procfs import session_children  # re-exported: this module's name before procfs

__all__ = ["FlowerRunError", "console_script", "free_ports", "listens_on", "session_children", "wait_port"]


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


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` (or a descendant) holds the socket listening on ``port``; ``None``
    when that cannot be told (no ``/proc``, or no listener found)."""
    inodes = procfs.listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for member in {pid} | procfs.descendants(pid):
        if any(target in wanted for target in procfs.fd_targets(member) or ()):
            return True
    return False


def wait_port(port: int, proc: subprocess.Popen[bytes], name: str, workdir: Path, wait_s: float = 60.0) -> None:
    """Wait until ``proc`` listens on ``127.0.0.1:port``.

    A connection alone does not prove it: another process may have taken the port between
    :func:`free_ports` and the start (the SuperLink then exits with "address already in use"
    while the other listener answers). Where ``/proc`` tells who listens, a listener outside
    ``proc``'s process tree is an error naming the port and the cause.
    """
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FlowerRunError(f"{name} exited with status {proc.returncode} while starting; see "
                                 f"{workdir / (name + '.log')}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            if listens_on(proc.pid, port) is False:
                raise FlowerRunError(
                    f"{name}: port 127.0.0.1:{port} was taken by another process between choosing it and "
                    f"starting {name} (it could not bind: address already in use; see {workdir / (name + '.log')}); "
                    "run the command again, a new free port is chosen each time")
            return
        time.sleep(0.2)
    raise FlowerRunError(f"{name} did not listen on 127.0.0.1:{port} within {wait_s:.0f} s; see "
                         f"{workdir / (name + '.log')}")


def console_script(name: str) -> str:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name
