"""Batched engine: all sampled clients (and all their trajectories) in lockstep.

The ``n = k * T`` model copies (client-major: copy ``c = i * T + t``) are one leaf
tensor ``P [n, d]``; each local step gathers the ``n`` minibatches ``[n, B, ...]``,
evaluates all copies at once with the model's ``forward_batched`` (copies folded into
the channel dimension: grouped convolutions and batched matrix products;
``torch.func.vmap`` as a fallback), differentiates ``sum_c L_c`` (copies are
independent, so row ``c`` of the gradient is copy ``c``'s gradient) and applies SGD with
momentum to all rows (``d`` counts the trainable parameters only: frozen ones are passed to
every copy unchanged, :mod:`fedhv.sim.engine`). ``chunk`` bounds how many copies run at once (memory).
Reports are one evaluation pass over the union of the clients' report samples, since
every client evaluates the same ``theta^t``.

The copies' plans are stacked once per round (:func:`~fedhv.sim.plan.stack_plans`,
on the engine's device), so a local step only slices them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch.func import functional_call, vmap

from fedhv.algorithms.base import StepDraw
from fedhv.metrics.evaluate import per_sample_losses
from fedhv.models.params import set_flat
from fedhv.sim.engine import Engine
from fedhv.sim.local import rotate
from fedhv.sim.local_opt import clip_rows
from fedhv.sim.memory import ChunkChoice
from fedhv.sim.plan import ClientPlan, stack_plans
from fedhv.sim.precision import amp_module, autocast, to_dtype


class BatchedEngine(Engine):
    """Lockstep engine; ``chunk`` limits how many model copies run at once (0 = all).

    ``chunk_choice`` is the :class:`~fedhv.sim.memory.ChunkChoice` behind an automatic
    ``chunk`` (``engine_chunk = "auto"``; set by :func:`fedhv.experiment.setup.make_engine`),
    else ``None``.
    """

    def __init__(self, *args, chunk: int = 0, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        if chunk < 0:
            raise ValueError(f"chunk = {chunk} must be >= 0 (0 = all model copies at once)")
        self.chunk = chunk
        self.chunk_choice: ChunkChoice | None = None
        self._forward = self._make_forward()

    def _make_forward(self) -> Callable[..., list[torch.Tensor]]:
        fused = getattr(self.model, "forward_batched", None)
        if fused is not None:
            return fused

        def single(params: dict, x: torch.Tensor, masks: dict, buffers: dict | None = None) -> list[torch.Tensor]:
            return functional_call(self.model, {**params, **(buffers or {})}, (x, masks))

        return vmap(single)

    def reports(self, theta: torch.Tensor, clients: np.ndarray, round_idx: int, budget: int | str) -> torch.Tensor:
        """One inference pass over the union of the clients' report samples (all at ``theta``).

        Client ``j``'s report is the mean of rows ``[o_j, o_j + n_j)`` of the per-sample
        losses, ``o_j = n_0 + ... + n_{j-1}``: the same samples, model and maths as the
        sequential engine's per-client passes, gathered chunk by chunk
        (:func:`~fedhv.metrics.evaluate.per_sample_losses` with ``rows``).
        """
        idx = [self.report_indices(int(c), round_idx, budget) for c in clients]
        set_flat(self.model, theta)
        self.model.eval()
        losses, _ = per_sample_losses(
            amp_module(self.model, self.precision), self.data.train_x, self.data.train_y,
            self.eval_batch_size, self.data.objective, rows=torch.cat(idx),
        )
        self.model.train()
        return torch.stack([part.mean(0) for part in torch.split(losses, [len(i) for i in idx])])

    def _copies(self, clients: np.ndarray, weights: np.ndarray, round_idx: int, steps: int, tag: str,
                draw: StepDraw | None = None) -> tuple[ClientPlan, torch.Tensor]:
        """Stacked plan (``[n, ...]``) and per-copy task weights ``[n, m]`` of all (client, row) copies
        (with ``draw``: each copy's drawn weights of every step, ``[n, steps, m]``)."""
        plans = [self.plan(int(c), round_idx, steps, tag, t) for c in clients for t in range(len(weights))]
        if draw is not None:
            w = torch.stack([self.drawn_weights(draw, int(c), round_idx, steps) for c in clients
                             for _ in range(len(weights))])
        else:
            w = self.as_tensor(np.tile(np.asarray(weights), (len(clients), 1)))
        return stack_plans(plans), w

    def _copy_buffers(self, n: int) -> dict[str, torch.Tensor] | None:
        """``n`` private copies ``[n, ...]`` of the global buffers (None for a model without buffers)."""
        if not self.buffers:
            return None
        return {name: b.detach().unsqueeze(0).expand(n, *b.shape).clone()
                for name, b in zip(self.buffer_names, self.buffers)}

    def _losses(self, params: torch.Tensor, plan: ClientPlan, step: int, w: torch.Tensor,
                buffers: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Sum over copies of the weighted task losses on each copy's step-``step`` batch.

        ``buffers``: the copies' own buffers ``[n, ...]``, updated in place by train-mode
        layers (BatchNorm) through ``vmap``.
        """
        n, b = plan.batches.shape[0], self.batch_size
        idx = plan.batches[:, step].reshape(-1)
        x = self.data.train_x[idx]
        if plan.angles is not None:
            mode = self.data.augment.interpolation if self.data.augment else "bilinear"
            x = rotate(x, plan.angles[:, step].reshape(-1), mode)
        x = x.view(n, b, *x.shape[1:])
        if plan.flips is not None:
            x = torch.where(plan.flips[:, step].view(n, 1, 1, 1, 1), x.flip(-1), x)
        y = self.data.train_y[idx].view(n, b, -1)
        masks = {site: m[:, step] for site, m in plan.masks.items()}
        extra = () if buffers is None else (buffers,)
        views = self.layout.views(params)
        # frozen parameters: not in theta; every copy reads the model's own value (a stride-0 view, no copy)
        views.update({name: p.detach().expand(n, *p.shape) for name, p in self.frozen.items()})
        if self.precision == "fp32":
            logps = self._forward(views, x, masks, *extra)
        else:
            with autocast(self.precision, self.device):
                logps = self._forward(views, x, masks, *extra)
            logps = to_dtype(logps, self.dtype)
        return (self.data.objective.batch_losses(logps, y) * w).sum()

    def _chunks(self, n: int) -> list[slice]:
        size = self.chunk or n
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def gradients(self, theta: torch.Tensor, clients: np.ndarray, weights: np.ndarray, round_idx: int) -> torch.Tensor:
        plan, w = self._copies(clients, weights, round_idx, 1, "grads")
        out = []
        for part in self._chunks(len(w)):
            params = theta.detach().expand(part.stop - part.start, -1).clone().requires_grad_(True)
            bufs = self._copy_buffers(part.stop - part.start)  # discarded: gradients leave the buffers alone
            (grad,) = torch.autograd.grad(self._losses(params, plan.select(part), 0, w[part], bufs), params)
            out.append(grad)
        return torch.cat(out).view(len(clients), len(weights), -1)

    def train(
        self,
        theta: torch.Tensor,
        clients: np.ndarray,
        weights: np.ndarray,
        round_idx: int,
        first_step: torch.Tensor | None = None,
        draw: StepDraw | None = None,
    ) -> torch.Tensor:
        """Updates ``[k, T, d]``; clients with different step counts (local epochs) run as separate locksteps."""
        self.check_draw(weights, first_step, draw)
        steps = [self.steps_of(int(c)) for c in clients]
        groups: dict[int, list[int]] = {}
        for row, k in enumerate(steps):
            groups.setdefault(k, []).append(row)
        t_rows = len(weights)
        if len(groups) == 1:
            out, finals = self._train_group(theta, clients, weights, round_idx, first_step, steps[0], draw)
        else:
            out = theta.new_empty(len(clients), t_rows, theta.numel())
            finals = {}
            for k, rows in groups.items():
                sub = None if first_step is None else first_step[rows]
                deltas, bufs = self._train_group(theta, clients[rows], weights, round_idx, sub, k, draw)
                out[rows] = deltas
                copies = torch.tensor([r * t_rows + t for r in rows for t in range(t_rows)], device=theta.device)
                for name, value in bufs.items():
                    if name not in finals:
                        finals[name] = value.new_empty(len(clients) * t_rows, *value.shape[1:])
                    finals[name][copies] = value
        if finals:
            self.merge_buffers([finals[name] for name in self.buffer_names])
        return out

    def _train_group(self, theta: torch.Tensor, clients: np.ndarray, weights: np.ndarray, round_idx: int,
                     first_step: torch.Tensor | None, steps: int, draw: StepDraw | None = None
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``steps``-step trajectories of ``clients`` in lockstep: updates ``[k, T, d]`` and the copies'
        final buffers (``{name: [k T, ...]}``, empty for a model without buffers).

        The paper's SGD (:attr:`LocalTraining.plain_sgd`) is written out on the ``[n, d]`` rows;
        any other optimizer of :data:`fedhv.sim.local_opt.OPTIMIZERS` runs once over the
        ``[n, d]`` leaf (its update is elementwise, so the rows stay independent).
        """
        plan, w = self._copies(clients, weights, round_idx, steps, "train", draw)
        first = None if first_step is None else first_step.reshape(len(w), -1)
        clip = self.local.clip_grad_norm
        out = []
        finals: list[dict[str, torch.Tensor]] = []
        for part in self._chunks(len(w)):
            rows = plan.select(part)
            params = theta.detach().expand(part.stop - part.start, -1).clone().requires_grad_(True)
            bufs = self._copy_buffers(part.stop - part.start)
            opt = None if self.local.plain_sgd else self.local.make([params], self.lr_local, self.momentum)
            buf: torch.Tensor | None = None
            for s in range(steps):
                if s == 0 and first is not None:
                    grad = first[part].clone()
                else:
                    ws = w[part] if draw is None else w[part, s]
                    (grad,) = torch.autograd.grad(self._losses(params, rows, s, ws, bufs), params)
                if clip:
                    grad = clip_rows(grad, clip)
                if opt is not None:
                    params.grad = grad
                    opt.step()
                    continue
                with torch.no_grad():
                    if self.momentum:
                        buf = grad if buf is None else buf.mul_(self.momentum).add_(grad)
                        grad = buf
                    params.sub_(grad, alpha=self.lr_local)
            params.grad = None
            out.append(params.detach() - theta)
            if bufs is not None:
                finals.append(bufs)
        merged = {name: torch.cat([f[name] for f in finals]) for name in self.buffer_names} if finals else {}
        return torch.cat(out).view(len(clients), len(weights), -1), merged
