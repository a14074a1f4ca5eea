"""Any ``nn.Module`` in the simulator engines, through ``torch.func``.

:class:`ModuleAdapter` wraps a user module that maps ``x [B, ...]`` to one output per task
(a list, tuple or dict by task name) as a :class:`~fedhv.models.base.MultiTaskModel`:

- every ``nn.Dropout`` is replaced by a keyed dropout that multiplies by the plan's
  keep-mask (``h * mask / (1 - p)``; :mod:`fedhv.sim.plan`), so the sequential and the
  batched engine draw identical masks and runs resume exactly; in eval mode it is the
  identity, as ``nn.Dropout`` is. Each layer keeps its own ``p``; ``F.dropout`` calls in
  ``forward`` are keyed the same way and any other random call is refused before round 1
  (:mod:`fedhv.models.keyed`);
- :meth:`ModuleAdapter.forward_batched` runs ``n`` parameter copies at once with
  ``vmap(functional_call(...), randomness="different")`` over ``(params [n, ...],
  x [n, B, ...], masks [n, B, F])``.

:func:`vmap_problem` tries one batched forward and backward; modules vmap cannot run
are then run by the sequential engine. Buffers (BatchNorm's running statistics) are
batched like the parameters: each copy gets its own ``[n, ...]`` slice, which
train-mode BatchNorm updates in place through ``vmap`` (its batch statistics are each
copy's own batch), so BatchNorm models run on the batched engine. How the engines
federate buffers: :mod:`fedhv.sim.engine`.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

from fedhv.errors import ConfigError
from fedhv.models.base import MultiTaskModel
from fedhv.models.keyed import KeyedDropout, KeyedFunctional, MaskBox, functional_site, probe_random
from fedhv.models.params import trainable


class ModuleAdapter(MultiTaskModel):
    """A user module as a :class:`MultiTaskModel` (a deep copy; the user's module is untouched).

    Parameters
    ----------
    module : nn.Module
        ``module(x) -> one output per task``.
    task_names : tuple of str
    example : Tensor
        A few input rows, to measure the dropout sites' feature sizes.
    heads : str
        Attribute holding the per-task heads (``nn.ModuleList``/``Sequential``, one per
        task), for the methods that separate encoder and heads (FSMGDA, FedCMOO).
    """

    def __init__(self, module: nn.Module, task_names: tuple[str, ...], example: torch.Tensor,
                 heads: str = "heads") -> None:
        super().__init__()
        self.module = copy.deepcopy(module)
        self.task_names = task_names
        self.head_prefix = f"module.{heads}."
        self.heads_name = heads
        self._box = MaskBox()
        if not trainable(self.module):
            raise ConfigError("the model has no trainable parameter (every parameter has requires_grad=False); "
                              "leave at least one parameter trainable (requires_grad=True)")
        drops = [(n, m) for n, m in self.module.named_modules() if type(m) is nn.Dropout and m.p > 0]
        shapes: dict[str, tuple[int, ...]] = {}
        hooks = [m.register_forward_hook(lambda mod, inp, out, n=n: shapes.__setitem__(n, tuple(inp[0].shape[1:])))
                 for n, m in drops]
        was = self.module.training
        try:
            with torch.no_grad():
                self.module.eval()
                out = self.module(example[:2])
        except Exception as exc:  # noqa: BLE001 - any failure of the user's forward, reported in one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"the model fails on 2 rows of x (shape {list(example[:2].shape)}, {example.dtype}): "
                              f"{type(exc).__name__}: {first}; make forward(x) accept a batch of x") from None
        finally:
            self.module.train(was)
            for h in hooks:
                h.remove()
        self._outputs(out)
        self._sites = {n: math.prod(shapes[n]) for n, _ in drops}
        self._rates = {n: float(m.p) for n, m in drops}
        for name, m in drops:
            parent, _, leaf = name.rpartition(".")
            setattr(self.module.get_submodule(parent) if parent else self.module, leaf,
                    KeyedDropout(float(m.p), name, self._box))
        calls = probe_random(self.module, example)  # F.dropout calls keyed; other random calls refused here
        for k, (p, size) in enumerate(calls):
            self._sites[functional_site(k)] = size
            self._rates[functional_site(k)] = p
        self._functional = [p for p, _ in calls]
        self.dropout = max(self._rates.values(), default=0.0)  # the largest rate (each site has its own)

    def dropout_sites(self) -> dict[str, int]:
        return dict(self._sites)

    def dropout_rates(self) -> dict[str, float]:
        return dict(self._rates)

    def user_state_dict(self) -> dict[str, torch.Tensor]:
        """The user's module's ``state_dict`` (its own key names: no ``module.`` prefix)."""
        return self.module.state_dict()

    def _outputs(self, out: Any) -> list[torch.Tensor]:
        m = len(self.task_names)
        if isinstance(out, dict):
            missing = [n for n in self.task_names if n not in out]
            if missing:
                raise ConfigError(f"the model's output dict lacks the tasks {missing}; return one output per task")
            return [out[n] for n in self.task_names]
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        if len(outs) != m:
            raise ConfigError(f"the model returned {len(outs)} output(s) for {m} tasks {list(self.task_names)}; "
                              "return a list/tuple (or dict by task name) with one output per task")
        return outs

    def forward(self, x: torch.Tensor, masks: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        self._box.masks, self._box.calls = masks, 0
        try:
            if not self._functional:
                return self._outputs(self.module(x))
            with KeyedFunctional(self._box, self._functional):
                return self._outputs(self.module(x))
        finally:
            self._box.masks = None

    def forward_batched(self, params: dict[str, torch.Tensor], x: torch.Tensor, masks: dict[str, torch.Tensor],
                        buffers: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Outputs ``[n, B, ...]`` of ``n`` parameter copies on their own batches.

        ``buffers``: the copies' own buffers ``[n, ...]`` (by ``named_buffers`` name), updated
        in place by train-mode layers; without them the module's own buffers are used
        (read-only layers only).
        """
        if buffers:
            def with_buffers(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], xb: torch.Tensor,
                             mb: dict[str, torch.Tensor]) -> list[torch.Tensor]:
                return functional_call(self, {**p, **b}, (xb, mb))

            return vmap(with_buffers, randomness="different")(params, buffers, x, masks)

        def single(p: dict[str, torch.Tensor], xb: torch.Tensor, mb: dict[str, torch.Tensor]) -> list[torch.Tensor]:
            return functional_call(self, p, (xb, mb))

        return vmap(single, randomness="different")(params, x, masks)


def vmap_problem(model: ModuleAdapter, example: torch.Tensor) -> str | None:
    """``None`` when a two-copy batched forward and backward runs, else the error's first line."""
    params = {n: p.detach().unsqueeze(0).expand(2, *p.shape).clone().requires_grad_(p.requires_grad)
              for n, p in model.named_parameters()}
    x = example[:2].unsqueeze(0).expand(2, *example[:2].shape)
    masks = {s: torch.ones(2, x.shape[1], f, dtype=torch.bool, device=example.device) for s, f in model.dropout_sites().items()}
    saved = {n: b.clone() for n, b in model.named_buffers()}
    buffers = {n: b.detach().unsqueeze(0).expand(2, *b.shape).clone() for n, b in model.named_buffers()}
    try:
        model.train()
        outs = model.forward_batched(params, x, masks, buffers or None)
        torch.autograd.grad(torch.stack([o.float().sum() for o in outs]).sum(),
                            [p for p in params.values() if p.requires_grad], allow_unused=True)
    except Exception as exc:  # noqa: BLE001 - any failure means: use the sequential engine
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(saved[n])
    return None
