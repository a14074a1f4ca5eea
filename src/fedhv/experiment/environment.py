"""Provenance of a run: versions, git revision, host, data."""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fedhv


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
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv,
    }
    if provenance is not None:
        env["data"] = provenance
    if clients is not None:
        env["clients"] = clients
    return env
