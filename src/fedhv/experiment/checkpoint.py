"""Checkpoints for exact resume, and repair of the run's JSON-lines files.

A checkpoint (``checkpoint.pt`` in the run directory) holds everything the round loop
carries from one round to the next:

- the round counter ``t`` (rounds completed) and the global model ``theta^t``;
- the algorithm state (FedHV's weights and last report, FedCMOO's warm-started
  weights and sketch counter, ...), as plain data (``to_plain()`` / ``from_plain()``);
- the running totals (bytes, time split, slack diagnostics, fault counts) and the
  last evaluation;
- the byte lengths of ``rounds.jsonl`` and ``metrics.jsonl`` after round ``t``;
- torch's and numpy's global RNG states. fedhv draws every random number from keyed
  streams (:mod:`fedhv.rng`: seed, stream, round, client, ...), so nothing depends on
  them; they are saved so that user code relying on global state resumes too;
- the SHA-256 of ``config.toml``, so a changed configuration is not silently resumed;
- ``digest``: the SHA-256 of a canonical serialization of all of the above
  (:func:`payload_digest`), so a flipped bit is detected.

The file holds plain data only (tensors, numbers, strings, lists, dicts) and is read
with ``torch.load(weights_only=True)``: a checkpoint that asks to build any other
object is refused, never executed. It is written to a temporary name, fsync'ed and
renamed over the old one, so a kill or a full disk leaves the previous checkpoint.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import math
import os
import pickle
import re
import struct
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from fedhv import safe_io
from fedhv.algorithms.plain import StateError
from fedhv.errors import FedHVError
from fedhv.experiment.accounting import RunTotals
from fedhv.registry import METHODS
from fedhv.results.rundir import open_nofollow, write_atomic_with

CHECKPOINT_FILE = "checkpoint.pt"
#: 1: pickled Python objects (read with ``weights_only=False``); 2: plain data + digest.
FORMAT = 2


def state_kinds() -> dict[str, Any]:
    """Algorithm state classes by their ``kind``: every registered method's ``state`` (the built-ins,
    registered and installed methods alike)."""
    kinds: dict[str, Any] = {}
    for name in METHODS.names():
        state = getattr(METHODS.get(name), "state", None)
        if state is not None and hasattr(state, "kind"):
            kinds.setdefault(state.kind, state)
    return kinds


def __getattr__(name: str) -> Any:
    if name == "STATE_KINDS":  # the earlier constant: now read from the registry when asked
        return state_kinds()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_FIELDS = ("round", "theta", "state", "totals", "last_eval", "offsets", "elapsed_s", "config_sha256", "rng")


class ResumeError(FedHVError):
    """A run directory that cannot be resumed."""


class CheckpointWriteError(FedHVError, OSError):
    """A checkpoint that could not be written (disk full, quota, file size limit, ...).

    An ``OSError`` with the underlying ``errno``, ``strerror`` and ``filename``;
    ``str()`` is the one-line message.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


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
    #: The global model buffers (BatchNorm statistics; :mod:`fedhv.sim.engine`), empty for
    #: models without buffers.
    buffers: list[torch.Tensor] = field(default_factory=list)


def global_rng_state() -> dict[str, Any]:
    """torch's and numpy's global RNG states."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}


def restore_global_rng(rng: dict[str, Any]) -> None:
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    if "numpy" in rng:
        np.random.set_state(rng["numpy"])


# --------------------------------------------------------------------------- digest


def _feed(h: Any, obj: Any) -> None:
    """Feed a type-tagged, length-prefixed encoding of ``obj`` to ``h``.

    Dicts are encoded in sorted key order, floats by their exact hex form and tensors
    by dtype, shape and raw bytes, so equal payloads always give equal bytes.
    """
    if obj is None:
        h.update(b"N")
    elif isinstance(obj, bool):
        h.update(b"T" if obj else b"F")
    elif isinstance(obj, int):
        _chunk(h, b"i", str(obj).encode())
    elif isinstance(obj, float):
        _chunk(h, b"f", obj.hex().encode())
    elif isinstance(obj, str):
        _chunk(h, b"s", obj.encode("utf-8", "surrogatepass"))
    elif isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        _chunk(h, b"t", f"{t.dtype}{list(t.shape)}".encode())
        _chunk(h, b"b", t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, (list, tuple)):
        _chunk(h, b"l" if isinstance(obj, list) else b"u", str(len(obj)).encode())
        for item in obj:
            _feed(h, item)
    elif isinstance(obj, dict):
        keys = sorted(obj, key=lambda k: (type(k).__name__, str(k)))
        _chunk(h, b"d", str(len(keys)).encode())
        for key in keys:
            _feed(h, key)
            _feed(h, obj[key])
    else:
        raise TypeError(f"a checkpoint cannot hold {type(obj).__name__} values")


def _chunk(h: Any, tag: bytes, data: bytes) -> None:
    h.update(tag + struct.pack("<Q", len(data)) + data)


def payload_digest(payload: dict[str, Any]) -> str:
    """SHA-256 (hex) of the canonical encoding of ``payload`` without its ``digest`` field."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in payload.items() if k != "digest"})
    return h.hexdigest()


# --------------------------------------------------------------------------- plain data


def _plain(obj: Any) -> Any:
    """JSON-like values with numpy scalars replaced by Python numbers (exact)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    return obj


def _rng_to_plain(rng: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "torch" in rng:
        out["torch"] = rng["torch"].detach().cpu().clone()
    if "numpy" in rng:
        name, keys, pos, has_gauss, cached = rng["numpy"]
        out["numpy"] = {"bit_generator": str(name), "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
                        "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return out


def _rng_from_plain(rng: Any, path: Path) -> dict[str, Any]:
    if not isinstance(rng, dict) or not set(rng) <= {"torch", "numpy"}:
        raise ResumeError(f"{path}: the RNG states are malformed; {_DELETE}")
    out: dict[str, Any] = {}
    if "torch" in rng:
        t = rng["torch"]
        size = torch.get_rng_state().numel()
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.shape != (size,):
            raise ResumeError(f"{path}: torch's RNG state must be a uint8 tensor of {size} bytes; {_DELETE}")
        out["torch"] = t
    if "numpy" in rng:
        n = rng["numpy"]
        ok = (isinstance(n, dict) and set(n) == {"bit_generator", "keys", "pos", "has_gauss", "cached_gaussian"}
              and n["bit_generator"] == "MT19937" and isinstance(n["keys"], torch.Tensor)
              and n["keys"].shape == (624,) and bool(((n["keys"] >= 0) & (n["keys"] < 2**32)).all())
              and isinstance(n["pos"], int) and 0 <= n["pos"] <= 624 and isinstance(n["has_gauss"], int)
              and isinstance(n["cached_gaussian"], float))
        if not ok:
            raise ResumeError(f"{path}: numpy's RNG state is malformed; {_DELETE}")
        out["numpy"] = ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                        n["cached_gaussian"])
    return out


def _state_to_plain(state: Any) -> dict[str, Any] | None:
    if state is None:
        return None
    kind = getattr(type(state), "kind", None)
    kinds = state_kinds()
    if kind not in kinds or not isinstance(state, kinds[kind]):
        raise TypeError(f"{type(state).__name__} has no plain-data form; give it kind, to_plain and from_plain "
                        "and name it as its method class's `state`")
    return {"kind": kind, "data": state.to_plain()}


def _state_from_plain(plain: Any, path: Path) -> Any:
    if plain is None:
        return None
    kinds = state_kinds()
    if not isinstance(plain, dict) or set(plain) != {"kind", "data"} or plain["kind"] not in kinds:
        kind = plain.get("kind") if isinstance(plain, dict) else plain
        raise ResumeError(f"{path}: unknown algorithm state {kind!r} (known: {sorted(kinds)}); {_DELETE}")
    try:
        return kinds[plain["kind"]].from_plain(plain["data"])
    except StateError as exc:
        raise ResumeError(f"{path}: invalid algorithm state: {exc}; {_DELETE}") from None


# --------------------------------------------------------------------------- save / load

_DELETE = "delete it to restart the run from round 0"


def save_checkpoint(run_dir: Path, ckpt: Checkpoint) -> None:
    """Atomically write ``run_dir/checkpoint.pt`` (plain data and its digest).

    Raises
    ------
    CheckpointWriteError
        When the file cannot be written (e.g. ``ENOSPC``); the previous checkpoint is
        left intact and no temporary file remains.
    """
    path = Path(run_dir) / CHECKPOINT_FILE
    payload: dict[str, Any] = {
        "format": FORMAT,
        "round": int(ckpt.round),
        "theta": ckpt.theta.detach().cpu().clone(),
        "state": _state_to_plain(ckpt.state),
        "totals": _plain(ckpt.totals),
        "last_eval": _plain(ckpt.last_eval),
        "offsets": {str(k): int(v) for k, v in ckpt.offsets.items()},
        "elapsed_s": float(ckpt.elapsed_s),
        "config_sha256": str(ckpt.config_sha256),
        "rng": _rng_to_plain(ckpt.rng),
    }
    if ckpt.buffers:
        payload["buffers"] = [b.detach().cpu().clone() for b in ckpt.buffers]
    payload["digest"] = payload_digest(payload)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()

    def write(fh: BinaryIO) -> None:
        fh.write(data)

    try:
        write_atomic_with(path, write)
    except OSError as exc:  # also the run directory's own one-line error, which is an OSError
        reason = f"[Errno {exc.errno}] {exc.strerror}" if exc.errno is not None and exc.strerror else str(exc)
        fix = "raise the file size limit (ulimit -f) or free space" if exc.errno == errno.EFBIG else "free space"
        err = CheckpointWriteError(
            f"could not write checkpoint {path}: {reason}; {fix} and resume with `fedhv run --resume {Path(run_dir)}`"
        )
        err.errno, err.strerror, err.filename = exc.errno, exc.strerror, str(path)
        raise err from exc


def load_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The run directory's checkpoint, or ``None`` when it has none.

    Raises
    ------
    ResumeError
        When the file is unreadable, asks to build objects other than plain data, has
        another format, fails its digest, or holds fields of the wrong type or range
        (negative round, non-finite or non-1-D ``theta``, ...).
    """
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        with warnings.catch_warnings():  # a damaged file may warn first; the error or digest check decides
            warnings.simplefilter("ignore")
            with safe_io.open_regular(path) as fh:  # a link, a FIFO or a device: refused by name, never a hang
                payload = torch.load(fh, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"(?i)unsupported global:? (?:GLOBAL )?([\w.]+)", str(exc))
        what = f" (it references {found.group(1)})" if found else ""
        raise ResumeError(
            f"{path} holds more than plain data{what} and was not loaded: fedhv checkpoints contain only "
            f"tensors, numbers, strings, lists and dicts (older fedhv versions wrote pickles, refused too); {_DELETE}"
        ) from None
    except safe_io.UnsafeFileError as exc:
        raise ResumeError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - any unreadable file is reported the same way
        reason = str(exc).splitlines()[0] if str(exc) else ""
        raise ResumeError(f"{path} cannot be read ({type(exc).__name__}: {reason}); {_DELETE}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        kind = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ResumeError(f"{path} is not a fedhv checkpoint of format {FORMAT} (found {kind!r}); {_DELETE}")
    try:
        ok = isinstance(payload.get("digest"), str) and payload_digest(payload) == payload["digest"]
    except TypeError:
        ok = False
    if not ok:
        raise ResumeError(f"{path} is corrupted (its digest does not match its content); {_DELETE}")
    missing = set(_FIELDS) - set(payload)
    if missing:
        raise ResumeError(f"{path} lacks the fields {sorted(missing)}; {_DELETE}")
    _check_fields(payload, path)
    return Checkpoint(
        round=payload["round"], theta=payload["theta"], state=_state_from_plain(payload["state"], path),
        totals=payload["totals"], last_eval=payload["last_eval"], offsets=payload["offsets"],
        elapsed_s=payload["elapsed_s"], config_sha256=payload["config_sha256"],
        rng=_rng_from_plain(payload["rng"], path), buffers=_buffers(payload.get("buffers", []), path),
    )


def _buffers(value: Any, path: Path) -> list[torch.Tensor]:
    """The checkpoint's model buffers: a list of tensors (absent for models without buffers)."""
    if not isinstance(value, list) or not all(isinstance(b, torch.Tensor) for b in value):
        raise ResumeError(f"{path}: buffers is not a list of tensors; {_DELETE}")
    return value


def _check_fields(p: dict[str, Any], path: Path) -> None:
    """Types and ranges that do not depend on the configuration."""
    def bad(name: str, value: Any, expected: str) -> ResumeError:
        return ResumeError(f"{path}: {name} = {str(value)[:80]} is invalid; expected {expected}; {_DELETE}")

    r = p["round"]
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        raise bad("round", r, "an integer >= 0")
    theta = p["theta"]
    if not isinstance(theta, torch.Tensor) or theta.dim() != 1 or not theta.is_floating_point():
        shape = list(theta.shape) if isinstance(theta, torch.Tensor) else type(theta).__name__
        raise bad("theta", shape, "a 1-D floating tensor")
    values = theta.numpy() if theta.dtype in (torch.float16, torch.float32, torch.float64) else theta.double().numpy()
    nonfinite = int((~np.isfinite(values)).sum())  # numpy: single-threaded, fast on a busy machine
    if nonfinite:
        raise bad("theta", f"<{nonfinite} non-finite values>", "finite values")
    offsets = p["offsets"]
    if (not isinstance(offsets, dict) or set(offsets) != {"rounds.jsonl", "metrics.jsonl"}
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in offsets.values())):
        raise bad("offsets", offsets, "byte lengths >= 0 of rounds.jsonl and metrics.jsonl")
    totals = p["totals"]
    names = {f.name for f in fields(RunTotals)}
    if not isinstance(totals, dict) or set(totals) != names:
        raise bad("totals", sorted(totals) if isinstance(totals, dict) else totals, f"the fields {sorted(names)}")
    if not isinstance(p["last_eval"], dict):
        raise bad("last_eval", p["last_eval"], "a dict")
    e = p["elapsed_s"]
    if not isinstance(e, float) or not math.isfinite(e) or e < 0:
        raise bad("elapsed_s", e, "a finite number of seconds >= 0")
    if not isinstance(p["config_sha256"], str):
        raise bad("config_sha256", p["config_sha256"], "a hex string")


def check_checkpoint(ckpt: Checkpoint, path: Path, rounds: int, num_params: int, initial_state: Any,
                     check_state: Any = None) -> None:
    """Reject a checkpoint that does not fit the run's configuration.

    ``check_state`` (the algorithm's ``check_state``, when it has one) checks the state against the run's
    method itself, e.g. a loss-only rule's memory (shapes, signs); its :class:`StateError` becomes a
    :class:`ResumeError`.

    Parameters
    ----------
    path : Path
        The checkpoint file (for messages).
    rounds : int
        Configured rounds; the checkpoint's round must lie in ``[0, rounds]``.
    num_params : int
        Length of the flat model ``theta``.
    initial_state : object
        The method's state before round 0; the checkpoint's state must be of the same
        class and have as many tasks.
    """
    if not 0 <= ckpt.round <= rounds:
        raise ResumeError(f"{path}: round = {ckpt.round} is outside the configured rounds [0, {rounds}]; {_DELETE}")
    if ckpt.theta.numel() != num_params:
        raise ResumeError(
            f"{path}: theta has {ckpt.theta.numel()} values but the model has {num_params} parameters; {_DELETE}"
        )
    state = ckpt.state
    if state is None:
        return
    if type(state) is not type(initial_state):
        raise ResumeError(f"{path}: the algorithm state is {type(state).__name__} but the run's method uses "
                          f"{type(initial_state).__name__}; {_DELETE}")
    if state.num_tasks != initial_state.num_tasks:
        raise ResumeError(f"{path}: the algorithm state has {state.num_tasks} tasks but the run has "
                          f"{initial_state.num_tasks}; {_DELETE}")
    counter = getattr(state, "round", None)
    if counter is not None and counter > ckpt.round:
        raise ResumeError(f"{path}: the algorithm's round counter {counter} exceeds the checkpoint's round "
                          f"{ckpt.round}; {_DELETE}")
    if check_state is not None:
        try:
            check_state(state)
        except StateError as exc:
            raise ResumeError(f"{path}: invalid algorithm state: {exc}; {_DELETE}") from None


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
    if path.is_symlink():
        raise ResumeError(f"{path} is a symbolic link; fedhv never follows links in a run directory: remove it")
    try:
        safe_io.unshare(path)  # a hard-linked file becomes a private copy: the other names keep their content
        data = safe_io.read_regular(path) if path.exists() else b""  # a FIFO or a device: refused, never a hang
    except safe_io.UnsafeFileError as exc:
        raise ResumeError(str(exc)) from None
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
        fd = open_nofollow(path, os.O_RDWR)
        try:
            safe_io.refuse_shared(fd, path)
            os.ftruncate(fd, offset)
            os.fsync(fd)
        finally:
            os.close(fd)
    return Repair(dropped, torn)
