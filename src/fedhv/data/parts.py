"""Client partitions: the one type ``parts`` has wherever a client's samples are looked up.

:class:`ClientParts` is what :class:`~fedhv.data.federated.FederatedData` holds and the engines,
reports, diagnostics and Flower nodes read: ``parts[c]`` is client ``c``'s int64 index
tensor into the training samples. Three kinds implement it:

- an int64 tensor ``[N, S]``: equal client sizes (the paper's partitions);
- :class:`RaggedParts`: clients of unequal size (``partition.sizes = "lognormal"``, a user's
  index lists, ``"dirichlet-disjoint"``, ``"ids"``);
- :class:`fedhv.flower.node.OneClientParts`: a Flower node's view that holds one client's
  row only (any other row is an error).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


class ClientParts(Protocol):
    """Client ``c``'s samples are ``train_x[parts[c]]``; ``N = len(parts) = parts.shape[0]``."""

    @property
    def shape(self) -> tuple[int, ...]:
        """``(N, S)`` for equal sizes, ``(N,)`` for ragged ones."""
        ...

    def __getitem__(self, c: int) -> torch.Tensor:
        """Client ``c``'s index tensor (int64)."""
        ...

    def __len__(self) -> int:
        """The number of clients ``N``."""
        ...

    def reshape(self, *shape: int) -> torch.Tensor:
        """All indices concatenated (``reshape(-1)``)."""
        ...

    def to(self, device: torch.device | str) -> ClientParts:
        """The same partition with its index tensors on ``device``."""
        ...


class RaggedParts:
    """Client index sets of unequal size; ``parts[c]`` is client ``c``'s index tensor."""

    def __init__(self, rows: Sequence[torch.Tensor]) -> None:
        self.rows = list(rows)

    def __getitem__(self, c: int) -> torch.Tensor:
        return self.rows[c]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.rows),)

    def reshape(self, *shape: int) -> torch.Tensor:
        """All indices, concatenated (only ``reshape(-1)`` is supported)."""
        return torch.cat(self.rows)

    def to(self, device: torch.device | str) -> RaggedParts:
        return RaggedParts([r.to(device) for r in self.rows])
