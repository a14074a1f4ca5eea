"""Process plumbing of the local Flower deployment: free loopback ports, waiting for a port,
the interpreter's own console scripts, and a process's session-leading children (by PID)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fedhv import procfs
from fedhv.errors import FedHVError
from fedhv.procfs import session_children  # re-exported: this module's name before procfs

__all__ = ["PORT_ATTEMPTS", "FlowerRunError", "PortTaken", "console_script", "free_ports", "listens_on",
           "session_children", "until_listening", "wait_port"]

#: How many fresh ports a local deployment tries for one process before it gives up
#: (:meth:`fedhv.flower.local.Deployment.start_listening`).
PORT_ATTEMPTS = 3


class FlowerRunError(FedHVError):
    """The local Flower deployment or its run failed (the message names the log to read)."""


class PortTaken(FlowerRunError):
    """Another process took the port chosen for a process of the deployment before that process
    bound it: starting the process again on a fresh port may succeed."""

    def __init__(self, message: str, port: int) -> None:
        super().__init__(message)
        self.port = port


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
    ``proc``'s process tree is an error naming the port and the cause, :class:`PortTaken`; so is
    ``proc``'s exit while its log says it could not bind.
    """
    log = workdir / (name + ".log")
    taken = PortTaken(f"{name}: port 127.0.0.1:{port} was taken by another process between choosing it and "
                      f"starting {name} (it could not bind: address already in use; see {log}); run the command "
                      "again, a new free port is chosen each time", port)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if _bind_failed(log):
                raise taken
            raise FlowerRunError(f"{name} exited with status {proc.returncode} while starting; see {log}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            if listens_on(proc.pid, port) is False:
                raise taken
            return
        time.sleep(0.2)
    raise FlowerRunError(f"{name} did not listen on 127.0.0.1:{port} within {wait_s:.0f} s; see "
                         f"{workdir / (name + '.log')}")


def until_listening(name: str, proc: subprocess.Popen[bytes], port: int, workdir: Path,
                    relaunch: Callable[[], tuple[subprocess.Popen[bytes], int]],
                    forget: Callable[[subprocess.Popen[bytes]], None]) -> tuple[subprocess.Popen[bytes], int]:
    """Wait until ``proc`` (named ``name``, its log ``workdir/NAME.log``) listens on ``port``.

    While another process holds the port (:class:`PortTaken`), ``forget(proc)`` stops it, its log
    is kept as ``NAME.port-PORT.log`` and ``relaunch()`` starts it again on a new port, at most
    :data:`PORT_ATTEMPTS` ports in all, with a note on stderr each time. Returns the process that
    listens and its port.
    """
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            wait_port(port, proc, name, workdir)
            return proc, port
        except PortTaken as taken:
            forget(proc)
            log = workdir / f"{name}.log"
            if log.exists():
                log.rename(workdir / f"{name}.port-{port}.log")
            if attempt == PORT_ATTEMPTS:
                raise FlowerRunError(f"{taken} ({PORT_ATTEMPTS} ports in a row were taken)") from None
            print(f"note: {name}: port 127.0.0.1:{port} was taken by another process before {name} bound it; "
                  f"starting {name} again on a new port (attempt {attempt + 1} of {PORT_ATTEMPTS})", file=sys.stderr)
            proc, port = relaunch()
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _bind_failed(log: Path) -> bool:
    """Whether a process's log says it could not bind its address (gRPC's and the OS's wording)."""
    try:
        text = log.read_bytes()[-20000:].decode(errors="replace").lower()
    except OSError:
        return False
    return "address already in use" in text or "failed to bind" in text


def console_script(name: str) -> str:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name
