"""Faults on a real Flower deployment: garbage replies, resume, a SuperNode killed mid-round."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedhv.config import load_config
from fedhv.experiment.kill_point import PAUSE_ENV, PAUSE_FILE
from fedhv.experiment.runner import run_experiment
from flower_support import EQUIV, HAVE_FLWR, NODES, rounds_of, theta_of

from conftest import SMALL
from helpers import cli

pytestmark = pytest.mark.skipif(not HAVE_FLWR, reason="the Flower back-end needs flwr: pip install -e '.[test,flower]'")
if HAVE_FLWR:
    from fedhv.flower.local import Deployment


def _paused_sim_run(cfg_args: list[str], run: Path, after: int) -> None:
    """A real ``fedhv run`` process stopped after round ``after`` (checkpoint written), then SIGKILLed."""
    sets = [x for item in cfg_args for x in ("--set", item)]
    env = {**os.environ, PAUSE_ENV: str(after)}
    proc = subprocess.Popen([sys.executable, "-m", "fedhv.cli", "run", "multimnist", *sets, "--out", str(run),
                             "--quiet"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (run / PAUSE_FILE).exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
    finally:
        proc.kill()  # by PID
        proc.wait(timeout=30)


def _samerounds_of(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x["clients"] == y["clients"]
        assert x.get("rejected") == y.get("rejected") and x.get("dropped") == y.get("dropped"), (x, y)
        assert x.get("skipped") == y.get("skipped")
        for key in ("weights", "report"):  # absent from a round without a valid reply
            assert (key in x) == (key in y), key
            if key in x:
                np.testing.assert_allclose(x[key], y[key], rtol=0, atol=1e-10)


@pytest.mark.needs_data
def test_resume_with_garbage_clients_matches_simulator(flower_deployment: Deployment, tmp_path: Path) -> None:
    """A run interrupted after round 1 (kill -9), resumed on Flower, whose nodes send the configured
    garbage (NaN / inf / short reports, truncated / non-finite updates): the same rejections,
    weights, reports and final model as an uninterrupted simulator run."""
    args = [*EQUIV, "rounds=4", "fedhv.reference=paper", "faults.corrupt_reports=0.3", "faults.corrupt_updates=0.2"]
    cfg = load_config("multimnist", args)
    sim = tmp_path / "sim"
    run_experiment(cfg, sim, progress=False)
    part = tmp_path / "part"
    _paused_sim_run(args, part, after=1)
    assert len(rounds_of(part)) == 1 and not (part / "summary.json").exists()
    flower_deployment.submit(None, resume=part)
    fr, sr = rounds_of(part), rounds_of(sim)
    assert [r["round"] for r in fr] == [1, 2, 3, 4]
    assert sum(r["rejected_clients"] for r in fr[1:]) >= 2  # the Flower rounds did reject garbage
    _samerounds_of(fr, sr)
    diff = float((theta_of(part) - theta_of(sim)).abs().max())
    assert diff <= 1e-10, diff
    assert json.loads((part / "summary.json").read_text())["rounds"] == 4


@pytest.mark.needs_data
def test_supernode_killed_mid_round_is_dropped(flower_deployment: Deployment, tmp_path: Path) -> None:
    """kill -9 of a SuperNode while it holds a round-2 message: that stage finishes with the other
    clients after the stage timeout, the loss is counted in ``dropped_clients`` and the run
    completes. Runs last: the deployment has one node less afterwards. The timeout is generous
    (a live node must answer within it even on a loaded machine): it is waited once."""
    timeout = 10.0
    cfg = load_config("multimnist", [*SMALL, f"partition.clients={NODES}", f"train.clients_per_round={NODES}",
                                     'method="uniform"', "rounds=2", "eval.test_period=2", "seed=5"])
    victim_name = f"supernode-{NODES - 1}"
    victim = next(p for name, p in flower_deployment.procs if name == victim_name)
    result: dict[str, Any] = {}

    def submit() -> None:
        try:
            result["run"] = flower_deployment.submit(cfg, tmp_path / "run", stage_timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            result["error"] = exc

    worker = threading.Thread(target=submit)
    worker.start()
    log = flower_deployment.workdir / f"{victim_name}.log"
    start = log.stat().st_size
    mark = re.compile(r"ROUND train-5-2\]\s*\n.*Receiving: train message")
    deadline = time.monotonic() + 120
    while worker.is_alive() and time.monotonic() < deadline:
        with open(log, "rb") as fh:
            fh.seek(start)
            if mark.search(fh.read().decode(errors="replace")):
                break
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)  # by PID, while round 2's stage is in flight
    worker.join(timeout=180)
    assert not worker.is_alive()
    if "error" in result:
        raise result["error"]
    rounds = rounds_of(result["run"])
    assert [r["dropped_clients"] for r in rounds] == [0, 1]
    assert rounds[1]["dropped"] == [NODES - 1] and rounds[1]["clients"] == list(range(NODES))
    assert all(r["rejected_clients"] == 0 for r in rounds)
    assert rounds[1]["time_client_s"] >= timeout  # waited the stage timeout for the dead node, not forever
    assert "weights" in rounds[1]  # the round completed with the two live clients
    assert json.loads((result["run"] / "summary.json").read_text())["rounds"] == 2


@pytest.mark.needs_data
def test_held_gradients_are_bound_to_their_model() -> None:
    """The ClientApp (real handlers, in process) uses held gradients for a first step only when they
    were computed at the stage's model: stale ones are refused, never silently used."""
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedhv.algorithms.base import Request
    from fedhv.config import dumps, to_dict
    from fedhv.flower import client
    from fedhv.flower.node import NodeError, config_sha
    from fedhv.flower.protocol import HELLO, UPDATE, stage_content

    cfg = load_config("multimnist", [*EQUIV, 'method="fedcmoo"'])
    text = dumps(to_dict(cfg))
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 7
    ctx = Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": NODES}, state=RecordDict(),
                  run_config={})

    def incoming(content: RecordDict, kind: str) -> Message:
        msg = Message(content, dst_node_id=7, message_type=kind)
        msg.metadata.__dict__["_message_id"] = msg.object_id
        return msg

    import fedhv

    client.hello(incoming(RecordDict({HELLO: ConfigRecord({"config": text, "fedhv-version": fedhv.__version__})}),
                          MessageType.QUERY), ctx)
    import torch

    d = sum(p.numel() for p in client.worker_for(text, 0, NODES).model.parameters())
    theta_a = torch.linspace(-0.1, 0.1, d, dtype=torch.float64)
    sha, w = config_sha(text), np.array([[0.5, 0.5]])

    def stage(theta: torch.Tensor, request: Request, idx: int) -> Message:
        return client.stage(incoming(stage_content(theta, request, 0, 2, "train", sha, 0, 2, idx),
                                     MessageType.TRAIN), ctx)

    grads = stage(theta_a, Request(gradients=np.eye(2), upload_gradients=False), 1)
    assert "gradients" in grads.content.array_records[UPDATE]
    first = torch.zeros(1, 1, d, dtype=torch.float64)  # only its presence matters: "first step from held"
    ok = stage(theta_a, Request(train=w, first_step=first, send_model=False), 2)  # the protocol's case
    assert "deltas" in ok.content.array_records[UPDATE]
    with pytest.raises(NodeError, match="holds none"):  # gradients of theta_a, a stage at theta_b
        stage(theta_a + 1e-3, Request(train=w, first_step=first), 2)


def test_flower_local_resume_usage_errors(tmp_path: Path) -> None:
    """``fedhv flower local --resume``: one-line errors for a non-run directory and extra settings."""
    res = cli("flower", "local", "--resume", str(tmp_path))
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1] == (
        f"error: --resume {tmp_path}: no config.toml there; give the directory of a fedhv run"), res.stderr
    res = cli("flower", "local", "multimnist", "--resume", str(tmp_path), "--set", "rounds=3")
    assert res.returncode == 2 and "drop SETTING, --set" in res.stderr and "Traceback" not in res.stderr
