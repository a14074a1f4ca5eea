"""The experiment grid on Ray: ``fedhv grid … --backend ray [--address ADDR]``.

Every calibration and every run is a Ray *task* (:mod:`fedhv.experiment.grid_ship`) with
``num_cpus = --cpus-per-run`` and ``num_gpus = --gpus-per-run`` (fractions let several small
runs share a device; Ray sets ``CUDA_VISIBLE_DEVICES`` for each task). A FedHV run that
needs a calibration takes the calibration task's result (an ``ObjectRef``) as an argument,
so Ray starts it once its calibration exists; a calibration already in ``OUT/calibration``
is read by the driver and passed by value. Each family's calibration is computed once, as
in the local grid.

The guarantees of the local grid (:func:`fedhv.experiment.grid.run_grid`) hold: the same
plan, checks and directory layout (finished runs skipped, partial runs resumed, a grid
whose folder holds runs of another configuration refused before anything runs), one
progress bar, and Ctrl-C / ``SIGTERM``: queued tasks are cancelled (never started) and
running ones are interrupted (``ray.cancel``, a ``KeyboardInterrupt`` in the task), so they
write a checkpoint (and ship it) before they end.

Faults: a task whose worker process or node dies is retried by Ray (``max_retries =
--retries``) and the retry resumes from the last checkpoint (in place, after the dead
worker's lock is released; or from the last shipped copy). A task that *fails* (an
exception of the run) is not retried: the grid reports it, as the local grid does.
The driver killed: the same command continues (finished runs skipped, partial resumed).

Without ``--address`` (and no ``RAY_ADDRESS``) the driver starts a new local Ray instance
with this machine's cores (or ``--num-cpus``) and stops it at the end; with ``--address``
(``auto``: the cluster this machine belongs to) it joins that cluster and leaves it running.

A local instance is loopback-only (:func:`loopback_only`): its node registers as 127.0.0.1
and its GCS, raylet, object manager, agents and workers listen on 127.0.0.1 only (checked
after start: a node registered elsewhere stops the grid). One driver per grid folder
(:func:`fedhv.experiment.grid_lock.driver_lock`); each finished run's ``grid-job.json``
records the storage mode its last attempt used (``"storage": "shared"`` or ``"ship"``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhv.errors import ConfigError, FedHVError
from fedhv.experiment.grid import (
    CalibrationJob,
    GridReport,
    GridTerminated,
    Job,
    _rounds_done,
    _summary_line,
    _terminate,
    prepare_grid,
)
from fedhv.experiment.grid_lock import driver_lock
from fedhv.experiment.grid_ship import PROBE, Collector, summary_of, task_calibration, task_job, write_probe
from fedhv.experiment.grid_watch import RAY_CHECK_ENV, runtime_env
from fedhv.procfs import start_ticks
from fedhv.results.runfiles import read_bytes_nofollow, write_json
from fedhv.safe_path import scoped_environ

log = logging.getLogger("fedhv")

#: Seconds a stopped grid waits for its running tasks to checkpoint before it leaves them.
STOP_GRACE_S = 60.0
#: Ray reads this variable when it is imported; ``0`` makes the node address Ray picks for a node
#: started here 127.0.0.1 (``ray._private.services.get_node_ip_address``), and Ray 2.55's GCS,
#: raylet, object manager, agents and workers then listen on 127.0.0.1 only (measured: without it
#: the node registers on the machine's routable address and they listen on every interface;
#: ``ray.init(_node_ip_address="127.0.0.1")`` alone is turned back into the routable address).
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: The only address a local instance may register or listen on.
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class RayOptions:
    """How the grid uses Ray (the ``fedhv grid`` flags of the same names)."""

    address: str | None = None  #: ``None``: a local Ray instance started (and stopped) by the driver
    cpus_per_run: float = 1.0
    gpus_per_run: float = 0.0
    storage: str = "auto"  #: ``auto``, ``shared`` or ``ship`` (:mod:`fedhv.experiment.grid_ship`)
    retries: int = 3  #: Ray's ``max_retries``: new attempts after a lost worker or node
    num_cpus: int | None = None  #: a local instance's CPUs (default: the machine's)

    def check(self) -> None:
        """One line naming the flag, the value and the fix."""
        if not self.cpus_per_run > 0:
            raise ConfigError(f"--cpus-per-run {self.cpus_per_run}: give a positive number of CPUs per run")
        if self.gpus_per_run < 0:
            raise ConfigError(f"--gpus-per-run {self.gpus_per_run}: give 0 (CPU runs) or a positive fraction")
        if self.gpus_per_run > 1 and self.gpus_per_run != int(self.gpus_per_run):
            raise ConfigError(f"--gpus-per-run {self.gpus_per_run}: above 1 Ray needs a whole number of GPUs")
        if self.storage not in ("auto", "shared", "ship"):
            raise ConfigError(f"--storage {self.storage!r}: choose auto, shared or ship")
        if self.retries < 0:
            raise ConfigError(f"--retries {self.retries}: give 0 or more")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ConfigError(f"--num-cpus {self.num_cpus}: give 1 or more")


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend ray needs Ray: pip install 'fedhv[ray]'") from None
    return ray


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """Within the block, a Ray node this process starts (``ray.init(address="local")``, Ray's
    ``cluster_utils``) binds and advertises 127.0.0.1 only: :data:`LOOPBACK_ENV` is ``0`` in the
    environment its processes inherit and in Ray's already-imported constants. Both are restored
    afterwards (the started node keeps its address)."""
    try:  # Ray's private constant, read at import; without it the variable alone (check_loopback decides)
        from ray._private import ray_constants
    except ImportError:  # pragma: no cover - another Ray layout
        ray_constants = None
    saved = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    if saved is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        with scoped_environ({LOOPBACK_ENV: "0"}):
            yield
    finally:
        if saved is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved


def keep_local_ray_on_loopback() -> bool:
    """From now on, a local Ray node this process (or a process it starts) starts binds and advertises
    127.0.0.1 only: :func:`loopback_only`'s settings, kept. For Flower's Simulation Engine, which calls
    ``ray.init()`` itself after loading the ClientApp's module (fedhv's Flower App and its Baseline call this
    when their module is loaded). Ray is not imported here: when it is not loaded yet, the variable alone
    decides. Nothing changes when ``RAY_ADDRESS`` names another machine's cluster (a cluster of the
    user's: it cannot be loopback-only); returns whether the setting was made."""
    address = os.environ.get("RAY_ADDRESS")
    if address and address != "local" and not _loopback_host(address):
        return False
    os.environ[LOOPBACK_ENV] = "0"
    ray_constants = sys.modules.get("ray._private.ray_constants")
    if ray_constants is not None and hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        ray_constants.ENABLE_RAY_CLUSTER = False
    return True


def _loopback_host(address: str) -> bool:
    """Whether ``address`` (``HOST:PORT``, optionally ``ray://``) names this machine's loopback."""
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_loopback(ray: Any) -> None:
    """Refuse a local instance whose nodes registered on an address other than 127.0.0.1."""
    addresses = sorted({str(n.get("NodeManagerAddress")) for n in ray.nodes() if n.get("Alive", True)})
    if addresses != [LOOPBACK]:
        raise ConfigError(f"the local Ray instance registered on {', '.join(addresses)}, not {LOOPBACK} only; "
                          f"fedhv keeps a local instance on the loopback: report this with your Ray version "
                          f"({getattr(ray, '__version__', '?')}), or start a cluster yourself and give --address")


def _connect(ray: Any, opts: RayOptions) -> None:
    """Start or join Ray. A local instance's workers watch this process: once it is killed a running
    task checkpoints and every worker exits (:mod:`fedhv.experiment.grid_watch`)."""
    if ray.is_initialized():
        return
    # CPU runs (num_gpus = 0) ask for no device; Ray's notice about hiding the GPUs from them is noise here
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    kwargs: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    address = opts.address or os.environ.get("RAY_ADDRESS")
    if address:  # join: ray.shutdown() then only disconnects this driver
        # a loopback-only instance (e.g. 127.0.0.1:6379): Ray would turn 127.0.0.1 into this machine's routable
        # address and never reach it
        with loopback_only() if _loopback_host(address) else contextlib.nullcontext():
            ray.init(address=address, **kwargs)
        return
    # its workers end with this process, after their checkpoint, by fedhv's watch rather than Ray's
    # raylet-death check (which would race the checkpoint): fedhv.experiment.grid_watch
    with loopback_only(), scoped_environ({RAY_CHECK_ENV: "0"}):
        ray.init(address="local", num_cpus=opts.num_cpus, include_dashboard=False,
                 runtime_env=runtime_env(os.getpid(), start_ticks(os.getpid())), **kwargs)  # never another's
    try:
        check_loopback(ray)
    except BaseException:
        ray.shutdown()
        raise


def run_grid_ray(jobs: list[Job], calibrations: list[CalibrationJob], out: Path, opts: RayOptions,
                 progress: bool = True) -> GridReport:
    """Run the grid's calibrations and jobs as Ray tasks (see the module docstring).

    Raises
    ------
    GridError
        When ``out`` holds runs of another configuration, or another driver runs a grid in
        ``out`` (nothing runs).
    KeyboardInterrupt
        After Ctrl-C / ``SIGTERM`` (:class:`GridTerminated`): queued tasks cancelled, running ones
        checkpointed.
    """
    opts.check()
    ray = _ray()
    out = out.resolve()
    with driver_lock(out):
        return _run_locked(ray, jobs, calibrations, out, opts, progress)


def _run_locked(ray: Any, jobs: list[Job], calibrations: list[CalibrationJob], out: Path, opts: RayOptions,
                progress: bool) -> GridReport:
    """:func:`run_grid_ray` once this driver holds ``out``'s lock."""
    from tqdm import tqdm  # type: ignore[import-untyped]

    start = time.perf_counter()
    report, todo_cal, todo, total = prepare_grid(jobs, calibrations, out)
    token = uuid.uuid4().hex
    write_probe(out, token)
    bar = tqdm(total=total, desc="grid (ray)", disable=not progress, dynamic_ncols=True, unit="round")
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    joined = ray.is_initialized()
    _connect(ray, opts)
    pending: dict[Any, tuple[str, Any]] = {}
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        collector = ray.remote(Collector).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)
        ).remote(str(out), [_rel(j, out) for j in todo])
        res = {"num_cpus": opts.cpus_per_run, "num_gpus": opts.gpus_per_run, "max_retries": opts.retries}
        cal_task = ray.remote(task_calibration).options(**res)
        job_task = ray.remote(task_job).options(**res)
        cal_refs: dict[str, Any] = {}
        for c in todo_cal:
            ref = cal_task.remote(c, opts.cpus_per_run)
            cal_refs[c.path] = ref
            pending[ref] = ("calibration", c)
        cal_done = 0
        for j in todo:
            cal: Any = None
            if j.calibration is not None:
                cal = cal_refs.get(j.calibration)
                if cal is None:  # computed earlier: read (and verified) here, passed by value
                    from fedhv.experiment.calibration import load_calibration

                    cal = load_calibration(j.calibration).as_dict()
            ref = job_task.remote(j, cal, str(out), token, opts.storage, opts.cpus_per_run, collector)
            pending[ref] = ("job", j)
        finished: set[str] = set()
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            for ref in ready:
                kind, item = pending.pop(ref)
                try:
                    value = ray.get(ref)
                except (ray.exceptions.TaskCancelledError, KeyboardInterrupt):
                    raise KeyboardInterrupt(f"{getattr(item, 'run_dir', getattr(item, 'path', ''))}: cancelled")
                except ray.exceptions.RayError as exc:
                    where = item.path if kind == "calibration" else item.run_dir
                    why = _reason(exc)
                    report.failed[where] = why
                    tqdm.write(f"failed: {where}: {why}")
                    if kind == "calibration":
                        _fail_dependants(pending, item.path, report, ray)
                    continue
                if kind == "calibration":
                    Path(item.path).parent.mkdir(parents=True, exist_ok=True)
                    write_json(Path(item.path), value)
                    cal_done += item.rounds
                else:
                    report.done.append(item.run_dir)
                    _record_storage(Path(item.run_dir), value.get("storage"))
                    tqdm.write(_summary_line(item.run_dir, summary_of(value)))
            for refusal in ray.get(collector.take_refusals.remote()):
                tqdm.write(f"warning: {refusal}")
            remote = ray.get(collector.all_progress.remote())
            done_rounds = sum(max(_rounds_done(j, finished), min(j.rounds, remote.get(_rel(j, out), 0)))
                              for j in jobs) + cal_done
            bar.n = min(total, done_rounds)
            bar.set_postfix_str(f"runs {len(report.done) + len(report.skipped)}/{len(jobs)} done, "
                                f"{len(report.failed)} failed", refresh=False)
            bar.refresh()
    except BaseException:
        _stop(ray, pending)
        raise
    finally:
        bar.close()
        (out / PROBE).unlink(missing_ok=True)
        if not joined:  # stops a local instance; only disconnects from a cluster
            ray.shutdown()
        if main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    report.seconds = time.perf_counter() - start
    return report


def _record_storage(run_dir: Path, mode: Any) -> None:
    """Add the storage mode the run's last attempt used to its ``grid-job.json``."""
    path = run_dir / "grid-job.json"
    try:
        record = json.loads(read_bytes_nofollow(path))
    except (OSError, ValueError, FedHVError) as exc:
        log.warning(f"{path}: storage mode {mode!r} not recorded ({exc})")
        return
    if isinstance(record, dict) and mode in ("shared", "ship"):
        write_json(path, {**record, "storage": mode})


def _rel(job: Job, out: Path) -> str:
    return os.path.relpath(job.run_dir, out)


def _reason(exc: BaseException) -> str:
    """A failed task's cause in one line (the run's own exception where Ray kept it)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"


def _fail_dependants(pending: dict[Any, tuple[str, Any]], path: str, report: GridReport, ray: Any) -> None:
    """The runs waiting for a failed calibration fail with it (they never start)."""
    for ref, (kind, item) in list(pending.items()):
        if kind == "job" and item.calibration == path:
            ray.cancel(ref, force=False)
            pending.pop(ref)
            report.failed[item.run_dir] = f"its calibration {path} failed"


def _stop(ray: Any, pending: dict[Any, tuple[str, Any]]) -> None:
    """Ctrl-C / SIGTERM / a driver failure: cancel the queue, interrupt running tasks so they
    checkpoint, wait for them up to :data:`STOP_GRACE_S` seconds (a second Ctrl-C: no wait)."""
    refs = list(pending)
    for ref in refs:
        with contextlib.suppress(Exception):  # already finished or gone
            ray.cancel(ref, force=False)
    try:
        deadline = time.monotonic() + STOP_GRACE_S
        while refs and time.monotonic() < deadline:
            _, refs = ray.wait(refs, num_returns=len(refs), timeout=max(0.1, deadline - time.monotonic()))
    except (KeyboardInterrupt, GridTerminated):
        pass
