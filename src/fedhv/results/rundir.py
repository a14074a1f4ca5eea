"""Run directory layout and crash-safe writers (no torch import).

A run directory holds:

- ``config.toml``: the resolved configuration;
- ``environment.json``: package versions, git revision, host;
- ``rounds.jsonl``: one JSON object per round (weights, reports, slack, timing, bytes);
- ``metrics.jsonl``: one JSON object per evaluated round (test metrics);
- ``calibration.json``: FedHV's reference calibration (when it ran);
- ``summary.json``: final metrics, written atomically at the end;
- ``model.pt``: the final global model.

JSONL records are appended, flushed and fsync'ed one line at a time, so a killed
run keeps every finished line.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def write_atomic_with(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a temporary file next to ``path``, fsync it and rename it to ``path``.

    A kill at any moment leaves either the old file or the complete new one.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    data = text.encode("utf-8")

    def write(fh: BinaryIO) -> None:
        fh.write(data)

    write_atomic_with(path, write)


def write_json(path: Path, data: Any) -> None:
    """Atomically write pretty-printed JSON."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


class JsonlWriter:
    """Append-only JSON-lines file, flushed and fsync'ed per record."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run's lifetime

    def append(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All complete records of a JSON-lines file (a torn last line is skipped)."""
    records: list[dict[str, Any]] = []
    if not path.exists():
        return records
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return records


def default_run_dir(setting: str, method: str, seed: int, base: Path = Path("runs")) -> Path:
    """``runs/<setting>-<method>-s<seed>-<YYYYmmdd-HHMMSS>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return base / f"{setting}-{method}-s{seed}-{stamp}"


class RunDir:
    """A run directory being written."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.rounds = JsonlWriter(self.path / "rounds.jsonl")
        self.metrics = JsonlWriter(self.path / "metrics.jsonl")

    def write_text(self, name: str, text: str) -> None:
        write_atomic(self.path / name, text)

    def write_json(self, name: str, data: Any) -> None:
        write_json(self.path / name, data)

    def close(self) -> None:
        self.rounds.close()
        self.metrics.close()
