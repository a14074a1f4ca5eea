"""Every process of a local Flower deployment dies with it, whatever ends the launcher.

Flower starts processes fedhv does not start itself: the SuperLink starts its SuperExec
(``start_new_session=True``), the SuperExec starts the ServerApp in a session of its own,
and a SuperNode under ``--isolation subprocess`` starts a ``flwr-clientapp`` per message.
When the launcher (``fedhv flower local``) is killed with ``SIGKILL``, or the SuperLink
dies first, those processes are orphaned: process groups and parent links no longer
reach them, and the ServerApp ignores ``SIGTERM`` while it retries a SuperLink that is
gone, holding the run directory's lock.

The design:

- **A mark.** Every process of a deployment carries ``FEDHV_DEPLOYMENT=<token>`` in its
  environment (the launcher sets it for what it starts; Flower passes its environment on
  to every process it starts). :func:`marked` finds them in ``/proc/PID/environ`` however
  they were re-parented or re-grouped; :func:`sweep` stops them (``SIGTERM``, then
  ``SIGKILL`` after a grace period, repeated until none is left, so a process started
  during the sweep is caught too).
- **A watchdog** (``python -m fedhv.flower.lifetime``), started by the launcher before any
  Flower process, in a session of its own and without the mark. It polls
  ``os.getppid()`` (no PID-reuse race: it is the launcher's child) and, once the launcher
  is gone, sweeps the deployment and removes its work directory (certificates, keys,
  logs). On a normal stop the launcher sweeps itself and then ends the watchdog with
  ``SIGTERM`` (which sweeps once more).
- **Parent checks that do not depend on Flower's retry loop**: :func:`watch_parent` runs a
  thread that exits the process when a given PID (with its start time, so a reused PID is
  not mistaken for it) is gone; the long-lived ClientApp process uses it for its SuperNode.

Linux (``/proc``) only; elsewhere :func:`marked` finds nothing and the launcher's own
process-group kills are all there is.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from fedhv import procfs
from fedhv.procfs import alive, descendants, start_ticks  # re-exported: this module's names before procfs

__all__ = ["MARK", "alive", "descendants", "mark_of", "marked", "signal_all", "start_ticks", "sweep", "watch_parent"]

MARK = "FEDHV_DEPLOYMENT"


def mark_of(pids: Iterable[int]) -> str | None:
    """The ``FEDHV_DEPLOYMENT`` mark of the first of ``pids`` that carries one."""
    prefix = f"{MARK}=".encode()
    for pid in pids:
        for item in procfs.environ(pid) or ():
            if item.startswith(prefix):
                return item[len(prefix):].decode()
    return None


def marked(token: str, exclude: Iterable[int] = ()) -> list[int]:
    """PIDs of live processes whose environment holds ``FEDHV_DEPLOYMENT=token`` (not ``exclude``)."""
    needle = f"{MARK}={token}".encode()
    skip = {os.getpid(), *exclude}
    found = []
    for pid in procfs.pids():
        if pid in skip:
            continue
        env = procfs.environ(pid)  # None: gone, or another user's
        if env is not None and needle in env and alive(pid):
            found.append(pid)
    return found


def signal_all(pids: Iterable[int], signum: int) -> None:
    """Send ``signum`` to each of ``pids`` (one already gone, or another user's, is skipped)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def sweep(token: str, grace_s: float = 3.0, exclude: Iterable[int] = (), rounds: int = 20) -> list[int]:
    """Stop every process marked with ``token``: ``SIGTERM``, wait up to ``grace_s``, ``SIGKILL``.

    Repeated (at most ``rounds`` times) until no marked process is left, so one started while
    the sweep runs is stopped as well. The descendants of marked processes are stopped with
    them, marked or not (Ray's agents under a raylet drop the environment: they were orphaned
    when only the raylet was killed). Returns the PIDs signalled.
    """
    exclude = tuple(exclude)
    seen: list[int] = []
    for _ in range(rounds):
        pids = marked(token, exclude)
        if not pids:
            break
        skip = {os.getpid(), *exclude, *pids}
        pids += sorted({d for p in pids for d in descendants(p)} - skip)
        seen += [p for p in pids if p not in seen]
        signal_all(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.05)
        signal_all([p for p in pids if alive(p)], signal.SIGKILL)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.02)
    return seen


def watch_parent(pid: int, ticks: int | None = None, poll_s: float = 0.2, code: int = 0) -> threading.Thread:
    """A daemon thread that ends this process (``os._exit(code)``) once process ``pid`` is gone.

    It checks ``/proc`` itself, so it works while the main thread is blocked (for example
    in Flower's unbounded connection retries). ``ticks``: ``pid``'s start time
    (:func:`start_ticks`, read now when ``None``), so a reused PID does not keep it alive.
    """
    if ticks is None:
        ticks = start_ticks(pid)

    def watch() -> None:
        while alive(pid, ticks):
            time.sleep(poll_s)
        sys.stderr.flush()
        os._exit(code)

    thread = threading.Thread(target=watch, name=f"watch-parent-{pid}", daemon=True)
    thread.start()
    return thread


def run_watchdog(token: str, parent: int, workdir: Path | None, poll_s: float = 0.1) -> int:
    """The watchdog's loop: wait until ``parent`` is gone (or ``SIGTERM``), then sweep and clean up."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the launcher's to handle
    while os.getppid() == parent and not stop.is_set():
        stop.wait(poll_s)
    orphaned = not stop.is_set()
    sweep(token)
    if orphaned and workdir is not None:  # the launcher could not clean up: its keys and logs go too
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="stop a local Flower deployment's processes when its launcher ends")
    parser.add_argument("--token", required=True, help=f"the deployment's {MARK} value")
    parser.add_argument("--parent", type=int, required=True, help="the launcher's PID (this process's parent)")
    parser.add_argument("--workdir", default=None, help="removed when the launcher died without cleaning up")
    args = parser.parse_args(argv)
    return run_watchdog(args.token, args.parent, Path(args.workdir) if args.workdir else None)


if __name__ == "__main__":
    sys.exit(main())
