"""Per-client, per-round randomness, shared by every engine.

All random choices a client makes in a round (minibatch order, augmentation
angles, dropout masks, report minibatches) are drawn here from counter-based
streams keyed by ``(seed, stream, purpose, round, client)``. Engines only consume
plans, so the batched and the sequential engine see identical randomness.

Minibatches follow a shuffling loader with ``drop_last``: the client's local
indices are permuted, cut into ``floor(S / B)`` batches, and re-permuted when the
epoch is exhausted (reference code: ``DataLoader(shuffle=True, drop_last=True)``
restarted when exhausted). A fresh epoch starts every round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedhv.data.augment import Augment
from fedhv.rng import torch_generator


@dataclass(frozen=True)
class ClientPlan:
    """Random choices of one client in one round.

    Attributes
    ----------
    batches : Tensor, int64 ``[K, B]``
        Global training indices of each local step's minibatch.
    angles : Tensor ``[K, B]`` or None
        Rotation angles in degrees (``None`` = no rotation).
    flips : Tensor, bool ``[K]`` or None
        Whether each step's minibatch is flipped horizontally (``None`` = never).
    masks : dict of Tensor, bool ``[K, B, features]``
        Dropout keep-masks per site.
    """

    batches: torch.Tensor
    angles: torch.Tensor | None
    masks: dict[str, torch.Tensor]
    flips: torch.Tensor | None = None


def epoch_batches(local: torch.Tensor, steps: int, batch: int, g: torch.Generator) -> torch.Tensor:
    """``steps`` minibatches of ``batch`` indices from shuffled epochs of ``local``."""
    per_epoch = len(local) // batch
    if per_epoch < 1:
        raise ValueError(f"batch size {batch} exceeds the {len(local)} local samples")
    epochs = -(-steps // per_epoch)
    rows = []
    for _ in range(epochs):
        perm = torch.randperm(len(local), generator=g)[: per_epoch * batch]
        rows.append(local[perm].view(per_epoch, batch))
    return torch.cat(rows)[:steps]


def client_plan(
    seed: int,
    stream: str,
    round_idx: int,
    client: int,
    local: torch.Tensor,
    steps: int,
    batch: int,
    augment: Augment | None,
    dropout_sites: dict[str, int],
    dropout_p: float,
    tag: str = "train",
    copy: int = 0,
) -> ClientPlan:
    """Draw the plan of ``client`` in round ``round_idx``.

    ``tag`` names the client computation (``"train"``, ``"grads"``) and ``copy`` the
    trajectory or gradient index within it, so that every trajectory of every client
    has its own independent stream.
    """
    keys = (round_idx, client, tag, copy)
    batches = epoch_batches(local, steps, batch, torch_generator(seed, stream, "batches", *keys))
    angles = flips = None
    if augment is not None and augment.rotation_degrees > 0:
        ga = torch_generator(seed, stream, "augment", *keys)
        deg = augment.rotation_degrees
        if augment.integer_angles:
            angles = torch.randint(-int(deg), int(deg) + 1, (steps, batch), generator=ga).to(torch.float64)
        else:
            angles = (torch.rand(steps, batch, generator=ga, dtype=torch.float64) * 2 - 1) * deg
    if augment is not None and augment.flip_prob > 0:
        flips = torch.rand(steps, generator=torch_generator(seed, stream, "flip", *keys)) < augment.flip_prob
    gd = torch_generator(seed, stream, "dropout", *keys)
    masks = {
        site: torch.rand(steps, batch, size, generator=gd) >= dropout_p
        for site, size in dropout_sites.items()
    }
    return ClientPlan(batches, angles, masks, flips)


def report_indices(
    seed: int, stream: str, round_idx: int, client: int, local: torch.Tensor, report_batches: int | str, batch: int
) -> torch.Tensor:
    """Indices a client evaluates for its objective report.

    ``"all"``: the whole local dataset; ``b``: ``b`` minibatches of ``batch``
    samples drawn like training minibatches (independently of them).
    """
    if report_batches == "all":
        return local
    g = torch_generator(seed, stream, "report", round_idx, client)
    return epoch_batches(local, int(report_batches), batch, g).reshape(-1)
