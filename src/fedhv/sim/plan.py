"""Per-client, per-round randomness, shared by every engine.

All random choices a client makes in a round (minibatch order, augmentation
angles, dropout masks, report minibatches) are drawn here from counter-based
streams keyed by ``(seed, stream, purpose, round, client)``. Engines only consume
plans, so the batched and the sequential engine see identical randomness.

Minibatches follow a shuffling loader with ``drop_last``: the client's local
indices are permuted, cut into ``floor(S / B)`` batches, and re-permuted when the
epoch is exhausted (reference code: ``DataLoader(shuffle=True, drop_last=True)``
restarted when exhausted). A fresh epoch starts every round. A client with fewer
samples than a batch (``0 < S < B``, natural partitions) has no full batch: its
minibatches are consecutive runs of ``B`` indices from a stream of shuffled epochs
(permutations of its ``S`` samples, concatenated), so a batch repeats samples, over a
round's ``K B`` draws each sample is drawn ``floor(K B / S)`` or ``ceil(K B / S)`` times,
and all batches keep the shape ``B`` the engines need. fedhv's own rule (the reference code's loader would raise on such a
client); clients with ``S >= B`` are unaffected.

Devices: every draw is made on the CPU from a CPU ``torch.Generator``, so a CPU run
and a GPU run of the same seed sample the same batches, angles, flips and masks; the
drawn tensors are then moved to the device of the client's index tensor ``local``
(the data's device). Engines therefore never receive plan tensors on another
device than their data.
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

    def select(self, rows: slice) -> ClientPlan:
        """Rows ``rows`` of a stacked plan (see :func:`stack_plans`)."""
        return ClientPlan(
            self.batches[rows],
            None if self.angles is None else self.angles[rows],
            {site: m[rows] for site, m in self.masks.items()},
            None if self.flips is None else self.flips[rows],
        )


def stack_plans(plans: list[ClientPlan]) -> ClientPlan:
    """Stack ``n`` plans of equal shape into one with a leading copy dimension.

    ``batches [n, K, B]``, ``angles [n, K, B]``, ``flips [n, K]``,
    ``masks[site] [n, K, B, features]``; one stack per field and round instead of one
    per field and local step.
    """
    first = plans[0]
    return ClientPlan(
        torch.stack([p.batches for p in plans]),
        None if first.angles is None else torch.stack([p.angles for p in plans if p.angles is not None]),
        {site: torch.stack([p.masks[site] for p in plans]) for site in first.masks},
        None if first.flips is None else torch.stack([p.flips for p in plans if p.flips is not None]),
    )


def epoch_batches(local: torch.Tensor, steps: int, batch: int, g: torch.Generator) -> torch.Tensor:
    """``steps`` minibatches of ``batch`` indices from shuffled epochs of ``local``.

    The permutations are drawn on the CPU (``g``) and gathered from ``local`` on its
    device: the result is on ``local``'s device with device-independent values.
    """
    per_epoch = len(local) // batch
    if len(local) == 0:
        raise ValueError("an empty client has no minibatches (empty clients are never sampled)")
    if per_epoch < 1:  # S < B: B-runs of a stream of shuffled epochs (module docstring)
        need = steps * batch
        count = -(-need // len(local))
        stream = torch.cat([torch.randperm(len(local), generator=g) for _ in range(count)])[:need]
        return local[stream.to(local.device)].view(steps, batch)
    epochs = -(-steps // per_epoch)
    perms = torch.cat([torch.randperm(len(local), generator=g)[: per_epoch * batch] for _ in range(epochs)])
    return local[perms.to(local.device)].view(epochs * per_epoch, batch)[:steps]


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
    dropout_p: float | dict[str, float],
    tag: str = "train",
    copy: int = 0,
) -> ClientPlan:
    """Draw the plan of ``client`` in round ``round_idx``.

    ``tag`` names the client computation (``"train"``, ``"grads"``) and ``copy`` the
    trajectory or gradient index within it, so that every trajectory of every client
    has its own independent stream. Draws are made on the CPU and the plan is moved
    to ``local``'s device. ``dropout_p``: the drop probability of every site, or one per site
    (a model with several dropout rates); the sites' masks are drawn in ``dropout_sites``
    order from one stream, each with its own probability.
    """
    device = local.device
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
        angles = angles.to(device)
    if augment is not None and augment.flip_prob > 0:
        flips = torch.rand(steps, generator=torch_generator(seed, stream, "flip", *keys)) < augment.flip_prob
        flips = flips.to(device)
    gd = torch_generator(seed, stream, "dropout", *keys)
    masks = {
        site: (torch.rand(steps, batch, size, generator=gd)
               >= (dropout_p[site] if isinstance(dropout_p, dict) else dropout_p)).to(device)
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
