"""The one reader of Linux's ``/proc``: processes, their parents and environments, the CPU, memory.

Every function answers "unknown" where there is no ``/proc`` (another OS) or the entry
cannot be read (the process is gone, or belongs to another user): ``None``, an empty
collection, or the fallback its docstring names. Callers decide what unknown means.

Bottom layer: the standard library only, no fedhv import (the grid, the Flower launcher,
the simulator's memory planning, the native build and file modes all read through it).
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = "/proc"

#: ``/proc/PID/stat`` states of a process that no longer runs (zombie, dead).
GONE_STATES = ("Z", "X", "x")


def available() -> bool:
    """Whether this system has a ``/proc`` to read."""
    return os.path.isdir(ROOT)


def read_text(name: str) -> str | None:
    """``/proc/<name>`` as text (``"meminfo"``, ``"self/status"``, ...), or ``None``."""
    try:
        return Path(f"{ROOT}/{name}").read_text()
    except (OSError, ValueError):
        return None


def pids() -> list[int]:
    """The PIDs listed in ``/proc`` (none without it)."""
    if not available():
        return []
    return [int(entry) for entry in os.listdir(ROOT) if entry.isdigit()]


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (``state`` first), or ``None``."""
    stat = read_text(f"{pid}/stat")
    if stat is None:
        return None
    return stat[stat.rindex(")") + 2:].split()


def start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (``None``: no such process)."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def alive(pid: int, ticks: int | None = None) -> bool:
    """Whether ``pid`` runs (a zombie does not), and, with ``ticks``, is the process that started then.

    Without ``/proc`` it falls back to ``kill(pid, 0)``.
    """
    if not available():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    fields = stat_fields(pid)
    if fields is None or fields[0] in GONE_STATES:
        return False
    return ticks is None or int(fields[19]) == ticks


def descendants(root: int) -> set[int]:
    """The live descendants of ``root`` (``/proc`` parent links; zombies left out)."""
    parents: dict[int, int] = {}
    for pid in pids():
        fields = stat_fields(pid)
        if fields is not None and fields[0] not in GONE_STATES:
            parents[pid] = int(fields[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def session_children(parent: int) -> list[int]:
    """PIDs of ``parent``'s live child processes that lead their own session (none without ``/proc``)."""
    found = []
    for pid in pids():
        fields = stat_fields(pid)
        if fields is not None and int(fields[1]) == parent and int(fields[3]) == pid and fields[0] != "Z":
            found.append(pid)
    return found


def environ(pid: int) -> list[bytes] | None:
    """The ``NAME=value`` items of ``/proc/PID/environ``, or ``None`` (gone, or another user's)."""
    try:
        with open(f"{ROOT}/{pid}/environ", "rb") as fh:
            return fh.read().split(b"\0")
    except OSError:
        return None


def cmdline(pid: int) -> bytes:
    """``/proc/PID/cmdline`` (NUL-separated arguments), or ``b""``."""
    try:
        return Path(f"{ROOT}/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def fd_targets(pid: int) -> list[str] | None:
    """What the open file descriptors of ``pid`` point at (``socket:[inode]``, paths), or ``None``."""
    try:
        fds = os.listdir(f"{ROOT}/{pid}/fd")
    except OSError:
        return None
    out = []
    for fd in fds:
        try:
            out.append(os.readlink(f"{ROOT}/{pid}/fd/{fd}"))
        except OSError:
            continue
    return out


def listening_inodes(port: int) -> set[str] | None:
    """Socket inodes listening on TCP ``port`` (``/proc/net/tcp``, ``tcp6``); ``None`` without them."""
    found: set[str] = set()
    seen_any = False
    for table in ("net/tcp", "net/tcp6"):
        text = read_text(table)
        if text is None:
            continue
        seen_any = True
        for row in text.splitlines()[1:]:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found.add(cols[9])
    return found if seen_any else None


def cpuinfo_line(*prefixes: str) -> str | None:
    """The first line of ``/proc/cpuinfo`` that starts with one of ``prefixes``, or ``None``."""
    text = read_text("cpuinfo")
    for line in (text or "").splitlines():
        if line.startswith(prefixes):
            return line
    return None


def self_status(field: str) -> str | None:
    """The value of ``field`` in ``/proc/self/status`` (``"Umask"`` -> ``"0022"``), or ``None``."""
    text = read_text("self/status")
    for line in (text or "").splitlines():
        if line.startswith(f"{field}:"):
            parts = line.split()
            return parts[1] if len(parts) > 1 else None
    return None
