"""Checkpoints for exact resume, and repair of the run's JSON-lines files.

A checkpoint (``checkpoint.pt`` in the run directory) holds everything the round loop
carries from one round to the next:

- the round counter ``t`` (rounds completed) and the global model ``theta^t``;
- the algorithm state (FedHV's weights and last report, FedCMOO's warm-started
  weights and sketch counter, ...);
- the running totals (bytes, time split, slack diagnostics, fault counts) and the
  last evaluation;
- the byte lengths of ``rounds.jsonl`` and ``metrics.jsonl`` after round ``t``;
- torch's and numpy's global RNG states. fedhv draws every random number from keyed
  streams (:mod:`fedhv.rng`: seed, stream, round, client, ...), so nothing depends on
  them; they are saved so that user code relying on global state resumes too;
- the SHA-256 of ``config.toml``, so a changed configuration is not silently resumed.

The file is written to a temporary name, fsync'ed and renamed over the old one, so a
kill at any moment leaves either the previous or the new checkpoint. Checkpoints are
pickles: load only your own.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from fedhv.errors import FedHVError
from fedhv.results.rundir import write_atomic_with

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = 1


class ResumeError(FedHVError):
    """A run directory that cannot be resumed."""


def config_digest(text: str) -> str:
    """SHA-256 of a ``config.toml`` text."""
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Checkpoint:
    """The loop state after ``round`` completed rounds."""

    round: int
    theta: torch.Tensor
    state: Any
    totals: dict[str, Any]
    last_eval: dict[str, Any]
    offsets: dict[str, int]
    elapsed_s: float
    config_sha256: str
    rng: dict[str, Any] = field(default_factory=dict)


def global_rng_state() -> dict[str, Any]:
    """torch's and numpy's global RNG states."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}


def restore_global_rng(rng: dict[str, Any]) -> None:
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    if "numpy" in rng:
        np.random.set_state(rng["numpy"])


def save_checkpoint(run_dir: Path, ckpt: Checkpoint) -> None:
    """Atomically write ``run_dir/checkpoint.pt``."""
    path = Path(run_dir) / CHECKPOINT_FILE
    payload = {"format": FORMAT, **ckpt.__dict__, "theta": ckpt.theta.detach().cpu().clone()}
    def write(fh: BinaryIO) -> None:
        torch.save(payload, fh)

    write_atomic_with(path, write)


def load_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The run directory's checkpoint, or ``None`` when it has none."""
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is reported the same way
        raise ResumeError(
            f"{path} cannot be read ({type(exc).__name__}: {exc}); delete it to restart the run from round 0"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ResumeError(f"{path} is not a fedhv checkpoint of format {FORMAT}")
    payload.pop("format")
    return Checkpoint(**payload)


@dataclass(frozen=True)
class Repair:
    """What :func:`truncate_jsonl` removed from a JSON-lines file."""

    records_dropped: int
    torn_line: bool

    def describe(self, name: str) -> str:
        parts = []
        if self.records_dropped:
            parts.append(f"{self.records_dropped} record(s) written after the checkpoint")
        if self.torn_line:
            parts.append("a torn last line")
        return f"{name}: removed " + " and ".join(parts) if parts else ""


def truncate_jsonl(path: Path, offset: int) -> Repair:
    """Cut ``path`` back to its first ``offset`` bytes (the checkpoint's length).

    Complete records after ``offset`` belong to rounds that will be re-run; a last
    line without its newline or that is not valid JSON is a torn write. The kept
    part must consist of complete, valid lines.
    """
    path = Path(path)
    data = path.read_bytes() if path.exists() else b""
    if len(data) < offset:
        raise ResumeError(
            f"{path} has {len(data)} bytes but the checkpoint expects at least {offset}; the file was "
            "truncated or replaced after the checkpoint, so the run cannot be resumed exactly"
        )
    kept, rest = data[:offset], data[offset:]
    if kept and not kept.endswith(b"\n"):
        raise ResumeError(f"{path}: the checkpoint offset {offset} is not at a line end; the file was modified")
    lines = rest.split(b"\n")
    torn = bool(lines[-1].strip())  # text after the last newline
    complete = [ln for ln in lines[:-1] if ln.strip()]
    dropped = 0
    for ln in complete:
        try:
            json.loads(ln)
            dropped += 1
        except json.JSONDecodeError:
            torn = True
    if rest:
        with open(path, "r+b") as fh:
            fh.truncate(offset)
            fh.flush()
            os.fsync(fh.fileno())
    return Repair(dropped, torn)
