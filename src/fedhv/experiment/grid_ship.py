"""The work of one Ray task of a grid, and shipping run directories back to the driver.

A grid on Ray (:mod:`fedhv.experiment.grid_ray`) runs each calibration and each run as a
Ray task. Where the task writes depends on the filesystem it sees:

- **shared**: the driver's ``--out`` is visible on the worker's node (same path, same
  files: NFS, a cluster filesystem, or one machine). The driver writes a probe file
  ``OUT/.fedhv-grid-probe`` holding a random token; a task that reads the same token there
  writes its run directory in place, exactly as the local grid does.
- **ship**: otherwise. The task works in a private local folder and ships the run directory
  (a tar of its regular files) to a *collector* actor that runs on the driver's node and
  writes into ``--out``: after every checkpoint, when the run ends, and when it is stopped.
  A retry (another attempt after a lost worker or node) starts from a **fresh** local
  folder filled with the driver's copy, i.e. from the last shipped checkpoint: a lost node
  loses at most one checkpoint interval, and two attempts never share a folder.

``--storage shared`` / ``ship`` force one mode (a ``shared`` task that does not see the
probe fails with the fix); ``auto`` (default) decides per task.

A shipment is accepted only into its task's **planned** run folder (the driver gives the
collector the plan; anything else, the grid's ``calibration/`` included, is refused with a
logged message), and never goes back in time: each attempt of a task registers with the
collector when it starts (:meth:`Collector.begin`), a shipment of an older attempt is
refused, a shipment of an earlier round than the attempt's last accepted one is refused,
and a finished run (``summary.json``) is never overwritten. The shipment that finishes a
run removes the driver's copy of ``checkpoint.pt``, as a run writing in place does.

Calibrations return their result to the driver (an object in Ray's store), which writes
``OUT/calibration/…json``; the runs that need it get it as a task argument (Ray starts them
once it exists). Nothing here imports ``ray`` at module level: the tasks are plain
functions the driver wraps with ``ray.remote``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import io
import logging
import os
import shutil
import stat
import tarfile
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedhv import safe_io
from fedhv.errors import FedHVError
from fedhv.experiment.grid_watch import task_scope
from fedhv.results.runfiles import open_nofollow

#: The probe file in the grid folder that tells a task it sees the driver's filesystem.
PROBE = ".fedhv-grid-probe"
#: Files shipped last, in this order: a copy with ``summary.json`` is finished, and one whose
#: ``checkpoint.pt`` arrived has every record up to it (later records are cut on resume).
_LAST = ("checkpoint.pt", "model.pt", "summary.json")
#: Seconds a retry waits for the run directory's lock, held by a worker of a lost node that
#: has not exited yet, before it gives up.
LOCK_WAIT_S = 120.0

log = logging.getLogger("fedhv")


class ShipError(FedHVError):
    """A run directory that cannot be shipped or received (a link, a path outside the grid)."""


# --------------------------------------------------------------------------- packing


def pack_dir(path: Path) -> bytes:
    """The regular files directly in ``path`` (no ``.lock``, no links, no folders) as a tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            if entry.name == ".lock" or not entry.is_file(follow_symlinks=False):
                continue
            fd = open_nofollow(Path(entry.path), os.O_RDONLY)
            with os.fdopen(fd, "rb") as fh:
                data = fh.read()
            info = tarfile.TarInfo(entry.name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(entry.stat(follow_symlinks=False).st_mtime)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _members(blob: bytes) -> list[tuple[str, bytes]]:
    """``(name, content)`` of a :func:`pack_dir` tar; anything but plain files at the top is refused."""
    out = []
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        for m in tar.getmembers():
            if not m.isreg() or "/" in m.name or m.name in ("", ".", "..", ".lock") or m.name.startswith(".."):
                raise ShipError(f"a shipped run directory holds {m.name!r}, which is not a plain file name")
            fh = tar.extractfile(m)
            out.append((m.name, fh.read() if fh is not None else b""))
    first = [x for x in out if x[0] not in _LAST]
    return first + sorted((x for x in out if x[0] in _LAST), key=lambda x: _LAST.index(x[0]))


def write_members(blob: bytes | list[tuple[str, bytes]], dest: Path) -> None:
    """Write the files of ``blob`` (a :func:`pack_dir` tar, or its :func:`_members`) into ``dest``,
    each atomically (:func:`fedhv.safe_io.write_atomic`, mode ``0o644``), never through a link, in
    the order that keeps ``dest`` resumable at every instant."""
    members = _members(blob) if isinstance(blob, bytes) else blob
    dest.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink() or not dest.is_dir():
        raise ShipError(f"{dest} is a link or not a folder; fedhv never writes through links")
    for name, data in members:
        target = dest / name
        if target.is_symlink():
            raise ShipError(f"{target} is a symbolic link; fedhv never writes through links: remove it")
        safe_io.write_atomic(target, data, mode=0o644)


# --------------------------------------------------------------------------- the collector (driver's node)


class Collector:
    """Runs on the driver's node (a Ray actor): receives run directories and progress.

    ``root`` is the grid folder (absolute, on the driver's filesystem); ``planned`` the run
    folders of this grid's tasks, relative to ``root`` (nothing else is fetched or written).
    A shipped directory is written under the run directory's lock (``flock`` on ``.lock``),
    so it never mixes with a run writing there in place. Each attempt of a task calls
    :meth:`begin` first and passes the attempt number it got to every :meth:`store`; a Ray
    actor runs one method at a time, so an attempt's ``begin`` and its starting copy are one
    step. Refused shipments raise :class:`ShipError` in the task, are logged, and are kept for
    the driver (:meth:`take_refusals`).
    """

    def __init__(self, root: str, planned: Iterable[str]) -> None:
        self.root = Path(root)
        self.planned = frozenset(planned)
        self.rounds: dict[str, int] = {}
        self.attempts: dict[str, int] = {}  #: the newest attempt of each run folder
        self.accepted: dict[str, tuple[int, int]] = {}  #: (attempt, rounds) of the last shipment written
        self.refused: list[str] = []

    def _refuse(self, message: str) -> ShipError:
        log.warning(message)
        self.refused.append(message)
        return ShipError(message)

    def _path(self, rel: str) -> Path:
        if not isinstance(rel, str) or rel not in self.planned:
            raise self._refuse(f"shipment refused: {rel!r} is not the planned run folder of a task of the grid "
                               f"{self.root} (a task ships only into its own run folder)")
        path = (self.root / rel).resolve()
        if self.root.resolve() not in path.parents:
            raise self._refuse(f"shipment refused: run directory {rel!r} is outside the grid folder {self.root}")
        return self.root / rel

    def register(self, rel: str) -> int:
        """A new attempt of the task of ``rel`` (one writing in place too): its attempt number;
        older attempts' shipments are refused from now on."""
        self._path(rel)
        self.attempts[rel] = self.attempts.get(rel, 0) + 1
        return self.attempts[rel]

    def begin(self, rel: str) -> tuple[int, bytes | None]:
        """A new attempt of the task of ``rel`` that ships: :meth:`register`, and the driver's copy to
        resume from (``None``: nothing there yet)."""
        attempt = self.register(rel)
        path = self.root / rel
        return attempt, (pack_dir(path) if (path / "config.toml").is_file() else None)

    def store(self, rel: str, blob: bytes, attempt: int) -> int:
        """Replace the driver's copy of ``rel`` with ``blob``'s files; returns the rounds it holds.

        Raises
        ------
        ShipError
            ``rel`` is not a planned run folder; ``attempt`` is not the newest attempt of ``rel``;
            the driver's copy is finished; or ``blob`` holds fewer rounds than the attempt's last
            shipment. Nothing is written then.
        """
        path = self._path(rel)
        newest = self.attempts.get(rel, 0)
        if attempt != newest:
            raise self._refuse(f"shipment refused: {rel} from attempt {attempt}, but attempt {newest} is the newest "
                               "(a late shipment of an earlier attempt never replaces a newer one)")
        try:
            members = _members(blob)
        except (tarfile.TarError, ShipError, TypeError) as exc:
            raise self._refuse(f"shipment refused: {rel} from attempt {attempt} is not a run directory "
                               f"({type(exc).__name__}: {exc})") from None
        names = {name for name, _ in members}
        rounds = next((data.count(b"\n") for name, data in members if name == "rounds.jsonl"), 0)
        path.mkdir(parents=True, exist_ok=True)
        fd = open_nofollow(path / ".lock", os.O_RDWR | os.O_CREAT)
        try:
            if not _lock_within(fd, 30.0):
                raise ShipError(f"{path} is locked by a run writing in place; not overwritten")
            if os.path.lexists(path / "summary.json"):
                raise self._refuse(f"shipment refused: {rel} is finished (summary.json); a finished run is never "
                                   f"overwritten (attempt {attempt}, {rounds} rounds)")
            last = self.accepted.get(rel)
            if last is not None and last[0] == attempt and rounds < last[1]:
                raise self._refuse(f"shipment refused: {rel} with {rounds} rounds after one with {last[1]} rounds "
                                   f"from the same attempt {attempt} (never back in time)")
            write_members(members, path)
            if "summary.json" in names and "checkpoint.pt" not in names:
                (path / "checkpoint.pt").unlink(missing_ok=True)  # finished: model.pt and summary.json replace it
        finally:
            os.close(fd)
        self.accepted[rel] = (attempt, rounds)
        self.rounds[rel] = max(self.rounds.get(rel, 0), rounds)
        return rounds

    def progress(self, rel: str, rounds: int) -> None:
        """A task's rounds so far (the driver's progress bar between shipments); ignored for a
        folder that is not planned."""
        if rel in self.planned and isinstance(rounds, int):
            self.rounds[rel] = max(self.rounds.get(rel, 0), rounds)

    def all_progress(self) -> dict[str, int]:
        return dict(self.rounds)

    def take_refusals(self) -> list[str]:
        """The refusals since the last call (the driver prints them)."""
        refused, self.refused = self.refused, []
        return refused


# --------------------------------------------------------------------------- tasks (worker side)


def _sees_driver(root: str, token: str) -> bool:
    try:
        return (Path(root) / PROBE).read_text().strip() == token
    except OSError:
        return False


def _storage(root: str, token: str, storage: str) -> str:
    shared = _sees_driver(root, token)
    if storage == "shared" and not shared:
        raise ShipError(f"--storage shared, but this node ({os.uname().nodename}) does not see {root}/{PROBE} "
                        "of this grid: mount the grid folder at the same path on every node, or use --storage ship")
    return "shared" if (storage == "auto" and shared) or storage == "shared" else "ship"


def _threads(cpus: float) -> None:
    import torch

    torch.set_num_threads(max(1, int(cpus)))


def task_calibration(job: Any, cpus: float) -> dict[str, Any]:
    """A grid calibration as a Ray task: its result (the driver writes the file)."""
    from fedhv.config import load_config
    from fedhv.experiment.method_setup import resolve_reference
    from fedhv.experiment.problem import Problem

    _threads(cpus)
    with task_scope():
        cfg = load_config(job.source, job.overrides)
        problem = Problem.of(cfg)
        _, _, result = resolve_reference(cfg, problem.data(cfg), problem=problem)
        assert result is not None
        return result.as_dict()


def _wait_unlocked(path: Path) -> None:
    """Wait until no process holds ``path/.lock`` (a lost node's worker may still be exiting)."""
    lock = path / ".lock"
    if not lock.exists():
        return
    fd = open_nofollow(lock, os.O_RDWR)
    try:
        if _lock_within(fd, LOCK_WAIT_S):  # else the run reports RunDirBusy itself, naming the holder
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _lock_within(fd: int, seconds: float) -> bool:
    """Take ``flock(LOCK_EX)`` on ``fd``, trying for ``seconds``; whether it was taken."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)


def task_job(job: Any, calibration: dict[str, Any] | None, root: str, token: str, storage: str, cpus: float,
             collector: Any) -> dict[str, Any]:
    """A grid run as a Ray task: resumed when a copy of it exists, shipped back unless the
    driver's folder is shared. Returns the run's summary plus ``"storage"``. A local instance's
    task ends its process once its driver is gone (:mod:`fedhv.experiment.grid_watch`)."""
    with task_scope():
        return _task_job(job, calibration, root, token, storage, cpus, collector)


def _task_job(job: Any, calibration: dict[str, Any] | None, root: str, token: str, storage: str, cpus: float,
              collector: Any) -> dict[str, Any]:
    """:func:`task_job` within its task scope."""
    import ray

    from fedhv.experiment.calibration import CalibrationResult
    from fedhv.experiment.grid import run_job

    _threads(cpus)
    mode = _storage(root, token, storage)
    rel = os.path.relpath(job.run_dir, root)
    cal = None if calibration is None else CalibrationResult.from_dict(calibration, source=job.calibration or "")
    if mode == "shared":
        # an earlier attempt that shipped never overwrites this one. Not waited for: a task blocked in ray.get
        # lends its CPU to the next queued task (Ray's rule), which would then start beside this one
        collector.register.remote(rel)
        _wait_unlocked(Path(job.run_dir))
        return {**run_job(job, cal), "storage": "shared"}
    work = Path(tempfile.mkdtemp(prefix="fedhv-ray-run-"))  # fresh per attempt: attempts never share a folder
    local = work / rel  # the grid's relative path: run.log and messages name the run as on the driver
    try:
        attempt, blob = ray.get(collector.begin.remote(rel))
        if blob is not None:
            write_members(blob, local)
        shipped = {"checkpoint": _stamp(local / "checkpoint.pt")}

        def on_round(t: int, record: dict[str, Any]) -> None:
            collector.progress.remote(rel, t)
            stamp = _stamp(local / "checkpoint.pt")
            if stamp != shipped["checkpoint"]:  # a checkpoint was written: ship it
                ray.get(collector.store.remote(rel, pack_dir(local), attempt))
                shipped["checkpoint"] = stamp

        try:
            summary = run_job(dataclasses.replace(job, run_dir=str(local)), cal, on_round)
        except BaseException:  # stopped or failed: ship what was checkpointed, then report
            if (local / "config.toml").exists():
                ray.get(collector.store.remote(rel, pack_dir(local), attempt))
            raise
        ray.get(collector.store.remote(rel, pack_dir(local), attempt))
        return {**summary, "storage": "ship"}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size) if stat.S_ISREG(st.st_mode) else None


def write_probe(root: Path, token: str) -> None:
    """The driver's probe file (see the module docstring)."""
    root.mkdir(parents=True, exist_ok=True)
    fd = open_nofollow(root / PROBE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)


def summary_of(result: dict[str, Any]) -> dict[str, Any]:
    """A task's summary without the storage field (for the grid's report lines)."""
    return {k: v for k, v in result.items() if k != "storage"}


__all__ = [
    "PROBE",
    "Collector",
    "ShipError",
    "pack_dir",
    "summary_of",
    "task_calibration",
    "task_job",
    "write_members",
    "write_probe",
]
