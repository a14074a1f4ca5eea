"""fedhv's Flower ``ServerApp`` (``fedhv.flower.server:app``): a run directory from SuperNodes.

The app's run config (``[tool.flwr.app.config]`` of the generated app,
:mod:`fedhv.flower.local`) names:

- ``config``: path of a resolved fedhv configuration (``config.toml``), or
  ``resume``: path of an unfinished run directory to continue;
- ``out``: the run directory to create (empty = the default ``runs/...`` name);
- ``stage-timeout``: seconds a stage waits for replies (0 = until every client answered);
- ``node-wait``: seconds to wait for the SuperNodes to connect;
- ``log``: a file that receives the app's log, and the error of a failed run.

The run is :func:`fedhv.experiment.runner.run_experiment` (or ``resume_experiment``)
with a :class:`~fedhv.flower.federation.FlowerFederation` per round instead of the
simulator: the same run directory, checkpoints, evaluation (on the server's test set)
and summary as ``fedhv run``. A failure raises, so Flower marks the run failed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedhv import safe_io
from fedhv.config import dumps, to_dict
from fedhv.config.flower import refuse_on_flower
from fedhv.config.loader import config_from_toml_text
from fedhv.config.schema import RunConfig
from fedhv.experiment.checkpoint import config_digest
from fedhv.experiment.loop import FederationFactory
from fedhv.flower.federation import FlowerFederation, handshake
from fedhv.sim.faults import FaultInjector

app = ServerApp()
log = logging.getLogger("fedhv")


def federation_factory(grid: Grid, cfg: RunConfig, config_text: str, timeout: float | None,
                       node_wait: float = 120.0) -> FederationFactory:
    """Handshake with the SuperNodes, then build each round's :class:`FlowerFederation`."""
    from fedhv.data.benchmarks import BUILDERS
    from fedhv.data.user import user_benchmark
    from fedhv.objectives import as_tasks

    refuse_on_flower(cfg)
    nodes = handshake(grid, config_text, cfg.partition.clients, node_wait)
    sha, v = config_digest(config_text), cfg.validation
    ub = user_benchmark(cfg.data.benchmark)  # a user benchmark ("module:attr", importable on every host)
    num_tasks = len(as_tasks(ub.tasks)) if ub is not None else len(BUILDERS[cfg.data.benchmark].task_names)
    # which tasks' reports must be >= 0: a user's Task(nonnegative=...), every built-in benchmark's (CE / BCE)
    nonnegative = tuple(t.loss_nonnegative for t in as_tasks(ub.tasks)) if ub is not None else None

    def factory(clients: np.ndarray, round_idx: int, seed: int, stream: str) -> FlowerFederation:
        # the nodes inject the configured garbage (faults.corrupt_*, poison_updates) in training rounds,
        # as the simulator does; the server's copy only tells injected garbage from divergence
        f = cfg.faults
        faults = FaultInjector(corrupt_reports=f.corrupt_reports, corrupt_updates=f.corrupt_updates,
                               poison_updates=f.poison_updates, seed=seed, stream=stream) if stream == "train" else None
        if cfg.flower.secure_aggregation:  # SecAgg+: the server learns only the means (fedhv.flower.secure)
            from fedhv.flower.secure import SecureFlowerFederation

            return SecureFlowerFederation(grid, nodes, clients, round_idx, seed, stream, sha, num_tasks, cfg.flower,
                                          timeout, faults)
        return FlowerFederation(grid, nodes, clients, round_idx, seed, stream, sha, num_tasks, timeout,
                                v.max_update_norm, v.max_update_norm_ratio, faults, cfg.train.aggregation,
                                nonnegative)

    factory.engine = "sequential"  # type: ignore[attr-defined]  # what the nodes run (fedhv.flower.node)
    # environment.json["clients"]: what each client's node served (its own file and SHA-256, or samples)
    factory.provenance = {str(k): nodes.served.get(k, {}) for k in sorted(nodes.nodes)}  # type: ignore[attr-defined]
    return factory


class LogProgress:
    """A progress 'bar' that logs ``fedhv: <description> k/N`` (what ``flwr log`` shows)."""

    def __init__(self, total: int, description: str) -> None:
        self.total, self.description, self.n = total, description, 0
        log.info("fedhv: %s 0/%d", description, total)

    def update(self, k: int = 1) -> None:
        self.n += k
        log.info("fedhv: %s %d/%d", self.description, self.n, self.total)

    def close(self) -> None:
        pass


def round_line(total: int) -> Any:
    """An ``on_round`` hook logging ``fedhv: round t/T`` (and MeanAcc / WorstAcc when evaluated)."""
    def on_round(round_done: int, record: dict[str, Any]) -> None:
        ev = record.get("evaluation") or {}
        extra = "".join(f", {k} {ev[k]:.2f}" for k in ("mean_acc", "worst_acc") if isinstance(ev.get(k), float))
        skipped = ", skipped (no valid client reply)" if record.get("skipped") else ""
        log.info("fedhv: round %d/%d%s%s", round_done, total, extra, skipped)

    return on_round


def on_flower(cfg: RunConfig) -> RunConfig:
    """``cfg`` as a Flower run runs it: the nodes compute with the sequential engine
    (:mod:`fedhv.flower.node`), so the run's ``config.toml`` says ``engine = "sequential"``, as its
    ``summary.json`` does."""
    return dataclasses.replace(cfg, engine="sequential")


def serve(grid: Grid, run_config: dict[str, Any]) -> dict[str, Any]:
    """Run (or resume) one experiment over ``grid``; returns its summary."""
    from fedhv.experiment.runner import RunHooks, resume_experiment, run_experiment

    timeout = float(run_config.get("stage-timeout", 0)) or None
    node_wait = float(run_config.get("node-wait", 120))
    resume = str(run_config.get("resume", ""))
    if resume:
        from fedhv.experiment.code_check import check_resume_code
        from fedhv.flower.runconf import read_run_config

        accept = bool(run_config.get("accept-changed-code", False))
        text = read_run_config(resume)  # a link or a FIFO is refused before anything is read
        check_resume_code(Path(resume), text, accept)  # names the module; refuses changed code before importing it
        cfg = config_from_toml_text(text)
        factory = federation_factory(grid, cfg, text, timeout, node_wait)
        hooks = RunHooks(on_round=round_line(cfg.rounds), progress=LogProgress)
        return resume_experiment(resume, progress=False, federation_factory=factory, hooks=hooks,
                                 accept_changed_code=accept)
    cfg = on_flower(config_from_toml_text(safe_io.read_regular(str(run_config["config"]), safe_io.MiB * 16,
                                                               follow=True).decode()))
    text = dumps(to_dict(cfg))  # exactly what run_experiment writes to config.toml
    factory = federation_factory(grid, cfg, text, timeout, node_wait)
    out = str(run_config.get("out", "")) or None
    hooks = RunHooks(on_round=round_line(cfg.rounds), progress=LogProgress)  # what fedhv flower local follows
    return run_experiment(cfg, out, progress=False, federation_factory=factory, hooks=hooks)


def fast_pulls(cap_s: float = 0.2) -> None:
    """Retry the pulls of reply objects after 0.02 s growing to ``cap_s`` (flwr 1.42: 1 s to 10 s).

    A reply is listed as soon as the SuperLink has its header; when its objects (the
    update) are still being uploaded, Flower's grid waits a full second before asking
    again, which alone added up to a second per stage on loopback.
    """
    from flwr.superlink.grid import http_grid

    if not isinstance(http_grid.pull_objects, functools.partial):
        http_grid.pull_objects = functools.partial(http_grid.pull_objects, initial_backoff=0.02,
                                                   backoff_cap=cap_s)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """ServerApp entry point. With ``log`` in the run config, the app's log (and the error of
    a failed run, traceback included) also goes to that file: flwr 1.42 does not always
    keep a ServerApp's output anywhere the operator can read it."""
    logging.basicConfig(level=logging.INFO)
    # httpx logs every request at INFO; flwr forwards each log line to the SuperLink with a
    # request of its own (logged again), so its queue never empties and flwr-serverapp's exit
    # waits out flush_logs' 3 s timeout after every run.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    run_config = dict(context.run_config)
    path = str(run_config.get("log", ""))
    handler = None
    if path:
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)
    try:
        from fedhv._malloc import tune_allocator

        tune_allocator()  # this process is the run's (flwr-serverapp); as fedhv run does
        fast_pulls()
        summary = serve(grid, run_config)
        log.info("fedhv run finished: mean_acc %s, %s s per round", summary.get("mean_acc"),
                 summary.get("seconds_per_round"))
    except BaseException as e:
        log.exception("%s: %s", type(e).__name__, e)  # noqa: TRY401 - the one line an operator greps
        raise
    finally:
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()
