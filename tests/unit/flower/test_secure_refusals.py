"""Secure aggregation refusals that need no deployment: what secure mode cannot mask, the
simulator refusing ``flower.secure_aggregation = true`` altogether (``fedhv run`` / ``--resume`` /
grid / Python API), SuperNodes started for secure runs refusing plain stages, and the CLI's
one-line errors. The deployment tests are in ``tests/e2e/flower/test_flower_secagg.py``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedhv.config import dumps, load_config, to_dict
from fedhv.errors import ConfigError
from flower_support import HAVE_FLWR, needs_flwr

from conftest import SMALL
from helpers import cli

if HAVE_FLWR:
    from fedhv.flower.local import FlowerRunError, local_deployment

def test_secure_mode_refuses_what_it_cannot_mask() -> None:
    base = ["flower.secure_aggregation=true"]
    for extra, pattern in (
        (['method="fedcmoo"'], "method = 'fedcmoo': FedCMOO's gradient stage needs every client's own gradients"),
        (["validation.max_update_norm_ratio=3"], "validation.max_update_norm_ratio = 3.0 with flower.secure"),
        (["train.clients_per_round=1"], "train.clients_per_round = 1 with flower.secure_aggregation = true"),
        (["flower.num_shares=2"], "flower.num_shares = 2: an integer must be between 3"),
        (["flower.reconstruction_threshold=1.5"], r"flower.reconstruction_threshold = 1.5: a fraction"),
        (["flower.clipping_range=0"], "flower.clipping_range = 0.0 must be a positive number"),
    ):
        with pytest.raises(ConfigError, match=pattern):
            load_config("multimnist", [*base, *extra])
    load_config("multimnist", ['method="fedcmoo"'])  # not secure: fine


REFUSED = "error: flower.secure_aggregation = true: secure aggregation is a Flower deployment mode"


def _secure_run_dir(path: Path) -> str:
    """A run directory as an interrupted secure Flower run leaves it before round 1: its config.toml."""
    path.mkdir()
    text = dumps(to_dict(load_config("multimnist", [*SMALL, "flower.secure_aggregation=true"])))
    (path / "config.toml").write_text(text)
    return text


def test_simulator_refuses_secure_aggregation_cli(tmp_path: Path) -> None:
    """``fedhv run`` with ``flower.secure_aggregation = true`` fails with one line
    naming the key and the fix, before any run directory is created (``--resume``: the API test)."""
    out = tmp_path / "run"
    res = cli("run", "multimnist", "--set", "flower.secure_aggregation=true", "--out", str(out), "--quiet",
              cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines() == [
        (f"{REFUSED} and the simulator would see every client's update and report; run it with `fedhv flower "
         "local multimnist --secure`, or set flower.secure_aggregation = false")]
    assert not out.exists() and "run directory" not in res.stdout


def test_simulator_refuses_secure_aggregation_api(tmp_path: Path) -> None:
    """The Python entry points of the simulator refuse it too: ``run_experiment`` (leaving no run
    directory), ``resume_experiment`` (what ``fedhv run --resume`` and grids call; naming ``fedhv
    flower local --resume DIR``, touching no file of DIR) and ``plan_grid`` (before any calibration)."""
    from fedhv.experiment.grid import plan_grid
    from fedhv.experiment.runner import resume_experiment, run_experiment

    cfg = load_config("multimnist", [*SMALL, "flower.secure_aggregation=true", 'method="uniform"'])
    with pytest.raises(ConfigError, match="flower.secure_aggregation = true: secure aggregation is a Flower"):
        run_experiment(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    part = tmp_path / "part"
    text = _secure_run_dir(part)
    with pytest.raises(ConfigError, match=re.escape(f"resume it with `fedhv flower local --resume {part}`, or set")):
        resume_experiment(part, progress=False)
    assert sorted(p.name for p in part.iterdir() if p.name != ".lock") == ["config.toml"]
    assert (part / "config.toml").read_text() == text
    with pytest.raises(ConfigError, match="run it with `fedhv flower local multimnist --secure`"):
        plan_grid(["multimnist"], ["fedhv"], [0], tmp_path / "grid", ["flower.secure_aggregation=true"])


@needs_flwr
def test_secure_nodes_refuse_plain_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SuperNode started for secure runs (``--node-config secure-aggregation=true``) answers a plain
    stage message with an error, before computing anything: it never sends an unmasked reply."""
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedhv.flower.client import stage
    from fedhv.flower.node import NodeError

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):  # as a ServerApp process sets them
        monkeypatch.setattr(TaskIdentity, name, value)
    msg = Message(RecordDict({"fedhv.stage": ConfigRecord({"round": 0})}), dst_node_id=1,
                  message_type=MessageType.TRAIN)
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 2,
                                                        "secure-aggregation": True},
                      state=RecordDict(), run_config={})
    with pytest.raises(NodeError, match="secure-aggregation=true and answers only SecAgg\\+ stages"):
        stage(msg, context)


@needs_flwr
def test_secure_cli_refuses_fedcmoo_with_one_line(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "fedhv.cli", "flower", "local", "multimnist", "--nodes", "2",
                          "--secure", "--method", "fedcmoo"], capture_output=True, text=True, timeout=120, check=False,
                         cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith(
        "error: flower.secure_aggregation = true with method = 'fedcmoo'")


@needs_flwr
def test_auth_without_tls_is_a_one_line_error() -> None:
    with pytest.raises(FlowerRunError, match=r"--auth without --tls.*add --tls"), local_deployment(1, auth=True):
        pass
