"""One driver per grid folder: ``OUT/.fedhv-grid.lock``, held for the driver's life.

Two ``fedhv grid`` drivers on one ``OUT`` would both plan every run, both write ``grid.json``
and the probe file, and (on Ray) both run everything. :func:`driver_lock` takes an exclusive
``flock`` on the lock file (released by the kernel when the driver exits, even by ``kill -9``)
and writes the driver's PID and host into it; a second driver is refused with one line naming
them. ``flock`` is per machine on most network filesystems: two drivers on two machines
sharing ``OUT`` over NFS may not see each other's lock (docs/cluster.md).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from fedhv.experiment.grid_check import GridError
from fedhv.results.runfiles import open_nofollow

#: The lock file in the grid folder.
LOCK_FILE = ".fedhv-grid.lock"


@contextlib.contextmanager
def driver_lock(out: Path, what: str = "fedhv grid") -> Iterator[None]:
    """Hold ``out``'s driver lock while the block runs (``out`` is created when missing); ``what`` names the
    command in the refusal (``fedhv tune`` holds its folder the same way).

    Raises
    ------
    GridError
        Another process holds the lock (the message names its PID and host), the lock file
        is a link or not a regular file, or ``out`` cannot be written (a read-only or full file
        system: one line naming ``out`` and the cause).
    """
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only file system, a full one, a path through a file
        raise _unwritable(out, exc) from None
    path = out / LOCK_FILE
    try:
        fd = open_nofollow(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise _unwritable(out, exc) from None
        raise GridError(f"{path} cannot be opened ({exc.strerror}); remove it if it is a link or not a file") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GridError(f"{path} is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "a process that wrote no PID yet"
            raise GridError(f"{out} is in use by another {what} driver ({holder}); wait for it to end or stop "
                            "it, or give another --out") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"PID {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        except OSError as exc:  # a full file system, a quota
            raise _unwritable(out, exc) from None
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race with a waiting driver)


def _unwritable(out: Path, exc: OSError) -> GridError:
    """One line naming the folder and the cause (errno), instead of a raw ``OSError``."""
    return GridError(f"--out {out}: cannot write the grid folder ({exc.strerror or exc}); choose a writable folder "
                     "with free space")


__all__ = ["LOCK_FILE", "driver_lock"]
