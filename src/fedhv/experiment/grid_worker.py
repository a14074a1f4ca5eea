"""Lifecycle of the grid's worker processes: set-up, stop requests, dying with the parent.

A grid worker must never outlive the grid process that started it (a ``kill -9`` of the
parent would otherwise leave orphans writing into run directories that a re-run of the
grid writes into too), and a stop request (Ctrl-C, ``SIGTERM``) must end the running job
with a checkpoint and start no further job.

- **Stop request.** ``SIGINT`` and ``SIGTERM`` set a process-wide *stop* flag. The first
  one raises :class:`KeyboardInterrupt` in a running job, so the run loop writes a
  checkpoint of its last fully written round and re-raises; later ones are ignored (a
  second interrupt must not cut the checkpoint short). A job taken from the queue after
  the stop flag is set does nothing (:class:`JobCancelled`): no run directory is created.
  A job ended by any ``KeyboardInterrupt`` (e.g. the run loop's own ``SIGTERM``
  handling) is a stop request too. Once stopping, the worker ends (``os._exit``) as
  soon as no job runs, waiting at most :data:`STOP_GRACE_S` seconds for the running
  one; it never takes further work.
- **Parent death.** On Linux the kernel sends ``SIGINT`` to the worker when its parent
  dies (``prctl(PR_SET_PDEATHSIG)``): a stop request. As a portable fallback a daemon
  thread polls ``os.getppid()`` every :data:`PARENT_POLL_S` seconds and sends the stop
  request itself once the parent is gone (the parent's PID is passed in, so a parent
  that died before ``prctl`` took effect is noticed too).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.connection import wait as wait_for_ready
from types import FrameType
from typing import Any, TypeVar

from fedhv.experiment.signals import signals_blocked
from fedhv.safe_path import safe_child_path

#: Seconds between two checks of the parent's liveness.
PARENT_POLL_S: float = 0.25
#: Seconds a stopping worker waits for its running job to checkpoint before it exits.
STOP_GRACE_S: float = 60.0
#: ``PR_SET_PDEATHSIG`` from ``<linux/prctl.h>``.
_PR_SET_PDEATHSIG = 1

_stop = threading.Event()
_busy = threading.Event()

T = TypeVar("T")
#: The signals that ask a worker to stop.
STOP_SIGNALS: frozenset[int] = frozenset({signal.SIGINT, signal.SIGTERM})


class JobCancelled(RuntimeError):
    """A queued job that a worker skipped because the grid is stopping."""


def set_parent_death_signal(sig: int = signal.SIGINT) -> bool:
    """Ask the Linux kernel to send ``sig`` to this process when its parent dies.

    Returns
    -------
    bool
        Whether the request was installed (``False`` off Linux or without ``prctl``).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _on_stop_signal(signum: int, frame: FrameType | None) -> None:
    """First ``SIGINT`` / ``SIGTERM``: stop; interrupt a running job. Later ones: ignored."""
    if _stop.is_set():
        return
    _stop.set()
    if _busy.is_set():
        raise KeyboardInterrupt


def _watch(parent_pid: int) -> None:
    """Daemon thread: on a stop request or the parent's death, exit once no job runs."""
    while not _stop.is_set():
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGINT)  # handled by the main thread: a stop request
            _stop.wait(PARENT_POLL_S)
            break
        _stop.wait(PARENT_POLL_S)
    deadline = time.monotonic() + STOP_GRACE_S
    while _busy.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    logging.shutdown()
    # What a normal exit runs: multiprocessing's finalizers release the semaphores this
    # process registered (tqdm's lock), which the resource tracker would report as leaked.
    with contextlib.suppress(Exception):
        multiprocessing.util._exit_function()  # type: ignore[attr-defined]
    os._exit(1)


def spawning_workers() -> contextlib.AbstractContextManager[None]:
    """Block :data:`STOP_SIGNALS` in the calling thread while it may start workers.

    A worker inherits the signal mask, so a stop signal that reaches it while it is still
    starting up (importing torch, before :func:`init_worker` installed the handlers) stays
    pending and is handled as a stop request, instead of killing it with a traceback. In
    the parent such a signal is delivered when the block ends. Nothing is blocked where
    the platform has no signal masks (not POSIX). The workers start with a safe ``sys.path``
    (:func:`fedhv.safe_path.safe_child_path`): no module of the working directory is imported.
    """
    stack = contextlib.ExitStack()
    stack.enter_context(signals_blocked(STOP_SIGNALS))
    stack.enter_context(safe_child_path())
    return stack


def init_worker(threads: int, parent_pid: int) -> None:
    """Worker set-up: stop handling, parent-death watch, torch threads, allocator, quiet logging.

    Parameters
    ----------
    threads : int
        Torch threads of this worker.
    parent_pid : int
        PID of the grid process; the worker ends when it dies.
    """
    signal.signal(signal.SIGINT, _on_stop_signal)
    signal.signal(signal.SIGTERM, _on_stop_signal)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked by spawning_workers()
    set_parent_death_signal(signal.SIGINT)
    if os.getppid() != parent_pid:  # the parent died before the request was installed
        os._exit(1)
    threading.Thread(target=_watch, args=(parent_pid,), name="fedhv-stop-watch", daemon=True).start()
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    from fedhv._malloc import tune_allocator

    tune_allocator()
    torch.set_num_threads(threads)
    logging.getLogger("fedhv").setLevel(logging.ERROR)


def guarded(fn: Callable[..., T], *args: Any) -> T:
    """Run one job, unless a stop was requested; mark the worker busy while it runs.

    Raises
    ------
    JobCancelled
        When the grid is stopping: the job is not started.
    """
    _busy.set()
    try:
        if _stop.is_set():
            raise JobCancelled("the grid was stopped before this job started")
        return fn(*args)
    except KeyboardInterrupt:
        _stop.set()
        raise
    finally:
        _busy.clear()


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Stop the grid now: a stop request to every worker, cancel the queue, wait, kill stragglers.

    Workers checkpoint their running run and exit (:mod:`fedhv.experiment.grid_worker`);
    one still alive after ``STOP_GRACE_S`` seconds (or after a second Ctrl-C) is killed.
    """
    # A worker's sentinel becomes ready when it exits, so only live workers (whose PIDs
    # cannot have been reused) are signalled.
    processes = [p for p in dict(getattr(pool, "_processes", None) or {}).values()
                 if not wait_for_ready([p.sentinel], timeout=0)]
    for proc in processes:
        try:
            os.kill(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    pool.shutdown(wait=False, cancel_futures=True)
    sentinels = {proc.sentinel: proc for proc in processes}
    deadline = time.monotonic() + STOP_GRACE_S
    try:
        while sentinels and time.monotonic() < deadline:
            for ready in wait_for_ready(list(sentinels), timeout=max(0.0, deadline - time.monotonic())):
                sentinels.pop(ready)  # type: ignore[call-overload]
    except KeyboardInterrupt:
        pass  # a second Ctrl-C: do not wait for the checkpoints
    finally:
        for proc in sentinels.values():
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    pool.shutdown(wait=True)  # the workers are gone: let the pool release its queues
