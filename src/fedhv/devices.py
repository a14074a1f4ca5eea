"""Compute devices: validation of ``device = ...`` and clock-safe synchronization.

fedhv runs on ``"cpu"``, ``"cuda"`` (the current CUDA device), ``"cuda:N"`` and
``"mps"``. :func:`check_device` is part of configuration validation: an unknown or
unavailable device is rejected before any work starts, with what torch reports.
``"cpu"`` is accepted without importing torch, so ``fedhv show-config`` stays fast.

CUDA kernels run asynchronously: a clock read right after a launch measures the
launch, not the work. :func:`synchronize` waits for the device's queued work and is
called before every clock read that splits a round into client, server and
evaluation time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedhv.errors import ConfigError

if TYPE_CHECKING:
    import torch

#: Device types fedhv runs on.
SUPPORTED = ("cpu", "cuda", "mps")
_USE = 'use "cpu", "cuda" or "cuda:N" (N = GPU index)'


def check_device(name: str) -> None:
    """Reject a device string that torch does not know or cannot use here.

    Parameters
    ----------
    name : str
        ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.

    Raises
    ------
    ConfigError
        One line naming the device, what torch reports and the fix.
    """
    if name == "cpu":
        return
    import torch

    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        raise ConfigError(f"device = {name!r} is not a device torch knows (torch: {reason}); {_USE}") from None
    if dev.type not in SUPPORTED:
        raise ConfigError(f"device = {name!r} has type {dev.type!r}, which fedhv does not run on; {_USE} or \"mps\"")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = torch.version.cuda or "none, a CPU-only build"
            raise ConfigError(
                f"device = {name!r} is not available: torch {torch.__version__} reports "
                f"torch.cuda.is_available() = False (CUDA build: {build}); use device = \"cpu\" or run where "
                "a GPU and a CUDA build of torch are installed"
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ConfigError(
                f"device = {name!r} is not available: torch reports {count} CUDA device(s) "
                f"(cuda:0 to cuda:{count - 1}); use one of those"
            )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            f"device = {name!r} is not available: torch {torch.__version__} reports "
            "torch.backends.mps.is_available() = False; use device = \"cpu\""
        )


def synchronize(device: torch.device | str) -> None:
    """Wait until ``device`` has finished its queued work (no-op on the CPU and meta).

    Call before reading a clock that should include the device's work.
    """
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()
