"""What the Flower test modules share: process bookkeeping by PID and the deployment fixture body.

Every deployment a test starts is checked on the way out: each process it started (the
group leaders and every member of their process groups, which includes the ServerApp
and ClientApp children) must be gone. Logs are kept, and their folder printed, when a
test of the module failed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import SMALL

HAVE_FLWR = importlib.util.find_spec("flwr") is not None
needs_flwr = pytest.mark.skipif(not HAVE_FLWR, reason="the Flower back-end needs flwr: pip install -e '.[test,flower]'")

NODES = 3
# One client per SuperNode; 2 of the 3 sampled per round (seed 2: {0,1}, {0,2}, {0,1}), so sampling matters.
EQUIV = [*SMALL, f"partition.clients={NODES}", "train.clients_per_round=2", "rounds=3", 'dtype="float64"',
         'engine="sequential"', "eval.test_period=3", "seed=2"]


def _proc_stats() -> dict[int, list[str]]:
    """pid -> the fields of ``/proc/PID/stat`` after the command name (state, ppid, pgrp, ...)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            out[int(entry)] = stat[stat.rindex(")") + 2:].split()
    return out


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie counts as gone)."""
    fields = _proc_stats().get(pid)
    return fields is not None and fields[0] != "Z"


def group_members(leaders: list[int]) -> set[int]:
    """Every process in the process groups led by ``leaders``."""
    groups = set(leaders)
    return {pid for pid, fields in _proc_stats().items() if int(fields[2]) in groups}


def descendants(root: int) -> set[int]:
    """Every live descendant of ``root``."""
    parents = {pid: int(fields[1]) for pid, fields in _proc_stats().items()}
    found: set[int] = set()
    frontier = {root}
    while frontier:
        kids = {p for p, pp in parents.items() if pp in frontier} - found
        found |= kids
        frontier = kids
    return found


def assert_gone(pids: set[int]) -> None:
    """Within 10 s, none of ``pids`` runs."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)], "processes left running after the deployment stopped"


@contextlib.contextmanager
def checked_deployment(request: pytest.FixtureRequest, nodes: int = NODES, min_procs: int = 0,
                       **kwargs: Any) -> Iterator[Any]:
    """A :func:`~fedhv.flower.local.local_deployment` for a fixture: no process survives it
    (at least ``min_procs`` were seen), logs kept and named when a test failed meanwhile."""
    from fedhv.flower.local import local_deployment

    failed = request.session.testsfailed
    with local_deployment(nodes, keep_workdir=True, **kwargs) as dep:
        yield dep
        seen = group_members(dep.pids) | set(dep.pids)  # includes the ServerApp / SuperExec processes
        assert len(seen) >= min_procs
    assert_gone(seen)
    if request.session.testsfailed == failed:
        shutil.rmtree(dep.workdir, ignore_errors=True)
    else:
        print(f"Flower logs kept in {dep.workdir}")


def rounds_of(run: Path) -> list[dict]:
    """The records of ``rounds.jsonl``."""
    return [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]


def theta_of(run: Path) -> torch.Tensor:
    """The final model of a run directory, flattened."""
    state = torch.load(run / "model.pt", weights_only=True)["state_dict"]
    return torch.cat([v.reshape(-1) for v in state.values()])
