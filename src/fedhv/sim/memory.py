"""Memory of the batched engine: per-copy estimate, available memory, the automatic chunk.

``engine_chunk = "auto"`` (the default) lets :func:`choose_chunk` pick how many model
copies the batched engine trains at once:

.. math::

    c = \\max\\Bigl(1, \\Bigl\\lfloor \\frac{f \\cdot A}{b} \\Bigr\\rfloor\\Bigr),
    \\qquad b = s\\,(4 d + 2 B x) + 2 a_B (+ 2 d \\text{ for bf16}),

with ``A`` the available memory (:func:`available_bytes`), ``f = 0.5`` the fraction
granted to training (the rest is left for the data, the reports and evaluation passes,
the allocator's slack and other processes) and ``b`` the bytes of one copy's local step
(:func:`copy_step_bytes`): ``d`` parameters held four times (the copy's parameters, its
gradient, its momentum buffer and its returned update), the gathered and the augmented
minibatch (``B`` samples of ``x`` elements each), and twice the activations ``a_B`` that
autograd saves in the forward pass of a ``B``-sample batch (the saved tensors, plus their
gradients, which the backward pass creates one layer at a time and which are bounded by
the same total). ``s`` is the element size of the run's dtype; under bf16 autocast each op
also keeps a bfloat16 copy of its weights (``2d`` bytes). ``a_B`` is measured
(:func:`saved_activation_bytes`) in the run's dtype; the fp32 value bounds the bf16 one.
Measured on CPU against the peak RSS growth of real local steps, ``b`` overestimates by
5-30 % (docs/performance-history.md), so the choice errs on the safe side.

When ``c`` covers all the round's copies the engine runs them at once, exactly as
``engine_chunk = 0``; otherwise chunks of ``c`` copies. Chunk sizes change results only
by float rounding (the grouped convolutions' reduction order), never the randomness.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.func import functional_call, vmap

from fedhv import procfs
from fedhv.models import native
from fedhv.models.base import MultiTaskModel

log = logging.getLogger("fedhv")

#: Share of the available memory granted to the batched engine's copies.
FRACTION = 0.5


@dataclass(frozen=True)
class ChunkChoice:
    """An automatic ``engine_chunk``, with the numbers behind it (for the run log).

    Attributes
    ----------
    chunk : int
        Model copies trained at once (>= 1).
    copy_bytes : int
        Estimated bytes of one copy's local step.
    available_bytes : int
        Memory available when the engine was built.
    fraction : float
        Share of ``available_bytes`` granted to the copies.
    """

    chunk: int
    copy_bytes: int
    available_bytes: int
    fraction: float = FRACTION

    def describe(self) -> str:
        mib = 2**20
        return (f"engine_chunk auto: {self.chunk} model copies at once "
                f"({self.copy_bytes / mib:.1f} MiB per copy's local step, {self.fraction:.0%} of "
                f"{self.available_bytes / mib:.0f} MiB available)")


def choose_chunk(copy_bytes: int, available: int, fraction: float = FRACTION) -> ChunkChoice:
    """The largest number of copies whose step memory fits ``fraction * available`` (at least 1).

    Parameters
    ----------
    copy_bytes : int
        Bytes of one copy's local step (:func:`copy_step_bytes`), > 0.
    available : int
        Available bytes (:func:`available_bytes`).
    fraction : float
        Share of ``available`` the copies may use, in (0, 1].
    """
    if copy_bytes <= 0:
        raise ValueError(f"copy_bytes = {copy_bytes} must be > 0")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction = {fraction} must be in (0, 1]")
    return ChunkChoice(max(1, int(fraction * max(available, 0)) // copy_bytes), copy_bytes, available, fraction)


def _meminfo_available(text: str) -> int | None:
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _cgroup_headroom(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """``limit - usage`` of this process's memory cgroup (v2, then v1), or None without a limit."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            limit = (root / limit_file).read_text().strip()
            usage = int((root / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:
            return max(int(limit) - usage, 0)
    return None


def available_bytes(device: torch.device | str = "cpu") -> int:
    """Memory available to new allocations on ``device``.

    CUDA: the free device memory (``torch.cuda.mem_get_info``). Otherwise the host's
    ``MemAvailable`` (``/proc/meminfo``; ``os.sysconf("SC_AVPHYS_PAGES")`` pages where
    there is no ``/proc``), capped by the headroom of a memory cgroup limit (containers).
    """
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    meminfo = procfs.read_text("meminfo")
    host = None if meminfo is None else _meminfo_available(meminfo)
    if host is None:
        host = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cgroup = _cgroup_headroom()
    return host if cgroup is None else min(host, cgroup)


def _saved_bytes(model: MultiTaskModel, input_shape: tuple[int, ...], batch_size: int, dtype: torch.dtype,
                 input_dtype: torch.dtype | None = None) -> int:
    """Bytes of the distinct storages autograd saves in one copy's forward on ``batch_size`` samples."""
    device = next(model.parameters()).device
    params = {n: p.detach().unsqueeze(0).to(dtype).clone().requires_grad_(p.requires_grad)
              for n, p in model.named_parameters()}  # frozen ones save no weight gradient's inputs
    x = torch.zeros((1, batch_size, *input_shape), dtype=input_dtype or dtype, device=device)  # int: token ids
    masks = {s: torch.ones((1, batch_size, f), dtype=torch.bool, device=device)
             for s, f in model.dropout_sites().items()}
    fused = getattr(model, "forward_batched", None)
    if fused is None:
        def single(p: dict[str, torch.Tensor], xb: torch.Tensor, mb: dict[str, torch.Tensor],
                   b: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
            return functional_call(model, {**p, **(b or {})}, (xb, mb))
        fused = vmap(single)
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()  # a tensor saved by several ops (or as views) counts once
        storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    # private batched buffers, as the engine passes them: the model's own (BatchNorm statistics) stay untouched
    buffers = {n: b.detach().unsqueeze(0).clone() for n, b in model.named_buffers()}
    extra = (buffers,) if buffers else ()
    was = model.training
    model.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fused(params, x, masks, *extra)
    finally:
        model.train(was)
    return sum(storages.values())


def saved_activation_bytes(model: MultiTaskModel, input_shape: tuple[int, ...], batch_size: int,
                           dtype: torch.dtype, input_dtype: torch.dtype | None = None) -> int:
    """Bytes autograd saves in one copy's training forward on a ``batch_size`` batch.

    Measured, not guessed: the batched engine's forward (``forward_batched``, or ``vmap``
    of ``functional_call``) runs one copy, dropout masks on, on batches of 1 and 2 zero
    samples on the model's device, summing the bytes of every distinct storage passed
    to the saved-tensor hook (a tensor saved by several ops counts once). Saved memory is
    affine in the batch size, ``a_B = a_0 + B s`` (``a_0``: the saved weights), so
    ``s = a_3 - a_2`` and ``a_B = a_2 + (B - 2) s`` (batches of 2 and 3: a model with
    BatchNorm cannot run a training forward on one sample). (A dry forward on the ``meta``
    device gives the same numbers but costs about a second the first time a process
    uses the meta kernels; the two small forwards cost 0.1-1 s and are measured once per
    process for each model structure, input shape, dtype and device, and with and without
    the compiled kernels of :mod:`fedhv.models.native`.)
    """
    key = (type(model).__qualname__,  # frozen parameters save no gradient inputs: their flag is part of the shape
           tuple((n, tuple(p.shape), p.requires_grad) for n, p in model.named_parameters()),
           tuple(sorted(model.dropout_sites().items())), tuple(input_shape), dtype, str(next(model.parameters()).device),
           native.enabled(), input_dtype)  # the compiled kernels save less than PyTorch's layers
    if key not in _SAVED:
        _SAVED[key] = (_saved_bytes(model, input_shape, 2, dtype, input_dtype),
                       _saved_bytes(model, input_shape, 3, dtype, input_dtype))
    two, three = _SAVED[key]
    return max(two + (batch_size - 2) * max(three - two, 0), 0)


#: Measured ``(a_2, a_3)`` per model structure, input shape, dtype, device and kernel switch (a process measures once).
_SAVED: dict[tuple[object, ...], tuple[int, int]] = {}


def copy_step_bytes(model: MultiTaskModel, input_shape: tuple[int, ...], batch_size: int,
                    dtype: torch.dtype, precision: str = "fp32", input_dtype: torch.dtype | None = None) -> int:
    """Estimated bytes of one model copy's local step (module docstring: ``b``)."""
    size = torch.empty((), dtype=dtype).element_size()
    d = sum(p.numel() for p in model.parameters() if p.requires_grad)  # frozen ones are shared, never copied
    sample = 1
    for n in input_shape:
        sample *= n
    total = size * (4 * d + 2 * batch_size * sample)
    # Under autocast the compiled kernels step aside (fedhv.models.native): PyTorch's layers save more.
    with contextlib.nullcontext() if precision == "fp32" else native.disabled():
        total += 2 * saved_activation_bytes(model, input_shape, batch_size, dtype, input_dtype)
    if precision == "bf16":
        total += 2 * d
    return total


def auto_chunk(model: MultiTaskModel, input_shape: tuple[int, ...], batch_size: int,
               precision: str = "fp32", available: int | None = None,
               input_dtype: torch.dtype | None = None) -> ChunkChoice:
    """The automatic chunk for ``model`` on its device (``available``: measured when None; ``input_dtype``:
    integer inputs such as token ids, else the model's dtype)."""
    first = next(model.parameters())
    step = copy_step_bytes(model, input_shape, batch_size, first.dtype, precision, input_dtype)
    free = available_bytes(first.device) if available is None else available
    return choose_chunk(step, free)
