"""Provenance of a run: versions, git revision, host, data."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fedhv
from fedhv import procfs
from fedhv.config.schema import RunConfig
from fedhv.results.runfiles import read_bytes_nofollow

#: Command-line options whose value is a secret (flwr-serverapp's ``--token`` authenticates it to the SuperLink).
SECRET_OPTIONS = ("--token",)


def redacted_argv(argv: list[str]) -> list[str]:
    """``argv`` with the values of :data:`SECRET_OPTIONS` replaced by ``"<redacted>"``."""
    out: list[str] = []
    hide = False
    for arg in argv:
        if hide:
            out.append("<redacted>")
            hide = False
        elif arg in SECRET_OPTIONS:
            out.append(arg)
            hide = True
        elif arg.split("=", 1)[0] in SECRET_OPTIONS and "=" in arg:
            out.append(arg.split("=", 1)[0] + "=<redacted>")
        else:
            out.append(arg)
    return out


def git_revision() -> str | None:
    """The git commit of the fedhv source tree, if it is a git checkout."""
    here = Path(fedhv.__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here, capture_output=True, text=True, timeout=5, check=False,
        ).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


#: Environment variables that change which float kernels torch, MKL and oneDNN run.
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def cpu_model() -> str | None:
    """The CPU model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere), or ``None``."""
    line = procfs.cpuinfo_line("model name")
    if line is not None:
        return line.split(":", 1)[1].strip()
    return platform.processor() or None


def kernel_fingerprint() -> dict[str, Any]:
    """What decides the float bits of a CPU run besides the code and the seed.

    fedhv's random draws (partition, clients, batches, angles, flips, dropout masks) are
    integer and boolean draws from CPU generators and do not depend on the machine; the
    float results do: torch picks its vectorised kernels by CPU capability (AVX2,
    AVX512, ...) and MKL / oneDNN by instruction set, so the same run on two CPUs
    differs from the first round on by float32 round-off, which 200 rounds amplify to
    tenths of a percent of accuracy. Runs are bit-exact only when this dict is equal.
    """
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_model": cpu_model(),
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
        # fedhv's compiled kernels: on or off, and which build (another switch changes the float bits)
        "native": native_record(),
    }


def native_record() -> dict[str, Any]:
    """``{"enabled": FEDHV_NATIVE's switch, "library": kernels-<key>.so or None (no compiler)}``."""
    from fedhv.models import native
    from fedhv.models.native.build import library_identity

    on = native.enabled()
    return {"enabled": on, "library": library_identity() if on else None}


def environment(provenance: dict[str, Any] | None = None,
                clients: dict[str, Any] | None = None) -> dict[str, Any]:
    """Versions and machine facts for ``environment.json``.

    Parameters
    ----------
    provenance : dict, optional
        The data provenance (``FederatedData.provenance``), stored under ``"data"``: the
        data root, source files with sizes and digests, warnings (e.g. a CelebA subset,
        or the derived cache standing in for missing sources), the cache file used or
        built and the sample counts. Recorded on every run, not only when the cache is built.
    clients : dict, optional
        What the clients themselves serve when they are not the simulator's (a Flower run:
        per client id, its node's sample count and, for data of its own, the file and its
        SHA-256), stored under ``"clients"``.
    """
    env: dict[str, Any] = {
        "fedhv": fedhv.__version__,
        "git_revision": git_revision(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "processor": platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "kernels": kernel_fingerprint(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": redacted_argv(sys.argv),
    }
    if provenance is not None:
        env["data"] = provenance
    if clients is not None:
        env["clients"] = clients
    return env


def recorded_kernels(path: Path) -> dict[str, Any] | None:
    """``kernels`` from the run's ``environment.json`` (None when absent or unreadable)."""
    try:
        value = json.loads(read_bytes_nofollow(path / "environment.json")).get("kernels")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, dict) else None


def recorded_threads(path: Path) -> int | None:
    """``torch_threads`` from the run's ``environment.json`` (None when absent or unreadable)."""
    try:
        value = json.loads(read_bytes_nofollow(path / "environment.json")).get("torch_threads")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def chunk_record(cfg: RunConfig, engine: object) -> dict[str, Any]:
    """How many model copies the engine trains at once (``environment.json["engine_chunk"]``; a
    resume's in its ``resumes.jsonl`` record).

    Batched engine, ``engine_chunk = "auto"``: ``{"auto": true, "chunk": c, "copy_bytes",
    "available_bytes", "fraction", "splits_round": c < train.clients_per_round}``
    (:mod:`fedhv.sim.memory`); set
    ``engine_chunk = c`` to rerun bit for bit on a machine with other free memory. Batched,
    ``engine_chunk = n``: ``{"auto": false, "chunk": n}`` (``0`` = all copies at once). The
    sequential engine trains one copy at a time: ``{"auto": false, "chunk": 1}``.
    """
    choice = getattr(engine, "chunk_choice", None)
    if choice is not None:
        return {"auto": True, **dataclasses.asdict(choice),
                "splits_round": choice.chunk < cfg.train.clients_per_round}
    if hasattr(engine, "chunk"):
        return {"auto": False, "chunk": int(engine.chunk)}
    return {"auto": False, "chunk": 1}
