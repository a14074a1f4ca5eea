"""TCP sockets in LISTEN state held by given processes, read from ``/proc`` (Linux): what a test of a
loopback-only service checks (a local Ray instance, Flower's Simulation Engine)."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def listening(pids: set[int]) -> list[tuple[int, Address, int]]:
    """``(pid, address, port)`` of every TCP socket in LISTEN state held by one of ``pids``."""
    owner: dict[str, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owner[target[8:-1]] = pid
    found = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in owner:  # 0A: LISTEN
                continue
            hex_addr, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_addr)  # 32-bit words in host (little-endian) order
            packed = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))
            found.append((owner[fields[9]], ipaddress.ip_address(packed), int(hex_port, 16)))
    return found


def is_loopback(address: Address) -> bool:
    """127.0.0.0/8, ::1 or an IPv4-mapped loopback address."""
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def process_name(pid: int) -> str:
    """The program name of ``pid`` (its first argument's last path part), or ``?``."""
    try:
        first = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return "?"
    return os.path.basename(first) or "?"


def run_watching(argv: list[str], token: str, timeout: float, poll_s: float = 0.25, **popen: Any
                 ) -> tuple[subprocess.CompletedProcess[str], dict[tuple[str, str, int], Address]]:
    """Run ``argv`` to its end (``subprocess.run`` with captured text output) while sampling, every ``poll_s``,
    the listening TCP sockets of every process marked ``FEDHV_DEPLOYMENT=token`` and of their descendants:
    ``{(program, address, port): address}`` of all it saw. Raises ``subprocess.TimeoutExpired`` (after killing
    the process) past ``timeout`` s."""
    from fedhv.flower.lifetime import marked

    seen: dict[tuple[str, str, int], Address] = {}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, **popen)
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise subprocess.TimeoutExpired(argv, timeout)
            for pid, address, port in listening(_with_descendants(set(marked(token)))):
                seen[(process_name(pid), str(address), port)] = address
            time.sleep(poll_s)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read()), seen


def _with_descendants(roots: set[int]) -> set[int]:
    """``roots`` and every live process below them (one pass over ``/proc``: a Ray agent started by a marked
    raylet may not carry the mark)."""
    from fedhv.procfs import GONE_STATES, pids, stat_fields

    children: dict[int, list[int]] = {}
    for pid in pids():
        fields = stat_fields(pid)
        if fields is not None and fields[0] not in GONE_STATES:
            children.setdefault(int(fields[1]), []).append(pid)
    found, frontier = set(roots), list(roots)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def exposed(seen: dict[tuple[str, str, int], Address]) -> list[tuple[str, str, int]]:
    """The sockets of :func:`run_watching` that listen beyond the loopback."""
    return sorted(key for key, address in seen.items() if not is_loopback(address))
