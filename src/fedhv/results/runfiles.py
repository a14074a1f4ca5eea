"""The file primitives of run directories.

One-line errors naming the file, strict JSON, atomic writes with the umask's mode, fsync'ed
JSON-lines appends, and opens that never follow a symbolic link (docs/reliability.md §4,
§10). :mod:`fedhv.results.rundir` builds the run directory on them (and re-exports them).
"""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path
from typing import Any

from fedhv import safe_io
from fedhv.errors import FedHVError


class RunDirError(FedHVError, OSError):
    """A run directory that cannot be created, claimed or written.

    An ``OSError`` subclass (``except OSError`` still catches it); ``errno``,
    ``strerror`` and ``filename`` are those of the underlying error, when there is one,
    and ``str()`` is the one-line message.
    """

    def __str__(self) -> str:
        """The one-line message."""
        return str(self.args[0]) if self.args else ""


class RunDirBusy(RunDirError):
    """Another process holds the run directory's lock."""


def io_error(path: Path, exc: OSError, doing: str = "write") -> RunDirError:
    """A one-line :class:`RunDirError` naming ``path``, the errno and a fix."""
    code = errno.errorcode.get(exc.errno or 0, "?")
    reason = exc.strerror or str(exc)
    fix = {
        errno.ENOSPC: "free disk space",
        errno.EDQUOT: "free disk space (quota exceeded)",
        errno.EFBIG: "raise the file size limit (ulimit -f) or free space",
        errno.EROFS: "choose a directory on a writable file system",
        errno.EACCES: "fix its permissions or choose another directory",
        errno.EPERM: "fix its permissions or choose another directory",
        errno.ENOTDIR: "a parent is a file; choose another directory",
    }.get(exc.errno or 0, "check the file system")
    err = RunDirError(f"cannot {doing} {path}: {reason} ({code}); {fix}")
    err.errno, err.strerror, err.filename = exc.errno, exc.strerror, str(path)
    return err


# --------------------------------------------------------------------------- modes and strict JSON


def file_mode() -> int:
    """Mode of a newly created run file, ``0o666 & ~umask`` (what ``open()`` gives)."""
    return safe_io.new_file_mode()


finite_json = safe_io.finite_json
dumps_strict = safe_io.dumps_strict


# --------------------------------------------------------------------------- writers


def write_atomic(path: Path, content: safe_io.Content) -> None:
    """Write a run file atomically: :func:`fedhv.safe_io.write_atomic` with one-line errors.

    ``content`` is bytes, a text (UTF-8) or a function writing to the open file. An
    exclusive temporary file under an unpredictable name is fsync'ed and renamed over
    ``path`` (a destination that is a link, a FIFO or a device is refused), so a kill at any
    moment leaves either the old file or the complete new one. The new file gets the mode
    of any other new file (``0o666 & ~umask``). An ``OSError`` (disk full, read-only file
    system, ...) becomes a one-line :class:`RunDirError` naming ``path``; the old file is
    kept.
    """
    path = Path(path)
    try:
        safe_io.write_atomic(path, content)
    except FedHVError:
        raise
    except OSError as exc:
        raise io_error(path, exc) from None


#: The older name of :func:`write_atomic` (given a function writing the content).
write_atomic_with = write_atomic


def write_json(path: Path, data: Any) -> None:
    """Atomically write a run file of strict JSON (:func:`fedhv.safe_io.json_text`; one-line errors)."""
    write_atomic(path, safe_io.json_text(data))


class JsonlWriter:
    """Append-only JSON-lines file, flushed and fsync'ed per record (strict JSON)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            safe_io.unshare(self.path)  # a hard-linked file (a cp -al backup) becomes a private copy first
            fd = open_nofollow(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                safe_io.refuse_shared(fd, self.path)
            except BaseException:
                os.close(fd)
                raise
            self._fh = os.fdopen(fd, "a", encoding="utf-8")  # kept open for the run's lifetime
        except FedHVError:
            raise
        except OSError as exc:
            raise io_error(self.path, exc, "open") from None

    def append(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one line of strict JSON, flushed and fsync'ed."""
        line = dumps_strict(record, separators=(",", ":")) + "\n"
        try:
            self._fh.write(line)
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as exc:
            raise io_error(self.path, exc) from None

    def close(self) -> None:
        """Close the file (a failed flush was already reported by :meth:`append`)."""
        try:
            self._fh.close()
        except OSError:  # a failed flush of a line already reported by append()
            pass


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All complete records of a JSON-lines file (a torn last line is skipped)."""
    records: list[dict[str, Any]] = []
    if not path.exists() and not path.is_symlink():
        return records
    with safe_io.open_regular(path) as raw:  # a link, a FIFO or a device: one line naming it, never a hang
        if os.fstat(raw.fileno()).st_size > safe_io.MAX_FILE_BYTES:
            raise safe_io.too_large(Path(path), safe_io.MAX_FILE_BYTES)
        fh = io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return records


# --------------------------------------------------------------------------- names



def open_nofollow(path: Path, flags: int, mode: int = 0o666) -> int:
    """``os.open`` with ``O_NOFOLLOW``: a symbolic link at ``path`` is refused with one line naming it."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RunDirError(f"{path} is a symbolic link; fedhv never follows links in a run directory: remove "
                              "it") from None
        raise


def read_bytes_nofollow(path: Path) -> bytes:
    """The bytes of ``path``, opened with ``O_NOFOLLOW``.

    A symbolic link is a :class:`RunDirError` naming it (an ``OSError`` such as
    ``FileNotFoundError`` passes through).
    """
    try:
        return safe_io.read_regular(path)
    except safe_io.UnsafeFileError as exc:
        raise RunDirError(str(exc)) from None
