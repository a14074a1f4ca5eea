"""The fedhv Flower App: ``flwr run flower-app <connection>`` in simulation or deployment.

Components (``flower-app/pyproject.toml``): ``serverapp = "fedhv.flower.app:server_app"``,
``clientapp = "fedhv.flower.app:client_app"`` (the ClientApp of :mod:`fedhv.flower.client`).
The run options are Flower run-config keys (``[tool.flwr.app.config]``, overridden with
``flwr run … --run-config 'k=v …'``), read from ``context.run_config`` by :func:`app_options`:

================== ========================================================================
key                meaning
================== ========================================================================
``setting``        a preset name (``fedhv presets``) or a TOML file on the ServerApp's host
``method``         ``fedhv``, ``uniform``, ``fsmgda`` or ``fedcmoo``
``rounds``         rounds (0: the setting's)
``seed``           the run's seed
``set``            configuration overrides as TOML ``key = value`` statements, separated by ``;`` or new
                   lines (``"train.lr_local = 0.01; data.benchmark = 'pkg.mod:make'"``); parsed whole
                   (an error applies none); a key that another run-config key gives is an error
``clients``        clients (0: ask every SuperNode for its ``num-partitions`` first; N: skip that pass)
``out``            the run directory on the ServerApp's host (empty: ``runs/<setting>-<method>-s<seed>-flower-<time>``
                   under the ServerApp's working directory: give an absolute path)
``resume``         an unfinished run directory to continue (the other keys are then ignored)
``accept-changed-code`` with ``resume``: continue even when the module ``data.benchmark`` names changed
``data-dir``       the ServerApp's data folder (its test set); empty: ``FEDHV_DATA``
``stage-timeout``  seconds a stage waits for replies (0: until every client answered)
``node-wait``      seconds to wait for the SuperNodes
``config``         a resolved fedhv configuration (a run's ``config.toml``) on the ServerApp's host, in
                   place of ``setting`` / ``method`` / ``rounds`` / ``seed`` / ``set`` / ``clients`` (what
                   ``fedhv flower local`` gives: its clients are the configuration's)
``log``            a file that also receives the app's log and the error of a failed run (flwr 1.42
                   does not always keep a ServerApp's output anywhere the operator can read it)
================== ========================================================================

This is fedhv's one ServerApp: ``flwr run`` of the App and ``fedhv flower local`` (whose
generated app names it with a ``config`` and a ``log``) run the same code
(``fedhv.flower.server:app`` is this object too).

The partition of each SuperNode comes from its ``node_config`` (``partition-id``,
``num-partitions``): the Simulation Engine sets both for its virtual SuperNodes; a real
SuperNode is started with ``--node-config "partition-id=K num-partitions=N"`` (and
``data-path=FILE`` for data of its own). The ServerApp logs its progress (calibration rounds,
each round, the final metrics), which ``flwr run --stream`` / ``flwr log`` show.

``out`` / ``resume`` are claimed (locked, checked: busy, finished, a link, a FIFO, missing) before the
handshake makes any node load data.

Loading this module keeps a local Ray instance that this process starts later on 127.0.0.1
(:func:`fedhv.experiment.grid_ray.keep_local_ray_on_loopback`): the Simulation Engine loads the ClientApp's
module before it calls ``ray.init()``, which would otherwise listen on every interface.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedhv.config import dumps, to_dict
from fedhv.config.loader import config_from_toml_text
from fedhv.config.schema import RunConfig
from fedhv.experiment.grid_ray import keep_local_ray_on_loopback
from fedhv.flower.client import app as client_app
from fedhv.flower.federation import FlowerSetupError, ask_nodes
from fedhv.flower.protocol import INFO, NODE, as_int
from fedhv.flower.server import LogProgress, on_flower, round_line

# Flower's Simulation Engine loads this module, then starts Ray itself, on every interface by default (Ray has
# no authentication): keep a local Ray instance on 127.0.0.1 as fedhv's own Ray grid does (issue 52)
keep_local_ray_on_loopback()

server_app = ServerApp()
log = logging.getLogger("fedhv")

__all__ = ["AppOptions", "app_options", "client_app", "discover_partitions", "server_app"]

#: The app's run-config keys and their defaults (``flower-app/pyproject.toml`` holds the same).
DEFAULTS: dict[str, Any] = {"setting": "multimnist", "method": "fedhv", "rounds": 0, "seed": 0, "set": "",
                            "clients": 0, "out": "", "resume": "", "data-dir": "", "stage-timeout": 0.0,
                            "node-wait": 120.0, "accept-changed-code": False, "config": "", "log": ""}
#: The keys a ``config`` replaces (a resolved configuration says all of them).
CONFIG_KEYS = ("setting", "method", "rounds", "seed", "set", "clients")


@dataclass(frozen=True)
class AppOptions:
    """The app's run options, checked (one line naming the key, the value and the fix)."""

    setting: str
    method: str
    rounds: int
    seed: int
    overrides: tuple[str, ...]
    clients: int
    out: str
    resume: str
    data_dir: str
    stage_timeout: float
    node_wait: float
    accept_changed_code: bool = False
    config: str = ""
    log: str = ""


def app_options(run_config: dict[str, Any]) -> AppOptions:
    """:class:`AppOptions` from ``context.run_config`` (missing keys take :data:`DEFAULTS`).

    ``set`` is parsed whole as TOML (:func:`fedhv.flower.runconf.parse_set`): an error refuses every
    override; an override of a key a run-config key gives (``method``, ``seed``, ``setting``,
    ``partition.clients``, and ``rounds`` when ``rounds`` is given) is an error naming both. Numbers are
    checked as ``fedhv`` checks them: seeds in ``[0, 2**32)``, waits finite in ``[0, MAX_WAIT_S]``,
    ``clients`` 0 or ``[1, MAX_NODES]`` (:mod:`fedhv.config.flower`).
    """
    from fedhv.config.flower import check_nodes, check_wait
    from fedhv.config.validation import SEED_BOUND
    from fedhv.errors import ConfigError
    from fedhv.flower.procs import FlowerRunError
    from fedhv.flower.runconf import parse_set, set_conflicts

    unknown = sorted(set(run_config) - set(DEFAULTS))
    if unknown:
        raise FlowerSetupError(f"run config keys {unknown} are not fedhv app options; known: {sorted(DEFAULTS)}")
    rc = {**DEFAULTS, **run_config}

    def number(key: str, kind: type, low: float, high: float = float("inf")) -> Any:
        value = rc[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high or (
                kind is int and int(value) != value):
            bound = f">= {low}" if high == float("inf") else f"in [{low}, {high}]"
            raise FlowerSetupError(f"run config {key} = {value!r}: expected {kind.__name__} {bound}; give e.g. "
                                   f"--run-config '{key}={DEFAULTS[key]}'")
        return kind(value)

    def flag(key: str) -> bool:
        if not isinstance(rc[key], bool):
            raise FlowerSetupError(f"run config {key} = {rc[key]!r}: expected true or false")
        return bool(rc[key])

    def checked(key: str, check: Any) -> Any:
        try:
            return check(f"run config {key}", rc[key])
        except ConfigError as exc:
            raise FlowerSetupError(str(exc)) from None

    for key in ("config", "log"):
        if not isinstance(rc[key], str):
            raise FlowerSetupError(f"run config {key} = {rc[key]!r}: expected a path (a string)")
    if rc["config"]:
        given = [k for k in CONFIG_KEYS if k in run_config and run_config[k] != DEFAULTS[k]]
        if given:
            raise FlowerSetupError(f"run config config = {rc['config']!r} is a whole configuration, and {given} "
                                   "would change it; give either config or those keys")
    if not isinstance(rc["set"], str):
        raise FlowerSetupError(f"run config set = {rc['set']!r}: expected a string of TOML overrides, e.g. "
                               "--run-config 'set=\"train.lr_local = 0.01; eval.test_period = 5\"'")
    try:
        overrides = parse_set(rc["set"])
        given = {k: rc[k] for k in ("setting", "method", "seed", "clients")}
        set_conflicts(overrides, {**given, **({"rounds": rc["rounds"]} if rc["rounds"] else {})})
    except FlowerRunError as exc:
        raise FlowerSetupError(str(exc)) from None
    clients = number("clients", int, 0)
    if clients:
        checked("clients", check_nodes)
    return AppOptions(str(rc["setting"]), str(rc["method"]), number("rounds", int, 0),
                      number("seed", int, 0, SEED_BOUND - 1), overrides, clients, str(rc["out"]), str(rc["resume"]),
                      str(rc["data-dir"]), checked("stage-timeout", check_wait), checked("node-wait", check_wait),
                      flag("accept-changed-code"), str(rc["config"]), str(rc["log"]))


def discover_partitions(grid: Grid, wait_s: float) -> int:
    """The number of partitions the SuperNodes serve (their ``num-partitions``), once that many are
    connected: each new node is asked for its ``node_config`` (no data is loaded)."""
    log.info("fedhv: asking the SuperNodes for their partition count (give clients=N to skip this pass)")
    deadline = time.monotonic() + wait_s
    asked: set[int] = set()
    want: int | None = None
    while True:
        ids = set(grid.get_node_ids())
        new = sorted(ids - asked)
        if new:
            for reply in ask_nodes(grid, RecordDict({INFO: ConfigRecord({})}), new, deadline, "discover"):
                if reply.has_error():
                    raise FlowerSetupError(f"SuperNode {reply.metadata.src_node_id} failed discovery: "
                                           f"{reply.error.reason}")
                n = as_int(reply.content.config_records[NODE]["num-partitions"], "num-partitions")
                if want is not None and n != want:
                    raise FlowerSetupError(f"SuperNodes disagree on num-partitions ({want} and {n}); start every "
                                           "SuperNode with the same --node-config num-partitions")
                want = n
            asked |= set(new)
        if want is not None and len(ids) >= want:
            return want
        if time.monotonic() > deadline:
            raise FlowerSetupError(f"{len(ids)} SuperNodes connected within {wait_s:.0f} s" + (
                f" but they serve {want} partitions" if want else "") + "; start one SuperNode per partition")
        time.sleep(0.5)


def run_config_to_fedhv(opts: AppOptions, nodes: int) -> RunConfig:
    """The resolved configuration of a new run: the setting with the options, one client per
    partition unless ``clients`` says otherwise."""
    from fedhv.flower.runconf import local_config

    extra = [f'method="{opts.method}"', f"seed={opts.seed}"] + ([f"rounds={opts.rounds}"] if opts.rounds else [])
    return local_config(opts.setting, opts.clients or nodes, [*opts.overrides, *extra])


def serve_app(grid: Grid, run_config: dict[str, Any]) -> dict[str, Any]:
    """Run (or resume) the experiment the run config describes; returns its summary."""
    from fedhv.experiment.code_check import check_resume_code
    from fedhv.experiment.runner import RunHooks, claim_run_dir, resume_experiment, run_experiment
    from fedhv.flower.runconf import read_run_config
    from fedhv.flower.server import federation_factory
    from fedhv.results.runfiles import read_bytes_nofollow

    opts = app_options(run_config)
    if opts.data_dir:
        os.environ["FEDHV_DATA"] = opts.data_dir  # this process's (the server's) data only
    timeout = opts.stage_timeout or None
    if opts.resume:
        log.info("fedhv: resuming %s", opts.resume)
        run = held_run_dir(opts.resume)  # busy, a link, a FIFO, missing: refused before any node works
        try:
            if (run.path / "summary.json").exists():
                log.info("fedhv: %s is already complete (summary.json exists); nothing to resume", run.path)
                finished = json.loads(read_bytes_nofollow(run.path / "summary.json"))
                run.close()
                return {**finished, "run_dir": opts.resume}
            text = read_run_config(run.path, "run config resume")
            check_resume_code(run.path, text, opts.accept_changed_code)  # before the configuration imports it
            cfg = config_from_toml_text(text)
            hooks = RunHooks(on_round=round_line(cfg.rounds), progress=LogProgress)
            factory = federation_factory(grid, cfg, text, timeout, opts.node_wait)
        except BaseException:
            run.close()
            raise
        summary = resume_experiment(run, progress=False, federation_factory=factory, hooks=hooks,
                                    accept_changed_code=opts.accept_changed_code)
        return {**summary, "run_dir": opts.resume}
    if opts.config:  # a resolved configuration (fedhv flower local): its clients, no discovery pass
        cfg = on_flower(config_from_toml_text(read_config_file(opts.config)))
        nodes = cfg.partition.clients
    else:
        # clients given: no discovery pass (the handshake still checks every partition is served): at
        # 10,000 virtual SuperNodes each pass over the nodes costs minutes in Flower's message store
        nodes = opts.clients or discover_partitions(grid, opts.node_wait)  # asks node_config only: no data
        cfg = on_flower(run_config_to_fedhv(opts, nodes))  # config.toml: the engine the nodes run
    text = dumps(to_dict(cfg))
    log.info("fedhv: %s %s seed %d on %d SuperNodes, %d rounds", cfg.setting, cfg.method, cfg.seed, nodes, cfg.rounds)
    from fedhv.flower.runconf import default_out

    out = Path(opts.out or default_out(cfg)).resolve()
    if opts.out and Path(opts.out).is_symlink():
        raise FlowerSetupError(f"run config out = {opts.out!r} is a symbolic link (to {os.readlink(opts.out)}); "
                               "give the run directory itself")
    run = claim_run_dir(cfg, out)  # busy, finished, a file or FIFO: refused before the handshake loads data
    log.info("fedhv: run directory %s", out)
    try:
        factory = federation_factory(grid, cfg, text, timeout, opts.node_wait)
    except BaseException:
        run.abandon()
        raise
    hooks = RunHooks(on_round=round_line(cfg.rounds), progress=LogProgress)
    summary = run_experiment(cfg, run, progress=False, federation_factory=factory, hooks=hooks)
    return {**summary, "run_dir": str(out)}


def read_config_file(path: str) -> str:
    """The text of the configuration file ``config`` names (a FIFO or a device refused, 16 MiB at most)."""
    from fedhv import safe_io

    try:
        return safe_io.read_regular(path, safe_io.MiB * 16, follow=True).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FlowerSetupError(f"run config config = {path!r}: cannot read it ({exc}); give a fedhv config.toml "
                               "on the ServerApp's host") from None


def held_run_dir(resume: str) -> Any:
    """The run directory ``resume`` locked by this process (:class:`~fedhv.results.rundir.RunDir`); a
    link, a missing directory, a FIFO or a directory another process holds is refused with one line."""
    from fedhv.results.rundir import RunDir

    path = Path(resume)
    if path.is_symlink():
        raise FlowerSetupError(f"run config resume = {resume!r} is a symbolic link (to {os.readlink(path)}); give "
                               "the run directory itself")
    if not path.is_dir():
        raise FlowerSetupError(f"run config resume = {resume!r} is not a directory; give the directory of an "
                               "unfinished fedhv run")
    return RunDir(path)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """ServerApp entry point: the run, its progress and its final metrics in the run's log (and in
    the ``log`` file when the run config names one, the error of a failed run included)."""
    from fedhv._malloc import tune_allocator
    from fedhv.flower.server import fast_pulls

    logging.basicConfig(level=logging.INFO)
    # httpx logs every request at INFO; flwr forwards each log line to the SuperLink with a request of its
    # own (logged again), so its queue never empties and flwr-serverapp's exit waits out flush_logs' 3 s.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    log.setLevel(logging.INFO)
    run_config = dict(context.run_config)
    path = run_config.get("log", "")
    handler = None
    if isinstance(path, str) and path:
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)
    try:
        tune_allocator()  # this process is the run's (flwr-serverapp); as fedhv run does
        fast_pulls()
        summary = serve_app(grid, run_config)
        log.info("fedhv: finished: MeanAcc %s, WorstAcc %s, HV %s; run directory %s", summary.get("mean_acc"),
                 summary.get("worst_acc"), summary.get("hv"), summary.get("run_dir"))
    except BaseException as e:
        log.exception("%s: %s", type(e).__name__, e)  # noqa: TRY401 - the one line an operator greps
        raise
    finally:
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()
