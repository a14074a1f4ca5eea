"""Flat parameter vectors and seeded PyTorch-default initialisation.

The flat vector ``theta`` holds a module's **trainable** parameters only (``requires_grad``
true): a frozen parameter (``requires_grad=False``, e.g. a pretrained encoder kept fixed
while fine-tuning) is not in ``theta``, so no engine, method or Flower stage moves, sends
or counts it; it keeps the module's own value (:func:`set_flat` never writes it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


def trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of the module's trainable parameters (``requires_grad``), in
    ``named_parameters`` order: the entries of the flat vector ``theta``."""
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


def frozen(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of the module's frozen parameters (``requires_grad=False``): not in ``theta``."""
    return [(name, p) for name, p in module.named_parameters() if not p.requires_grad]


@dataclass(frozen=True)
class ParamLayout:
    """Names, shapes and offsets of a module's trainable parameters in one flat vector.

    The flat vector ``theta`` has ``d = sum(numel)`` entries in ``named_parameters``
    order, frozen parameters (``requires_grad=False``) left out; :meth:`views` maps
    ``[..., d]`` tensors back to per-parameter views
    ``[..., *shape]`` without copying.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    size: int

    @classmethod
    def of(cls, module: nn.Module) -> ParamLayout:
        names, shapes, offsets = [], [], []
        off = 0
        for name, p in trainable(module):
            names.append(name)
            shapes.append(tuple(p.shape))
            offsets.append(off)
            off += p.numel()
        return cls(tuple(names), tuple(shapes), tuple(offsets), off)

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-parameter views of ``flat`` ``[..., d]`` -> ``{name: [..., *shape]}``."""
        lead = flat.shape[:-1]
        # One split (its backward is a single concatenation) instead of slicing per
        # parameter (each slice's backward would materialise a zero [..., d] tensor).
        parts = flat.split([math.prod(s) for s in self.shapes], dim=-1)
        return {name: part.view(*lead, *shape) for name, shape, part in zip(self.names, self.shapes, parts)}

    def slice_of(self, prefix: str) -> list[tuple[int, int]]:
        """``(start, stop)`` ranges of the parameters whose names start with ``prefix``."""
        return [
            (off, off + math.prod(shape))
            for name, shape, off in zip(self.names, self.shapes, self.offsets)
            if name.startswith(prefix)
        ]


def get_flat(module: nn.Module) -> torch.Tensor:
    """Concatenate the module's trainable parameters into one detached vector ``[d]``."""
    params = [p.detach().reshape(-1) for _, p in trainable(module)]
    if not params:
        first = next(module.parameters(), None)
        return torch.zeros(0) if first is None else first.detach().new_zeros(0)
    return torch.cat(params)


@torch.no_grad()
def set_flat(module: nn.Module, flat: torch.Tensor) -> None:
    """Copy ``flat`` ``[d]`` into the module's trainable parameters (frozen ones keep their values)."""
    off = 0
    for _, p in trainable(module):
        n = p.numel()
        p.copy_(flat[off : off + n].view_as(p))
        off += n


@torch.no_grad()
def copy_buffers(dst: nn.Module, src: nn.Module) -> None:
    """Copy ``src``'s buffers into ``dst``'s (same architecture; ``named_buffers`` order)."""
    for b, v in zip(dst.buffers(), src.buffers()):
        b.copy_(v)


@torch.no_grad()
def default_init(module: nn.Module, generator: torch.Generator) -> None:
    """PyTorch's default ``Linear`` / ``Conv2d`` initialisation, from ``generator``.

    ``W ~ U(-b, b)`` with ``b = 1/sqrt(fan_in)`` (kaiming-uniform with ``a = sqrt(5)``)
    and ``bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))``; norm layers get weight 1, bias 0.
    """
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5), generator=generator)
            if m.bias is not None:
                fan_in = m.weight[0].numel()
                bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
                nn.init.uniform_(m.bias, -bound, bound, generator=generator)
        elif isinstance(m, (nn.GroupNorm, nn.BatchNorm2d, nn.LayerNorm)):
            if m.weight is not None:
                nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


@dataclass(frozen=True)
class TaskSlices:
    """Index sets of the shared encoder and of each task head in a flat vector.

    Attributes
    ----------
    encoder : Tensor, int64
        Positions of the encoder parameters (everything outside the heads).
    heads : tuple of Tensor, int64
        ``heads[t]``: positions of task ``t``'s head.
    """

    encoder: torch.Tensor
    heads: tuple[torch.Tensor, ...]

    @classmethod
    def of(cls, layout: ParamLayout, num_tasks: int, head_prefix: str = "heads.",
           keys: list[str] | None = None) -> TaskSlices:
        """Head ``t`` is every parameter under ``head_prefix + keys[t] + "."`` (default keys ``"0", "1", ...``)."""
        def positions(ranges: list[tuple[int, int]]) -> torch.Tensor:
            if not ranges:
                return torch.zeros(0, dtype=torch.long)
            return torch.cat([torch.arange(a, b) for a, b in ranges])

        names = keys if keys is not None else [str(t) for t in range(num_tasks)]
        heads = tuple(positions(layout.slice_of(f"{head_prefix}{k}.")) for k in names)
        in_head = torch.zeros(layout.size, dtype=torch.bool)
        for h in heads:
            in_head[h] = True
        return cls(torch.nonzero(~in_head).squeeze(1), heads)

    def to(self, device: torch.device | str) -> TaskSlices:
        """The same index sets on ``device`` (where the gradients they index live)."""
        return TaskSlices(self.encoder.to(device), tuple(h.to(device) for h in self.heads))
