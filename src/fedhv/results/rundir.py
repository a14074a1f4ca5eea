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

import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOCK_FILE = ".lock"
#: Files that make a directory a run directory. A new run refuses a directory holding
#: any of them (other files, such as a grid's ``run.log`` and ``grid-job.json``, are
#: allowed). Listed in the order ``overwrite`` deletes them: ``summary.json`` first and
#: ``config.toml`` last, so an overwrite cut short leaves a resumable unfinished run.
RUN_FILES: tuple[str, ...] = (
    "summary.json", "model.pt", "checkpoint.pt", "calibration.json", "metrics.jsonl", "rounds.jsonl",
    "resumes.jsonl", "environment.json", "failure.json", "config.toml",
)
#: Why an unfinished run stopped, when the training itself failed (it diverged): ``error``, ``message``,
#: ``rounds_done``; removed when the run finishes. ``fedhv table`` names such runs apart from interrupted ones.
FAILURE_FILE = "failure.json"

from fedhv import safe_io
from fedhv.results.runfiles import (  # noqa: F401 - re-exported: the run directory's file primitives
    JsonlWriter,
    RunDirBusy,
    RunDirError,
    dumps_strict,
    file_mode,
    finite_json,
    io_error,
    open_nofollow,
    read_bytes_nofollow,
    read_jsonl,
    write_atomic,
    write_atomic_with,
    write_json,
)


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
            value = tomllib.loads(safe_io.read_regular(cfg).decode("utf-8")).get("source")  # a FIFO: no hang
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
        """The ``rounds.jsonl`` writer (after :meth:`open_logs`)."""
        if self._rounds is None:
            raise RuntimeError("RunDir.open_logs() was not called")
        return self._rounds

    @property
    def metrics(self) -> JsonlWriter:
        """The ``metrics.jsonl`` writer (after :meth:`open_logs`)."""
        if self._metrics is None:
            raise RuntimeError("RunDir.open_logs() was not called")
        return self._metrics

    def write_text(self, name: str, text: str) -> None:
        """Write the run file ``name`` atomically (:func:`~fedhv.results.runfiles.write_atomic`)."""
        write_atomic(self.path / name, text)

    def write_json(self, name: str, data: Any) -> None:
        """Write the run file ``name`` as strict JSON (:func:`~fedhv.results.runfiles.write_json`)."""
        write_json(self.path / name, data)

    def record_failure(self, rounds_done: int, exc: BaseException) -> None:
        """Write :data:`FAILURE_FILE`: the run stopped after ``rounds_done`` rounds because of ``exc``."""
        self.write_json(FAILURE_FILE, {"error": type(exc).__name__, "message": str(exc), "rounds_done": rounds_done})

    def clear_failure(self) -> None:
        """Remove :data:`FAILURE_FILE` (the run finished after all)."""
        (self.path / FAILURE_FILE).unlink(missing_ok=True)

    # -- release ------------------------------------------------------------------------

    @property
    def locked(self) -> bool:
        """Whether this object holds the run directory's lock."""
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
        """The run directory itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close it (:meth:`close`)."""
        self.close()
