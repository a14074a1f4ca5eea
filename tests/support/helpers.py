"""Small real-data setups for engine and algorithm tests."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import torch

from fedhv.algorithms import Replies, Request
from fedhv.config import load_config
from fedhv.config.schema import RunConfig
from fedhv.data.federated import FederatedData
from fedhv.experiment.setup import federated_data

from conftest import SMALL

_CACHE: dict[tuple[str, ...], FederatedData] = {}


def small_config(*overrides: str, setting: str = "multimnist") -> RunConfig:
    return load_config(setting, [*SMALL, *overrides])


def small_data(cfg: RunConfig) -> FederatedData:
    key = (cfg.data.benchmark, cfg.dtype, str(cfg.partition), str(cfg.data.augment))
    if key not in _CACHE:
        _CACHE[key] = federated_data(cfg)
    return _CACHE[key]


class ScriptedFederation:
    """Returns prepared replies and records the requests: isolates server-side logic."""

    def __init__(self, clients: np.ndarray, replies: list[Replies]) -> None:
        self._clients = clients
        self._replies = list(replies)
        self.requests: list[Request] = []
        self.up = 0
        self.down = 0

    @property
    def clients(self) -> np.ndarray:
        return self._clients

    def exchange(self, theta: torch.Tensor, request: Request) -> Replies:
        self.requests.append(request)
        return self._replies.pop(0)

    def count_uplink(self, n: int) -> None:
        self.up += n

    def count_downlink(self, n: int) -> None:
        self.down += n

    def relay(self, down_bytes: int, up_bytes: int) -> None:
        self.down += down_bytes
        self.up += up_bytes


def cli(*args: str, env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """``fedhv ARGS`` in this process: :func:`fedhv.cli.main` with its standard streams captured.

    What ``python -m fedhv.cli ARGS`` does (``sys.exit(main(ARGS))``) without the process start
    and torch import (about 1.5 CPU-seconds each on the test machine); for tests of messages,
    exit codes and outputs, not of signals or process lifetimes (those start real processes).
    ``env`` is set for the call and ``cwd`` entered; the logging and warning state and the torch thread count
    that ``main`` sets up are restored afterwards. An exception ``main`` does not turn into an exit code
    propagates (a real process would print its traceback).
    """
    import contextlib
    import io
    import logging
    import warnings

    from fedhv.cli import main

    out, err = io.StringIO(), io.StringIO()
    logger = logging.getLogger("fedhv")
    saved_logger = (list(logger.handlers), logger.level, logger.propagate)
    saved_env = {k: os.environ.get(k) for k in (env or {})}
    saved_cwd = os.getcwd()
    threads = torch.get_num_threads()
    code: int | str | None
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            formatwarning = warnings.formatwarning
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code
            finally:
                warnings.formatwarning = formatwarning
    finally:
        os.chdir(saved_cwd)
        torch.set_num_threads(threads)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        logger.handlers[:] = saved_logger[0]
        logger.setLevel(saved_logger[1])
        logger.propagate = saved_logger[2]
    returncode = code if isinstance(code, int) else (0 if code is None else 1)
    return subprocess.CompletedProcess(["fedhv", *args], returncode, out.getvalue(), err.getvalue())


def from_a_shell(cmd: list[str]) -> list[str]:
    """``cmd`` run with the signal state a terminal's shell gives a command (SIGINT default, nothing
    blocked), whatever the test process inherited: a Python trampoline that resets both and
    ``exec``s ``cmd`` in the same process (its PID is the one the test signals)."""
    import sys

    reset = ("import os, signal, sys; signal.pthread_sigmask(signal.SIG_SETMASK, []); "
             "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])")
    return [sys.executable, "-c", reset, *cmd]


def signal_state(pid: int) -> str:
    """``SigBlk`` / ``SigIgn`` / ``SigCgt`` of a process (for a failure message)."""
    from pathlib import Path

    try:
        return " ".join(x.replace("\t", "") for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                        if x.startswith(("SigBlk", "SigIgn", "SigCgt")))
    except OSError:
        return "gone"


class _Stop(Exception):
    """Raised by :func:`assert_resume_is_bit_identical`'s patched checkpoint writer."""


def assert_resume_is_bit_identical(cfg: RunConfig, root: os.PathLike[str] | str, monkeypatch: object,
                                   stop_after: int = 2) -> None:
    """Run ``cfg`` whole, and again interrupted right after the checkpoint of round ``stop_after`` and
    resumed; the two runs' metrics, rounds, summary and model must be equal bit for bit."""
    from pathlib import Path

    import pytest

    from fedhv.experiment import resume_experiment, run_experiment
    from fedhv.experiment import runner as runner_module
    from unit.experiment.test_resume import _assert_same_run

    full, part = Path(root) / "full", Path(root) / "part"
    run_experiment(cfg, full, progress=False)
    real = runner_module.save_checkpoint

    def stop(run_dir: Path, ckpt: object) -> None:
        real(run_dir, ckpt)
        if ckpt.round == stop_after:
            raise _Stop

    monkeypatch.setattr(runner_module, "save_checkpoint", stop)  # type: ignore[attr-defined]
    with pytest.raises(_Stop):
        run_experiment(cfg, part, progress=False)
    monkeypatch.undo()  # type: ignore[attr-defined]
    resume_experiment(part, progress=False)
    _assert_same_run(full, part)
