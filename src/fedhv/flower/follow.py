"""Following a submitted Flower run to its end (rounds for progress, the run's status on the
Control API, the ServerApp's last error) and SIGTERM as an interrupt for the launcher."""

from __future__ import annotations

import contextlib
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from fedhv.flower.control import run_status
from fedhv.flower.procs import FlowerRunError


class Deployment(Protocol):
    """What following a run needs of the local deployment (:class:`fedhv.flower.local.Deployment`)."""

    port: int
    root_certificates: str | None
    workdir: Path

    def check_alive(self) -> None:
        """Raise when a process of the deployment has died."""
        ...


def _last_error(log: Path) -> str:
    """The ServerApp's last error line in its log (``""`` when none was logged)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("ERROR") or "Error:" in line]
    return errors[-1].strip() if errors else ""


class CalibrationLines:
    """The ServerApp's ``fedhv: calibration k/N`` lines, read from its log as it grows."""

    PATTERN = re.compile(rb"fedhv: calibration (\d+)/(\d+)")

    def __init__(self, log: Path | None) -> None:
        self.log, self.offset, self.last = log, 0, (-1, -1)

    def poll(self) -> tuple[int, int] | None:
        """The newest ``(k, N)`` when it changed since the last call, else ``None``."""
        if self.log is None:
            return None
        try:
            with open(self.log, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return None
        end = chunk.rfind(b"\n") + 1  # whole lines only
        self.offset += end
        found = self.PATTERN.findall(chunk[:end])
        if not found:
            return None
        latest = (int(found[-1][0]), int(found[-1][1]))
        if latest == self.last:
            return None
        self.last = latest
        return latest


#: Seconds the launcher keeps asking a SuperLink that does not answer before it gives up.
UNANSWERED_S = 10.0


def follow_run(dep: Deployment, run_id: int, run_dir: Path, rounds: int,
               progress: Callable[[int, int], None] | None, server_log: Path | None = None,
               calibration: Callable[[int, int], None] | None = None) -> None:
    """Wait for the run to finish, reporting rounds (and, with ``calibration``, FedHV's calibration
    rounds from the ServerApp's log); raise unless it completed with a summary (naming the
    ServerApp's last logged error and its log file)."""
    done, status, last_poll = -1, "", 0.0
    unanswered: float | None = None  # when the SuperLink first failed to answer a status query
    cal = CalibrationLines(server_log if calibration is not None else None)
    while True:
        dep.check_alive()
        seen = cal.poll()
        if seen is not None and calibration is not None:
            calibration(*seen)
        lines = _count_lines(run_dir / "rounds.jsonl")
        if progress is not None and lines != done:
            progress(lines, rounds)
        done = lines
        # once summary.json is written the ServerApp is ending: ask more often
        if time.monotonic() - last_poll > (0.2 if (run_dir / "summary.json").is_file() else 1.0):
            last_poll = time.monotonic()
            try:
                status = run_status(dep.port, run_id, dep.root_certificates)
                unanswered = None
            except Exception as exc:  # noqa: BLE001 - flwr's CLI turns transport errors into click errors
                # The SuperLink died (check_alive names it once its process is reaped) or is busy: ask
                # again for a while before giving up.
                unanswered = unanswered or time.monotonic()
                if time.monotonic() - unanswered > UNANSWERED_S:
                    dep.check_alive()
                    raise FlowerRunError(
                        f"the superlink on 127.0.0.1:{dep.port} did not answer for {UNANSWERED_S:.0f} s "
                        f"({type(exc).__name__}: {exc}); its log is {dep.workdir / 'superlink.log'}") from None
            if status.startswith("finished"):
                break
        time.sleep(0.2)
    if progress is not None:
        progress(_count_lines(run_dir / "rounds.jsonl"), rounds)
    if not status.endswith("completed") or not (run_dir / "summary.json").is_file():
        summary = run_dir / "summary.json"
        cause = _last_error(server_log) if server_log is not None else ""
        where = server_log if server_log is not None and server_log.is_file() else dep.workdir / "superlink.log"
        raise FlowerRunError(f"Flower run {run_id} ended {status or 'without a status'} and {summary} "
                             f"{'exists' if summary.exists() else 'is missing'}"
                             + (f"; the ServerApp failed with: {cause}" if cause else "")
                             + f"; the ServerApp's log is {where}")


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.endswith(b"\n"))
    except OSError:
        return 0


class Stopped(KeyboardInterrupt):
    """SIGTERM arrived; the CLI exits with ``128 + signum`` (143), as ``fedhv run`` does."""

    signum = int(signal.SIGTERM)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Stopped` (a ``KeyboardInterrupt``) in the block, so the deployment's
    processes are stopped on the way out."""

    def handler(signum: int, frame: object) -> None:
        raise Stopped(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
