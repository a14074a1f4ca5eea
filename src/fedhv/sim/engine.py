"""Execution engines: the client-side primitives for all sampled clients of a round.

:class:`SequentialEngine` is the reference: one ``nn.Module`` per computation, client
after client, with ``torch.optim.SGD``. :class:`~fedhv.sim.batched.BatchedEngine` runs
all sampled clients (and all trajectories) in lockstep. Both consume the same
:mod:`fedhv.sim.plan` randomness and must produce the same results (tested in
float64).

The three primitives (see :mod:`fedhv.algorithms.base`):

- ``reports(theta, clients, round, budget) -> [k, m]``
- ``gradients(theta, clients, W [T, m], round) -> [k, T, d]``
- ``train(theta, clients, W [T, m], round, first_step, draw) -> [k, T, d]``; with a
  :class:`~fedhv.algorithms.base.StepDraw` ``draw`` (one row ``W``), local step ``s`` of client
  ``k`` trains on the weights the client draws from ``(seed, stream, draw.key, round, k, s)``
  (:meth:`Engine.drawn_weights`) instead of ``W``'s row

Devices: an engine computes on its model's device (``Engine.device``); the data, the
plans (drawn on the CPU, :mod:`fedhv.sim.plan`) and the task weights
(:meth:`Engine.as_tensor`) are on that device, and so are the returned tensors.
``theta`` must be on it too.

Buffers (BatchNorm running statistics and the like) are federated as FedAvg federates a
model's ``state_dict``: every trained copy starts a round from the global buffers (the
working model's), updates them in its own forward passes (train mode), and after
:meth:`Engine.train` the global buffers become the mean over the copies whose buffers
are finite (integer buffers such as ``num_batches_tracked``: the rounded mean). They are
not scaled by ``eta_g`` (they are statistics, not a descent direction). Gradient passes
(:meth:`Engine.gradients`) and reports (eval mode) leave them unchanged. Models without
buffers (every built-in one) skip all of this.

Frozen parameters (``requires_grad=False``) are not part of ``theta`` (:mod:`fedhv.models.params`):
every engine differentiates, clips and steps the trainable parameters only, and a frozen
parameter keeps the working model's value in every forward pass (the batched engine
passes it, unbatched, to every copy), so no method moves it and no update carries it.

Precision: with ``precision = "bf16"`` every forward pass (local training, gradients,
reports) runs under ``torch.autocast`` to bfloat16 and its outputs are cast back to the
engine's dtype before the losses (:mod:`fedhv.sim.precision`); gradients and updates
stay in the engine's dtype.
"""

from __future__ import annotations

import numpy as np
import torch

from fedhv.algorithms.base import StepDraw
from fedhv.data.federated import FederatedData
from fedhv.metrics.evaluate import per_sample_losses
from fedhv.models.base import MultiTaskModel
from fedhv.models.params import ParamLayout, frozen, get_flat, set_flat, trainable
from fedhv.sim.local import rotate
from fedhv.sim.local_opt import LocalTraining
from fedhv.sim.plan import ClientPlan, client_plan, report_indices
from fedhv.sim.precision import amp_module, autocast, to_dtype


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
    precision : str
        ``"fp32"`` or ``"bf16"`` (forward passes under bfloat16 autocast).
    local : LocalTraining, optional
        Optimizer, local epochs and gradient clipping (:mod:`fedhv.sim.local_opt`; default:
        the paper's SGD for ``local_steps`` steps).

    Attributes
    ----------
    device : torch.device
        Where the engine computes: the model's device (the data must be on it).
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
        eval_batch_size: int = 2048,
        precision: str = "fp32",
        local: LocalTraining | None = None,
    ) -> None:
        self.model = model
        self.local = local or LocalTraining()
        self.local.make([torch.zeros(1, requires_grad=True)], lr_local, momentum)  # option conflicts fail here
        self.precision = precision
        self.data = data
        self.layout = ParamLayout.of(model)
        self.params = [p for _, p in trainable(model)]  # what training differentiates and steps
        self.frozen = dict(frozen(model))  # fixed values every copy reads (not in theta)
        if not self.params:
            raise ValueError("the model has no trainable parameters (every parameter has requires_grad=False); "
                             "leave at least one parameter trainable")
        self.local_steps = local_steps
        self.batch_size = batch_size
        self.lr_local = lr_local
        self.momentum = momentum
        self.seed = seed
        self.stream = stream
        self.eval_batch_size = eval_batch_size
        first = next(model.parameters())
        self.dtype = first.dtype
        self.device = first.device
        if data.train_x.device != self.device:
            raise ValueError(
                f"the data is on {data.train_x.device} but the model on {self.device}; put both on one device"
            )
        if precision != "fp32" and self.dtype != torch.float32:
            raise ValueError(f"precision = {precision!r} needs a float32 model, not {self.dtype}")
        autocast(precision, self.device)  # rejects an unknown precision here, not in the first round
        self.buffers = [b for _, b in model.named_buffers()]
        self.buffer_names = [n for n, _ in model.named_buffers()]

    def buffer_snapshot(self) -> list[torch.Tensor]:
        """Copies of the global buffers."""
        return [b.detach().clone() for b in self.buffers]

    @torch.no_grad()
    def load_buffers(self, values: list[torch.Tensor]) -> None:
        """Overwrite the global buffers (in place, so every view of the model sees them)."""
        for b, v in zip(self.buffers, values):
            b.copy_(v)

    @torch.no_grad()
    def merge_buffers(self, stacked: list[torch.Tensor]) -> None:
        """Global buffers <- mean over copies (``stacked[j] [n, ...]``) whose float buffers are finite."""
        if not self.buffers:
            return
        n = stacked[0].shape[0]
        ok = torch.ones(n, dtype=torch.bool, device=stacked[0].device)
        for s in stacked:
            if s.is_floating_point():
                ok &= torch.isfinite(s.reshape(n, -1)).all(1)
        if not bool(ok.any()):
            return
        for b, s in zip(self.buffers, stacked):
            mean = s[ok].double().mean(0)
            b.copy_(mean if b.is_floating_point() else mean.round())

    def steps_of(self, client: int) -> int:
        """Local steps of ``client`` this round (``local_steps``, or from its size with local epochs)."""
        return self.local.steps(len(self.data.parts[client]), self.batch_size, self.local_steps)

    def plan(self, client: int, round_idx: int, steps: int, tag: str, copy: int) -> ClientPlan:
        """The random choices of one trajectory (or gradient) of ``client``."""
        return client_plan(
            self.seed, self.stream, round_idx, client, self.data.parts[client], steps, self.batch_size,
            self.data.augment, self.model.dropout_sites(), self.model.dropout_rates(), tag, copy,
        )

    def report_indices(self, client: int, round_idx: int, budget: int | str) -> torch.Tensor:
        return report_indices(self.seed, self.stream, round_idx, client, self.data.parts[client], budget,
                              self.batch_size)

    def batch(self, plan: ClientPlan, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather (and augment) the step-``step`` minibatch of a plan."""
        idx = plan.batches[step]
        x = self.data.train_x[idx]
        if plan.angles is not None:
            x = rotate(x, plan.angles[step], self.data.augment.interpolation if self.data.augment else "bilinear")
        if plan.flips is not None:
            x = torch.where(plan.flips[step], x.flip(-1), x)  # on the device: no host round trip
        return x, self.data.train_y[idx]

    def as_tensor(self, weights: np.ndarray) -> torch.Tensor:
        """Task weights (numpy, from the server) as a tensor of the engine's dtype and device."""
        return torch.as_tensor(np.asarray(weights), dtype=self.dtype, device=self.device)

    def drawn_weights(self, draw: StepDraw, client: int, round_idx: int, steps: int) -> torch.Tensor:
        """``[steps, m]``: the task weights ``client`` draws for its local steps of round ``round_idx``
        (:meth:`StepDraw.rows <fedhv.algorithms.base.StepDraw.rows>` keyed by this engine's seed and stream)."""
        return self.as_tensor(draw.rows(self.seed, self.stream, round_idx, client, steps, self.data.num_tasks))

    @staticmethod
    def check_draw(weights: np.ndarray, first_step: torch.Tensor | None, draw: StepDraw | None) -> None:
        """Refuse a draw with several weight rows or with a first step (``ValueError``)."""
        if draw is not None and (len(weights) != 1 or first_step is not None):
            raise ValueError(f"a per-step draw trains one trajectory without a first step; got {len(weights)} "
                             f"weight rows{' and a first step' if first_step is not None else ''}")

    def reports(self, theta: torch.Tensor, clients: np.ndarray, round_idx: int, budget: int | str) -> torch.Tensor:
        """Task losses ``[k, m]`` at ``theta`` (eval mode, no augmentation)."""
        raise NotImplementedError

    def gradients(self, theta: torch.Tensor, clients: np.ndarray, weights: np.ndarray, round_idx: int) -> torch.Tensor:
        """Gradients ``[k, T, d]`` of ``sum_i W_ti l_i`` at ``theta``, one fresh batch each."""
        raise NotImplementedError

    def train(
        self,
        theta: torch.Tensor,
        clients: np.ndarray,
        weights: np.ndarray,
        round_idx: int,
        first_step: torch.Tensor | None = None,
        draw: StepDraw | None = None,
    ) -> torch.Tensor:
        """Updates ``[k, T, d]`` of ``K``-step trajectories on ``sum_i W_ti l_i`` (with ``draw``: on each
        step's drawn weights, :meth:`drawn_weights`)."""
        raise NotImplementedError


class SequentialEngine(Engine):
    """Reference engine: one computation after another on one module."""

    def reports(self, theta: torch.Tensor, clients: np.ndarray, round_idx: int, budget: int | str) -> torch.Tensor:
        set_flat(self.model, theta)
        self.model.eval()
        out = []
        for client in clients:
            idx = self.report_indices(int(client), round_idx, budget)
            losses, _ = per_sample_losses(amp_module(self.model, self.precision), self.data.train_x,
                                          self.data.train_y, self.eval_batch_size, self.data.objective, rows=idx)
            out.append(losses.mean(0))
        self.model.train()
        return torch.stack(out)

    def _loss(self, plan: ClientPlan, step: int, w: torch.Tensor) -> torch.Tensor:
        x, y = self.batch(plan, step)
        if self.precision == "fp32":
            logps = self.model(x, {site: m[step] for site, m in plan.masks.items()})
        else:
            with autocast(self.precision, self.device):
                logps = self.model(x, {site: m[step] for site, m in plan.masks.items()})
            logps = to_dtype(logps, self.dtype)
        return (self.data.objective.batch_losses(logps, y) * w).sum()

    def gradients(self, theta: torch.Tensor, clients: np.ndarray, weights: np.ndarray, round_idx: int) -> torch.Tensor:
        w = self.as_tensor(weights)
        self.model.train()
        start = self.buffer_snapshot()
        out = []
        for client in clients:
            rows = []
            for t in range(len(w)):
                set_flat(self.model, theta)
                plan = self.plan(int(client), round_idx, 1, "grads", t)
                grads = torch.autograd.grad(self._loss(plan, 0, w[t]), self.params)
                rows.append(torch.cat([g.reshape(-1) for g in grads]))
                self.load_buffers(start)
            out.append(torch.stack(rows))
        return torch.stack(out)

    def train(
        self,
        theta: torch.Tensor,
        clients: np.ndarray,
        weights: np.ndarray,
        round_idx: int,
        first_step: torch.Tensor | None = None,
        draw: StepDraw | None = None,
    ) -> torch.Tensor:
        self.check_draw(weights, first_step, draw)
        w = self.as_tensor(weights)
        self.model.train()
        start = self.buffer_snapshot()
        finals: list[list[torch.Tensor]] = []
        out = []
        for row, client in enumerate(clients):
            deltas = []
            steps = self.steps_of(int(client))
            clip = self.local.clip_grad_norm
            drawn = None if draw is None else self.drawn_weights(draw, int(client), round_idx, steps)
            for t in range(len(w)):
                set_flat(self.model, theta)
                self.load_buffers(start)
                plan = self.plan(int(client), round_idx, steps, "train", t)
                opt = self.local.make(self.params, self.lr_local, self.momentum)
                for s in range(steps):
                    opt.zero_grad(set_to_none=True)
                    if s == 0 and first_step is not None:
                        for p, g in zip(self.params, self.layout.views(first_step[row, t]).values()):
                            p.grad = g.clone()
                    else:
                        self._loss(plan, s, w[t] if drawn is None else drawn[s]).backward()
                    if clip:
                        torch.nn.utils.clip_grad_norm_(self.params, clip)
                    opt.step()
                deltas.append(get_flat(self.model) - theta)
                finals.append(self.buffer_snapshot())
            out.append(torch.stack(deltas))
        if self.buffers:
            self.merge_buffers([torch.stack(col) for col in zip(*finals)])
        return torch.stack(out)
