"""Execution engines: run one round's client computation for all sampled clients.

:class:`SequentialEngine` is the reference: one ``nn.Module`` trained client after
client with ``torch.optim.SGD``. :class:`BatchedEngine` (in :mod:`fedhv.sim.batched`)
runs all sampled clients in lockstep. Both consume the same :mod:`fedhv.sim.plan`
randomness and must produce the same replies (tested in float64).
"""

from __future__ import annotations

import numpy as np
import torch

from fedhv.algorithms.base import ClientReplies, RoundRequest
from fedhv.data.federated import FederatedData
from fedhv.metrics.evaluate import per_sample_losses
from fedhv.models.base import MultiTaskModel
from fedhv.models.params import ParamLayout, get_flat, set_flat
from fedhv.sim.local import rotate, task_nll
from fedhv.sim.plan import ClientPlan, client_plan, report_indices


class Engine:
    """Common set-up of the simulator engines.

    Parameters
    ----------
    model : MultiTaskModel
        Working copy of the architecture (its parameters are overwritten).
    data : FederatedData
    local_steps, batch_size : int
        ``K`` and ``B``.
    lr_local, momentum : float
        Local SGD (momentum buffers restart every round).
    seed : int
        Run seed; together with ``stream`` it keys every random draw.
    stream : str
        Separates e.g. calibration from training randomness.
    eval_batch_size : int
        Chunk size of report evaluation.
    """

    def __init__(
        self,
        model: MultiTaskModel,
        data: FederatedData,
        local_steps: int,
        batch_size: int,
        lr_local: float,
        momentum: float,
        seed: int,
        stream: str = "train",
        eval_batch_size: int = 4096,
    ) -> None:
        self.model = model
        self.data = data
        self.layout = ParamLayout.of(model)
        self.local_steps = local_steps
        self.batch_size = batch_size
        self.lr_local = lr_local
        self.momentum = momentum
        self.seed = seed
        self.stream = stream
        self.eval_batch_size = eval_batch_size
        self.dtype = next(model.parameters()).dtype

    def plan(self, client: int, round_idx: int) -> ClientPlan:
        """The random choices of ``client`` in ``round_idx``."""
        return client_plan(
            self.seed,
            self.stream,
            round_idx,
            client,
            self.data.parts[client],
            self.local_steps,
            self.batch_size,
            self.data.rotation_degrees,
            self.model.dropout_sites(),
            self.model.dropout,
        )

    def report_indices(self, client: int, round_idx: int, request: RoundRequest) -> torch.Tensor:
        return report_indices(
            self.seed, self.stream, round_idx, client, self.data.parts[client], request.report_batches, self.batch_size
        )

    def batch(self, idx: torch.Tensor, angles: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather (and augment) a minibatch of training samples."""
        x = self.data.train_x[idx]
        if angles is not None:
            x = rotate(x, angles)
        return x, self.data.train_y[idx]

    def weights_tensor(self, request: RoundRequest) -> torch.Tensor:
        return torch.as_tensor(np.asarray(request.weights), dtype=self.dtype)

    def run_clients(
        self, theta: torch.Tensor, clients: np.ndarray, request: RoundRequest, round_idx: int
    ) -> ClientReplies:
        raise NotImplementedError


class SequentialEngine(Engine):
    """Reference engine: clients one after another on one module."""

    def _report(self, client: int, round_idx: int, request: RoundRequest) -> torch.Tensor:
        idx = self.report_indices(client, round_idx, request)
        self.model.eval()
        losses, _ = per_sample_losses(self.model, self.data.train_x[idx], self.data.train_y[idx], self.eval_batch_size)
        self.model.train()
        return losses.mean(0)

    def run_clients(
        self, theta: torch.Tensor, clients: np.ndarray, request: RoundRequest, round_idx: int
    ) -> ClientReplies:
        w = self.weights_tensor(request)
        deltas, reports = [], []
        for client in clients:
            client = int(client)
            set_flat(self.model, theta)
            if request.report:
                reports.append(self._report(client, round_idx, request))
            plan = self.plan(client, round_idx)
            opt = torch.optim.SGD(self.model.parameters(), lr=self.lr_local, momentum=self.momentum)
            self.model.train()
            for s in range(self.local_steps):
                x, y = self.batch(plan.batches[s], None if plan.angles is None else plan.angles[s])
                logps = self.model(x, {site: m[s] for site, m in plan.masks.items()})
                loss = (task_nll(logps, y) * w).sum()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            deltas.append(get_flat(self.model) - theta)
        return ClientReplies(
            clients=np.asarray(clients),
            deltas=torch.stack(deltas),
            reports=torch.stack(reports) if request.report else None,
        )
