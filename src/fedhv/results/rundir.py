"""Run directory layout, exclusive ownership and crash-safe writers (no torch import).

A run directory holds:

- ``config.toml``: the resolved configuration;
- ``environment.json``: package versions, git revision, host, torch thread count;
- ``rounds.jsonl``: one JSON object per round (weights, reports, slack, timing, bytes);
- ``metrics.jsonl``: one JSON object per evaluated round (test metrics);
- ``calibration.json``: FedHV's reference calibration (when it ran);
- ``summary.json``: final metrics, written atomically at the end;
- ``model.pt``: the final global model;
- ``.lock``: the lock file of the process writing the run.

JSONL records are appended, flushed and fsync'ed one line at a time, so a killed
run keeps every finished line. All JSON is strict (RFC 8259): a non-finite float
(NaN, ±inf) is written as ``null``, never as the bare ``NaN`` / ``Infinity`` that
other JSON readers reject.

One process at a time writes a run directory: :class:`RunDir` holds an exclusive
``flock`` on ``RUN_DIR/.lock`` for as long as it is open, and a second writer (a
second ``fedhv run --out``, ``--resume`` or grid worker) fails at once with
:class:`RunDirBusy`. A new run refuses a directory that already holds any of
:data:`RUN_FILES` (``overwrite=True`` replaces a *finished* run only).
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from fedhv.errors import FedHVError

LOCK_FILE = ".lock"
#: Files that make a directory a run directory. A new run refuses a directory holding
#: any of them (other files, such as a grid's ``run.log`` and ``grid-job.json``, are
#: allowed). Listed in the order ``overwrite`` deletes them: ``summary.json`` first and
#: ``config.toml`` last, so an overwrite cut short leaves a resumable unfinished run.
RUN_FILES: tuple[str, ...] = (
    "summary.json", "model.pt", "checkpoint.pt", "calibration.json", "metrics.jsonl", "rounds.jsonl",
    "resumes.jsonl", "environment.json", "config.toml",
)


class RunDirError(FedHVError, OSError):
    """A run directory that cannot be created, claimed or written.

    An ``OSError`` subclass (``except OSError`` still catches it); ``errno``,
    ``strerror`` and ``filename`` are those of the underlying error, when there is one,
    and ``str()`` is the one-line message.
    """

    def __str__(self) -> str:
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


def _umask() -> int:
    """The process umask, read without changing it where ``/proc`` allows."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """Mode of a newly created run file, ``0o666 & ~umask`` (what ``open()`` gives)."""
    return 0o666 & ~_umask()


def finite_json(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf), at any depth, replaced by ``None``.

    Tuples become lists; other values are returned unchanged.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def dumps_strict(data: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`finite_json` ``(data)`` with ``allow_nan=False`` (strict JSON)."""
    return json.dumps(finite_json(data), allow_nan=False, **kwargs)


# --------------------------------------------------------------------------- writers


def write_atomic_with(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a temporary file next to ``path``, fsync it and rename it to ``path``.

    A kill at any moment leaves either the old file or the complete new one. The new
    file gets the mode of any other new file (``0o666 & ~umask``; ``mkstemp`` alone
    would give ``0o600``). An ``OSError`` (disk full, read-only file system, ...)
    becomes a one-line :class:`RunDirError` naming ``path``; the old file is kept.
    """
    path = Path(path)
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), file_mode())
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except FedHVError:
        raise
    except OSError as exc:
        raise io_error(path, exc) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    data = text.encode("utf-8")

    def write(fh: BinaryIO) -> None:
        fh.write(data)

    write_atomic_with(path, write)


def write_json(path: Path, data: Any) -> None:
    """Atomically write pretty-printed strict JSON (non-finite floats as ``null``)."""
    write_atomic(path, dumps_strict(data, indent=2, sort_keys=False) + "\n")


class JsonlWriter:
    """Append-only JSON-lines file, flushed and fsync'ed per record (strict JSON)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            fd = open_nofollow(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            self._fh = os.fdopen(fd, "a", encoding="utf-8")  # kept open for the run's lifetime
        except RunDirError:
            raise
        except OSError as exc:
            raise io_error(self.path, exc, "open") from None

    def append(self, record: dict[str, Any]) -> None:
        line = dumps_strict(record, separators=(",", ":")) + "\n"
        try:
            self._fh.write(line)
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as exc:
            raise io_error(self.path, exc) from None

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError:  # a failed flush of a line already reported by append()
            pass


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All complete records of a JSON-lines file (a torn last line is skipped)."""
    records: list[dict[str, Any]] = []
    if not path.exists():
        return records
    with open(path, encoding="utf-8") as fh:
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


def check_name(what: str, name: str) -> None:
    """Refuse a name that is empty or not a single path component (``../x``, ``a/b``)."""
    if not name.strip() or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise RunDirError(
            f"{what} = {name!r} cannot name a run directory; use a plain name without '/', '\\' or '..'"
        )


def default_run_dir(setting: str, method: str, seed: int, base: Path = Path("runs")) -> Path:
    """``runs/<setting>-<method>-s<seed>-<YYYYmmdd-HHMMSS>`` (see :meth:`RunDir.create_default`)."""
    check_name("setting", setting)
    check_name("method", method)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(base) / f"{setting}-{method}-s{seed}-{stamp}"


def _candidates(first: Path) -> Iterator[Path]:
    yield first
    for k in range(2, 10_000):
        yield first.with_name(f"{first.name}-{k}")


def _mkdirs(path: Path) -> list[Path]:
    """Create ``path`` and missing parents; return the directories created, outermost first."""
    missing = [p for p in (path, *path.parents) if not p.exists()][::-1]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise io_error(path, exc, "create") from None
    return missing


# --------------------------------------------------------------------------- locking


def refuse_links(path: Path) -> None:
    """Refuse a run directory whose run files (or lock) are symbolic links.

    fedhv never follows a link for a file it reads or writes in a run directory: a directory
    received from someone else could otherwise make it truncate or append to a file anywhere
    (docs/reliability.md, threat model). The opens themselves use ``O_NOFOLLOW`` as well.
    """
    for name in (LOCK_FILE, *RUN_FILES):
        if (path / name).is_symlink():
            raise RunDirError(f"{path / name} is a symbolic link (to {os.readlink(path / name)}); fedhv never follows "
                              "links in a run directory: remove the link, or use a directory you made")


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
    """The bytes of ``path``, opened with ``O_NOFOLLOW``: a symbolic link is a :class:`RunDirError`
    naming it (an ``OSError`` such as ``FileNotFoundError`` passes through)."""
    fd = open_nofollow(Path(path), os.O_RDONLY)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _acquire_lock(path: Path) -> int:
    """An open file descriptor holding ``flock(LOCK_EX)`` on ``path/.lock``.

    Raises :class:`RunDirBusy` at once when another process holds it.
    """
    lock = path / LOCK_FILE
    while True:
        try:
            fd = open_nofollow(lock, os.O_RDWR | os.O_CREAT)
        except RunDirError:
            raise
        except OSError as exc:
            raise io_error(path, exc, "use run directory") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            finally:
                os.close(fd)
            raise RunDirBusy(
                f"run directory {path} is in use by another fedhv process (pid {holder}, lock {lock}); "
                "wait for it to finish or stop it, or choose another directory"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise io_error(lock, exc, "lock") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:  # else the file was removed (an abandoned start) between open and flock: retry
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)


class RunDir:
    """A run directory owned by this process (an exclusive lock on ``RUN_DIR/.lock``).

    ``RunDir(path)`` locks an existing directory (resume); :meth:`create` and
    :meth:`create_default` make and claim the directory of a new run. The lock is held
    until :meth:`close` (or :meth:`abandon`, which also removes what a failed start
    created). The JSON-lines writers are opened by :meth:`open_logs`.
    """

    def __init__(self, path: str | Path, *, created: tuple[Path, ...] = ()) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise RunDirError(f"run directory {self.path} does not exist or is not a directory")
        self._created = created
        refuse_links(self.path)
        self._lock_fd: int | None = _acquire_lock(self.path)
        self._rounds: JsonlWriter | None = None
        self._metrics: JsonlWriter | None = None

    # -- construction -------------------------------------------------------------------

    @classmethod
    def create(cls, out: str | Path, overwrite: bool = False, replace_unfinished: str | None = None) -> RunDir:
        """Make (if needed), lock and claim the directory ``out`` for a new run.

        Raises
        ------
        RunDirError
            ``out`` is empty, a file, or cannot be created; it already holds a run
            (any of :data:`RUN_FILES`) and ``overwrite`` is false; or ``overwrite`` is
            true but the run there is unfinished (no ``summary.json``), unless its
            ``config.toml`` says ``source = replace_unfinished`` (a ``fedhv.simulate`` run,
            which nothing can resume; the lock proves no process still writes it).
        RunDirBusy
            Another process holds the directory.
        """
        if not str(out).strip():
            raise RunDirError("--out '' is empty; give a directory for the run, e.g. --out runs/my-run, "
                              "or leave --out out for a new default name")
        path = Path(out)
        if path.exists() and not path.is_dir():
            raise RunDirError(f"--out {path} is a file, not a directory; give a new directory for the run")
        run = cls(path, created=tuple(_mkdirs(path)))
        try:
            run._claim(overwrite, replace_unfinished)
        except BaseException:
            run.abandon()
            raise
        return run

    @classmethod
    def create_default(cls, setting: str, method: str, seed: int, base: Path = Path("runs")) -> RunDir:
        """A new, never-used directory ``base/<setting>-<method>-s<seed>-<time>[-k]``.

        The directory is made with an exclusive ``mkdir``; when the name is taken (two
        runs started in the same second), ``-2``, ``-3``, ... are tried.
        """
        first = default_run_dir(setting, method, seed, base)
        created = _mkdirs(first.parent)
        for candidate in _candidates(first):
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            except OSError as exc:
                raise io_error(candidate, exc, "create") from None
            return cls(candidate, created=(*created, candidate))
        raise RunDirError(f"no free run directory name under {first.parent}; give --out")  # pragma: no cover

    def _source(self) -> str | None:
        """``config.toml``'s ``source`` (``None`` when unreadable or absent)."""
        import tomllib

        cfg = self.path / "config.toml"
        try:
            if cfg.is_symlink():
                return None
            value = tomllib.loads(cfg.read_text()).get("source")
        except (OSError, ValueError):
            return None
        return value if isinstance(value, str) else None

    def _claim(self, overwrite: bool, replace_unfinished: str | None = None) -> None:
        present = [n for n in RUN_FILES if (self.path / n).exists() or (self.path / n).is_symlink()]
        if not present:
            return
        finished = "summary.json" in present
        where = self.path
        python_run = replace_unfinished is not None and self._source() == replace_unfinished
        if not overwrite:
            files = ", ".join(sorted(present))
            if finished:
                raise RunDirError(f"--out {where} already holds a finished run ({files}); choose a new directory, "
                                  "or pass --overwrite to replace it")
            if python_run:
                raise RunDirError(f"out={str(where)!r} holds an unfinished fedhv.simulate run ({files}); continue "
                                  f"it with fedhv.simulate(..., resume={str(where)!r}), pass overwrite=True to "
                                  "replace it, or choose a new directory")
            raise RunDirError(f"--out {where} already holds an unfinished run ({files}); continue it with "
                              f"`fedhv run --resume {where}` or choose a new directory")
        if not finished and not python_run:
            raise RunDirError(
                f"--overwrite: {where} holds an unfinished run (no summary.json); --overwrite replaces only "
                f"finished runs: continue it with `fedhv run --resume {where}` or delete it yourself"
            )
        for name in RUN_FILES:
            try:
                (self.path / name).unlink(missing_ok=True)
            except OSError as exc:
                raise io_error(self.path / name, exc, "remove") from None
        for stale in self.path.glob(".*.*"):  # temporary files of atomic writes cut short
            if any(stale.name.startswith(f".{n}.") for n in RUN_FILES):
                stale.unlink(missing_ok=True)

    # -- writing ------------------------------------------------------------------------

    def open_logs(self) -> None:
        """Open ``rounds.jsonl`` and ``metrics.jsonl`` for appending."""
        if self._rounds is None:
            self._rounds = JsonlWriter(self.path / "rounds.jsonl")
        if self._metrics is None:
            self._metrics = JsonlWriter(self.path / "metrics.jsonl")

    @property
    def rounds(self) -> JsonlWriter:
        if self._rounds is None:
            raise RuntimeError("RunDir.open_logs() was not called")
        return self._rounds

    @property
    def metrics(self) -> JsonlWriter:
        if self._metrics is None:
            raise RuntimeError("RunDir.open_logs() was not called")
        return self._metrics

    def write_text(self, name: str, text: str) -> None:
        write_atomic(self.path / name, text)

    def write_json(self, name: str, data: Any) -> None:
        write_json(self.path / name, data)

    # -- release ------------------------------------------------------------------------

    @property
    def locked(self) -> bool:
        return self._lock_fd is not None

    def close(self) -> None:
        """Close the writers and release the lock (the ``.lock`` file stays)."""
        for writer in (self._rounds, self._metrics):
            if writer is not None:
                writer.close()
        self._rounds = self._metrics = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def abandon(self) -> None:
        """Undo a failed start: release the lock and remove what :meth:`create` made.

        The lock file is removed when it is the directory's only file; directories this
        object created are removed when empty. Nothing else is touched.
        """
        try:
            if self._lock_fd is not None and [p.name for p in self.path.iterdir()] == [LOCK_FILE]:
                (self.path / LOCK_FILE).unlink(missing_ok=True)
        except OSError:
            pass
        self.close()
        for folder in reversed(self._created):
            try:
                folder.rmdir()
            except OSError:
                break

    def __enter__(self) -> RunDir:  # noqa: PYI034 - RunDir is final in practice
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
