"""A local Ray instance's workers end with the driver that started it, after their checkpoint.

A grid without ``--address`` starts a private Ray instance (:mod:`fedhv.experiment.grid_ray`).
When its driver is killed (``kill -9``), Ray's fate sharing takes the instance's raylet and
GCS with it, and each worker exits at its next *raylet-death check*. That check runs every
``raylet_death_check_interval_milliseconds`` counted from the worker's own start, not from
the raylet's death, so a worker in the middle of a run had anywhere between nothing and the
whole interval to write its checkpoint: with a 10 s interval one worker was given 2 s (its
log: started 10:22:47.29, raylet gone by 10:22:55.3, exit at 10:22:57.29), and on a loaded
machine the checkpoint sometimes lost that race.

fedhv makes the exit its own, so it happens in order:

1. The driver starts the instance with Ray's check switched off (interval ``0``,
   :data:`RAY_CHECK_ENV`) and a runtime environment naming itself (:data:`DRIVER_ENV`:
   ``pid:start-ticks``) and :func:`setup_worker` as the *worker process setup hook*, which
   every worker process of the job runs when it starts (:func:`runtime_env`).
2. The hook starts a daemon thread that looks at the driver every :data:`POLL_S` seconds (and gives
   the worker Python's ``SIGINT`` handler when it inherited the signal ignored, as a grid started
   in the background does: the interrupt below is a simulated ``SIGINT``).
3. When the driver is gone: a worker running no task exits at once; a worker running a grid
   task (:func:`task_scope`) gets a ``KeyboardInterrupt`` in its main thread, the run writes
   its checkpoint as on Ctrl-C, and the process exits as the task ends, or after
   :data:`GRACE_S` seconds at the latest (a task that never returns).

On a cluster (``--address``) none of this is set up: Ray ends a dead driver's tasks itself.
Nothing here imports ``ray``.

What this cannot prevent: the raylet's parent-death signal comes when the driver's thread that
started it exits, which can be a few milliseconds after the driver's sockets close. A raylet that
sees the closed socket first ends the driver's leased workers at once ("Killing leased worker because
its owner died" in ``raylet.out``; 6 ms from disconnect to exit where the raylet survives, under
``ray start``), before any checkpoint. Such a run keeps its last periodic checkpoint, as a ``fedhv run``
killed with ``kill -9`` does (docs/cluster.md).
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

from fedhv.procfs import alive

#: The runtime-environment variable naming a local instance's driver, ``"pid:start-ticks"``.
DRIVER_ENV = "FEDHV_RAY_DRIVER"
#: Ray's interval (ms) between a worker's raylet-death checks; ``0`` switches the check off.
RAY_CHECK_ENV = "RAY_raylet_death_check_interval_milliseconds"
#: Seconds between two looks at the driver.
POLL_S = 0.1
#: Seconds an interrupted task has to end (its checkpoint written) before its process exits anyway.
GRACE_S = 120.0
#: The exit status of a worker whose driver is gone.
EXIT_ORPHANED = 3

_lock = threading.Lock()
_running = 0
_orphaned = threading.Event()
_started = False


def runtime_env(pid: int, ticks: int | None) -> dict[str, object]:
    """The runtime environment of a local instance started by driver ``pid`` (``ray.init``'s
    ``runtime_env``): every worker runs :func:`setup_worker` and knows its driver."""
    return {"worker_process_setup_hook": f"{__name__}.setup_worker",
            "env_vars": {DRIVER_ENV: f"{pid}:{'' if ticks is None else ticks}"}}


def parse_driver(value: str) -> tuple[int, int | None]:
    """``"pid:ticks"`` (ticks may be empty) as ``(pid, ticks)``.

    Raises
    ------
    ValueError
        When ``value`` is not of that form (names the variable and the value).
    """
    pid, sep, ticks = value.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(pid), (int(ticks) if ticks else None)
    except ValueError:
        raise ValueError(f"{DRIVER_ENV}={value!r}: expected 'pid:start-ticks' (set by fedhv's grid driver)") from None


def setup_worker() -> None:
    """Ray's worker process setup hook for a local instance: watch the driver named by
    :data:`DRIVER_ENV` (nothing when it is unset; once per process)."""
    global _started
    value = os.environ.get(DRIVER_ENV)
    if not value:
        return
    with _lock:
        if _started:
            return
        _started = True
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL):
        # a grid started as a background job (`cmd &` in a script) passes SIGINT on ignored, and
        # _thread.interrupt_main() does nothing for an ignored signal: give the worker Python's own handler
        signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=watch, args=parse_driver(value), name="fedhv-driver-watch", daemon=True).start()


def watch(pid: int, ticks: int | None) -> None:
    """Return only by ending the process once driver ``(pid, ticks)`` is gone (see the module docstring)."""
    while alive(pid, ticks):
        time.sleep(POLL_S)
    with _lock:
        _orphaned.set()
        busy = _running > 0
    if not busy:
        os._exit(EXIT_ORPHANED)
    _thread.interrupt_main()  # the run checkpoints and re-raises; task_scope exits on the way out
    time.sleep(GRACE_S)
    os._exit(EXIT_ORPHANED)


@contextlib.contextmanager
def task_scope() -> Iterator[None]:
    """Mark a grid task running in this process. Leaving it after the driver is gone (the task
    ended, normally or by the watch's interrupt) ends the process: nothing waits for the result."""
    global _running
    with _lock:
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            orphaned = _orphaned.is_set()
        if orphaned:
            os._exit(EXIT_ORPHANED)


__all__ = ["DRIVER_ENV", "EXIT_ORPHANED", "GRACE_S", "RAY_CHECK_ENV", "parse_driver", "runtime_env",
           "setup_worker", "task_scope", "watch"]
