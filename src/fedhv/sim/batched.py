"""Batched engine: all sampled clients of a round in lockstep.

The ``k`` client models are one leaf tensor ``P`` ``[k, d]``; each local step
gathers the ``k`` minibatches ``[k, B, ...]``, evaluates all models at once with the
model's ``forward_batched`` (clients folded into the channel dimension: grouped
convolutions and batched matrix products; ``torch.func.vmap`` as a fallback),
differentiates ``sum_k L_k`` (client losses are independent, so the gradient's row
``k`` is client ``k``'s gradient) and applies SGD with momentum to all rows.
Reports are evaluated in one pass over the union of the clients' report samples,
since every client evaluates the same ``theta^t``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch.func import functional_call, vmap

from fedhv.algorithms.base import ClientReplies, RoundRequest
from fedhv.metrics.evaluate import per_sample_losses
from fedhv.models.params import set_flat
from fedhv.sim.engine import Engine
from fedhv.sim.local import rotate, task_nll


class BatchedEngine(Engine):
    """Lockstep engine; ``chunk`` limits how many clients run at once (0 = all)."""

    def __init__(self, *args, chunk: int = 0, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.chunk = chunk
        self._forward = self._make_forward()

    def _make_forward(self) -> Callable[..., list[torch.Tensor]]:
        fused = getattr(self.model, "forward_batched", None)
        if fused is not None:
            return fused

        def single(params: dict, x: torch.Tensor, masks: dict) -> list[torch.Tensor]:
            return functional_call(self.model, params, (x, masks))

        return vmap(single)

    def _reports(self, theta: torch.Tensor, clients: np.ndarray, round_idx: int, request: RoundRequest) -> torch.Tensor:
        idx = [self.report_indices(int(c), round_idx, request) for c in clients]
        all_idx = torch.cat(idx)
        set_flat(self.model, theta)
        self.model.eval()
        losses, _ = per_sample_losses(
            self.model, self.data.train_x[all_idx], self.data.train_y[all_idx], self.eval_batch_size
        )
        self.model.train()
        return torch.stack([part.mean(0) for part in torch.split(losses, [len(i) for i in idx])])

    def _train_chunk(self, theta: torch.Tensor, clients: np.ndarray, round_idx: int, w: torch.Tensor) -> torch.Tensor:
        k, b = len(clients), self.batch_size
        plans = [self.plan(int(c), round_idx) for c in clients]
        batches = torch.stack([p.batches for p in plans])  # [k, K, B]
        angles = None if plans[0].angles is None else torch.stack([p.angles for p in plans if p.angles is not None])
        masks = {site: torch.stack([p.masks[site] for p in plans]) for site in plans[0].masks}
        params = theta.detach().expand(k, -1).clone().requires_grad_(True)
        buf: torch.Tensor | None = None
        for s in range(self.local_steps):
            idx = batches[:, s].reshape(-1)
            x = self.data.train_x[idx]
            if angles is not None:
                x = rotate(x, angles[:, s].reshape(-1))
            x = x.view(k, b, *x.shape[1:])
            y = self.data.train_y[idx].view(k, b, -1)
            logps = self._forward(self.layout.views(params), x, {site: m[:, s] for site, m in masks.items()})
            loss = (task_nll(logps, y) * w).sum()
            (grad,) = torch.autograd.grad(loss, params)
            with torch.no_grad():
                if self.momentum:
                    buf = grad if buf is None else buf.mul_(self.momentum).add_(grad)
                    grad = buf
                params.sub_(grad, alpha=self.lr_local)
        return params.detach() - theta

    def run_clients(
        self, theta: torch.Tensor, clients: np.ndarray, request: RoundRequest, round_idx: int
    ) -> ClientReplies:
        clients = np.asarray(clients)
        reports = self._reports(theta, clients, round_idx, request) if request.report else None
        w = self.weights_tensor(request)
        size = self.chunk or len(clients)
        deltas = torch.cat(
            [self._train_chunk(theta, clients[i : i + size], round_idx, w) for i in range(0, len(clients), size)]
        )
        return ClientReplies(clients=clients, deltas=deltas, reports=reports)
