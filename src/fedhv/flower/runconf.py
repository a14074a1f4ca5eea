"""The configuration side of a Flower run of fedhv: the setting with one client per SuperNode,
the generated app's ``pyproject.toml``, a run directory's configuration to resume, and the
default run directory name (shared by ``fedhv flower local`` and the Flower App)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedhv.config import load_config
from fedhv.config.flower import refuse_on_flower
from fedhv.config.loader import apply_overrides, build, load_setting
from fedhv.config.schema import RunConfig
from fedhv.flower.procs import FlowerRunError


def local_config(setting: str, nodes: int, overrides: Sequence[str] = ()) -> RunConfig:
    """The setting with one client per SuperNode: ``partition.clients = nodes`` and at most
    ``nodes`` clients per round (the configured count otherwise).

    The overrides are validated only together with ``partition.clients = nodes``: a
    ``train.clients_per_round`` above the preset's client count is valid on enough nodes.
    """
    if nodes < 1:
        raise FlowerRunError(f"--nodes {nodes}: need at least one SuperNode; give --nodes 1 or more")
    extra = [f"partition.clients={nodes}"]
    base = build(RunConfig, apply_overrides(load_setting(setting), [*overrides, *extra]))  # not validated yet
    if base.train.clients_per_round > nodes:
        extra.append(f"train.clients_per_round={nodes}")
    cfg = load_config(setting, [*overrides, *extra])
    refuse_on_flower(cfg)
    return cfg


def app_pyproject(run_config: dict[str, Any]) -> str:
    """The generated Flower app's ``pyproject.toml``."""
    cfg = "\n".join(f"{k} = {json.dumps(v)}" for k, v in run_config.items())
    return f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedhv-flower"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedhv"

[tool.flwr.app.components]
serverapp = "fedhv.flower.server:app"
clientapp = "fedhv.flower.client:app"

[tool.flwr.app.config]
{cfg}
"""


def resume_config(run_dir: str | Path) -> RunConfig:
    """The configuration of the run directory ``run_dir`` to resume (one-line error when it is none)."""
    from fedhv.config.loader import config_from_toml_text

    path = Path(run_dir) / "config.toml"
    if not path.is_file():
        raise FlowerRunError(f"--resume {run_dir}: no config.toml there; give the directory of a fedhv run")
    return config_from_toml_text(path.read_text())


def default_out(cfg: RunConfig) -> Path:
    """``runs/<setting>-<method>-s<seed>-flower-<time>`` (not created here: the ServerApp claims it)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{Path(cfg.setting).stem}-{cfg.method}-s{cfg.seed}-flower-{stamp}"
