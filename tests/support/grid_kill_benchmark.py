"""User benchmarks whose loading kills the worker process that loads them (issue 28, an OOM-killed grid worker).

- ``grid_kill_benchmark:once``: the first load (no file at ``$FEDHV_TEST_KILL_MARK`` yet) creates
  that file and kills its own process with SIGKILL, as the out-of-memory killer would; later
  loads return a small benchmark;
- ``grid_kill_benchmark:always``: every load kills its process;
- ``grid_kill_benchmark:tiny``: never kills.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch
from torch import nn

import fedhv


def tiny() -> fedhv.UserBenchmark:
    x = torch.randn(240, 4, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    return fedhv.UserBenchmark(tasks=[fedhv.Task("a", size=2)], train=(x[:200], [y[:200]]), test=(x[200:], [y[200:]]),
                               model=lambda: nn.Linear(4, 2), version="1")


def once() -> fedhv.UserBenchmark:
    mark = Path(os.environ["FEDHV_TEST_KILL_MARK"])
    try:
        fd = os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return tiny()
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def always() -> fedhv.UserBenchmark:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


#: A seconds-long setting for the grid tests of these benchmarks.
TINY = ("rounds = 3\n[partition]\nclients = 4\nsamples_per_client = 40\n[train]\nclients_per_round = 2\n"
        "batch_size = 8\nlocal_steps = 2\n[lr.uniform]\nglobal = 1.0\nlocal = 0.1\n[eval]\ntest_period = 1\n")


def write_setting(path: Path, factory: str, name: str | None = None) -> Path:
    """A tiny grid setting at ``path`` whose data is ``grid_kill_benchmark:<factory>``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    head = f'setting = "{name}"\n' if name else ""
    path.write_text(head + TINY + f'[data]\nbenchmark = "grid_kill_benchmark:{factory}"\n')
    return path
