"""Randomness inside a user's ``forward``, keyed to the run's streams or refused before round 1.

A user module's random draws must follow the run's seed (:mod:`fedhv.sim.plan`), so that the
batched and the sequential engine draw the same numbers, runs resume exactly and the global
torch seed changes nothing. :class:`~fedhv.models.module.ModuleAdapter` arranges that:

- ``nn.Dropout`` modules are replaced by :class:`KeyedDropout` (one site per module, each
  with its own ``p``);
- ``torch.nn.functional.dropout`` calls in ``forward`` are keyed too: a probe forward in train
  mode (:class:`RandomProbe`, a :class:`~torch.overrides.TorchFunctionMode`) finds them, and
  during training :class:`KeyedFunctional` replaces the ``k``-th call of a forward pass by
  ``h * mask / (1 - p)`` with the plan's keep-mask of site ``"F.dropout#k"`` (``k = 0, 1, ...``
  in call order). The call's ``p`` is read at the probe; each call must keep its ``p`` and a
  forward pass must make the same calls every time;
- every other random call the probe sees in train mode (``torch.rand*``, ``torch.randn*``,
  ``torch.bernoulli``, ``Tensor.uniform_``, ``F.dropout2d``, ``F.alpha_dropout``,
  ``F.rrelu(training=True)``, ``F.scaled_dot_product_attention(dropout_p > 0)``, ...) is
  refused before round 1 with a one-line error naming the call and the fix, and so is any
  random ATen op (tag ``nondeterministic_seeded``) a library function draws inside (e.g.
  ``nn.MultiheadAttention(dropout > 0)``).

A keep-mask has ``B x F`` entries for a batch of ``B`` rows, ``F`` the dropped tensor's values
per row (measured at the probe on 2 and 4 rows: a tensor whose size does not scale with the
batch, such as a weight, is refused). Models without functional random calls run without a
torch function mode (no per-op overhead).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from fedhv.errors import ConfigError

#: Plain random draws (torch functions and Tensor methods, by ``__name__``): never keyed.
_RANDOM = frozenset({
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "bernoulli", "bernoulli_",
    "multinomial", "normal", "normal_", "poisson", "uniform_", "random_", "exponential_", "geometric_", "cauchy_",
    "log_normal_", "binomial", "standard_gamma", "native_dropout",
})
#: Random in train mode only: ``(name, index of the training flag, default, index of p, default p)``.
_TRAIN_ONLY: dict[Any, tuple[str, int, str, bool, int, str, float]] = {
    F.dropout1d: ("F.dropout1d", 2, "training", True, 1, "p", 0.5),
    F.dropout2d: ("F.dropout2d", 2, "training", True, 1, "p", 0.5),
    F.dropout3d: ("F.dropout3d", 2, "training", True, 1, "p", 0.5),
    F.alpha_dropout: ("F.alpha_dropout", 2, "training", False, 1, "p", 0.5),
    F.feature_alpha_dropout: ("F.feature_alpha_dropout", 2, "training", False, 1, "p", 0.5),
    F.rrelu: ("F.rrelu", 3, "training", False, 1, "lower", 1.0),
    torch.dropout: ("torch.dropout", 2, "train", True, 1, "p", 0.5),
    torch.alpha_dropout: ("torch.alpha_dropout", 2, "train", True, 1, "p", 0.5),
    torch.feature_dropout: ("torch.feature_dropout", 2, "train", True, 1, "p", 0.5),
    torch.feature_alpha_dropout: ("torch.feature_alpha_dropout", 2, "train", True, 1, "p", 0.5),
    torch.rrelu: ("torch.rrelu", 3, "training", False, 1, "lower", 1.0),
}


def _arg(args: tuple, kwargs: dict, index: int, name: str, default: Any) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


def functional_site(k: int) -> str:
    """The plan's site name of a forward pass's ``k``-th ``F.dropout`` call."""
    return f"F.dropout#{k}"


def unkeyed_call(func: Any, args: tuple, kwargs: dict) -> str | None:
    """The name of ``func`` when this call draws random numbers the simulator cannot key, else ``None``."""
    spec = _TRAIN_ONLY.get(func)
    if spec is not None:
        name, ti, tname, tdefault, pi, pname, pdefault = spec
        if func in (F.rrelu, torch.rrelu):  # random when training (lower != upper)
            return name if bool(_arg(args, kwargs, ti, tname, tdefault)) else None
        live = bool(_arg(args, kwargs, ti, tname, tdefault)) and float(_arg(args, kwargs, pi, pname, pdefault)) > 0
        return name if live else None
    name = getattr(func, "__name__", "")
    if name == "scaled_dot_product_attention":
        return "F.scaled_dot_product_attention(dropout_p > 0)" if _arg(args, kwargs, 4, "dropout_p", 0.0) else None
    if name in _RANDOM:
        owner = getattr(func, "__objclass__", None)
        return f"Tensor.{name}" if owner is not None else f"torch.{name}"
    return None


def _dropout_args(args: tuple, kwargs: dict) -> tuple[torch.Tensor, float, bool, bool]:
    return (args[0], float(_arg(args, kwargs, 1, "p", 0.5)), bool(_arg(args, kwargs, 2, "training", True)),
            bool(_arg(args, kwargs, 3, "inplace", False)))


def _qualname(func: Any) -> str:
    owner = getattr(func, "__objclass__", None)
    if owner is not None:
        return f"Tensor.{getattr(func, '__name__', func)}"
    module = getattr(func, "__module__", None) or "torch"
    return f"{module}.{getattr(func, '__name__', func)}"


class RandomProbe(TorchFunctionMode):
    """Records a train-mode forward's ``F.dropout`` calls (``p``, values per row) and the first
    random call that cannot be keyed; dropout is the identity meanwhile (no RNG draws).

    Random calls are recognised by name at the torch-function level (:func:`unkeyed_call`) and,
    for those a composite function makes inside (``nn.MultiheadAttention``'s dropout, C++
    kernels), by :class:`RandomOps` at the dispatch level: every ATen op tagged
    ``nondeterministic_seeded`` is a draw from torch's generator.
    """

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows = rows
        self.calls: list[tuple[float, float]] = []
        self.refused: str | None = None
        self.current: str | None = None  # the torch function running now (for ops found inside it)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is F.dropout:
            h, p, training, _ = _dropout_args(args, kwargs)
            if training and p > 0:
                self.calls.append((p, h.numel() / self.rows))
            return h
        if self.refused is None:
            self.refused = unkeyed_call(func, args, kwargs)
        self.current = _qualname(func)
        try:
            return func(*args, **kwargs)
        finally:
            self.current = None


def _draws(op: Any, args: tuple, kwargs: dict | None) -> bool:
    """Whether a seeded ATen op draws in this call: not with ``dropout_p = 0`` (attention kernels)
    or ``train = False`` (``native_dropout``), the arguments that switch their randomness off."""
    kwargs = kwargs or {}
    for i, a in enumerate(op._schema.arguments):
        value = kwargs.get(a.name, args[i] if i < len(args) else a.default_value)
        if a.name == "dropout_p" and not value:
            return False
        if a.name in ("train", "training") and value is False:
            return False
    return True


class RandomOps(TorchDispatchMode):
    """Flags the first random ATen op (tag ``nondeterministic_seeded``) on ``probe``."""

    def __init__(self, probe: RandomProbe) -> None:
        super().__init__()
        self.probe = probe

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if self.probe.refused is None and torch.Tag.nondeterministic_seeded in func.tags and _draws(func, args, kwargs):
            where = self.probe.current
            self.probe.refused = f"{where} (random op {func})" if where else f"random op {func}"
        return func(*args, **(kwargs or {}))


class MaskBox:
    """The keep-masks of the current forward call (shared by the adapter and its dropouts) and
    the number of ``F.dropout`` calls made in it so far."""

    masks: dict[str, torch.Tensor] | None = None
    calls: int = 0


class KeyedDropout(nn.Module):
    """Inverted dropout with the caller's keep-mask for ``site`` (identity without one)."""

    def __init__(self, p: float, site: str, box: MaskBox) -> None:
        super().__init__()
        self.p, self.site, self._box = p, site, box

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        masks = self._box.masks
        if not masks or self.site not in masks:
            return h
        return h * masks[self.site].reshape(h.shape).to(h.dtype) * (1.0 / (1.0 - self.p))


class KeyedFunctional(TorchFunctionMode):
    """``F.dropout`` with the plan's keep-masks: call ``k`` of a forward pass uses site
    :func:`functional_site` ``(k)`` and the ``p`` the probe saw (identity without masks)."""

    def __init__(self, box: MaskBox, rates: list[float]) -> None:
        super().__init__()
        self.box, self.rates = box, rates

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is not F.dropout:
            return func(*args, **kwargs)
        h, p, training, inplace = _dropout_args(args, kwargs)
        if not training or p == 0:
            return h
        k = self.box.calls
        self.box.calls += 1
        masks = self.box.masks
        if not masks:
            return h
        if k >= len(self.rates):
            raise ConfigError(f"the model's forward called F.dropout {k + 1} times but {len(self.rates)} times in the "
                              "check before round 1; make the F.dropout calls of a forward pass fixed")
        if p != self.rates[k]:
            raise ConfigError(f"F.dropout call {k + 1} of the model's forward used p = {p}, not the p = {self.rates[k]} "
                              "it had before round 1; give each F.dropout call a fixed p")
        mask = masks[functional_site(k)]
        if mask.numel() != h.numel():
            raise ConfigError(f"F.dropout call {k + 1} of the model's forward drops {h.numel()} values, not the "
                              f"{mask.numel()} of its site; drop per-sample activations of a fixed size per row")
        keep = mask.reshape(h.shape).to(h.dtype) * (1.0 / (1.0 - p))
        return h.mul_(keep) if inplace else h * keep


def probe_random(module: nn.Module, example: torch.Tensor) -> list[tuple[float, int]]:
    """``(p, values per row)`` of each ``F.dropout`` call of a train-mode forward of ``module``.

    Two forward passes (2 and 4 rows, no gradients; buffers, mode and the global RNG restored).

    Raises
    ------
    ConfigError
        For a random call that cannot be keyed, a forward that fails in train mode, or an
        ``F.dropout`` whose dropped tensor does not scale with the batch.
    """
    rows = example[:2]
    saved = {n: b.clone() for n, b in module.named_buffers()}
    was = module.training
    found = []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            module.train()
            for x in (rows, torch.cat([rows, rows])):
                probe = RandomProbe(len(x))
                try:
                    with RandomOps(probe), probe:
                        module(x)
                except Exception as exc:  # noqa: BLE001 - any failure of the user's forward, reported in one line
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    raise ConfigError(f"the model fails in train mode on {len(x)} rows of x: {type(exc).__name__}: "
                                      f"{first}; check the model's forward in train mode") from None
                if probe.refused:
                    attention = any(k in probe.refused for k in ("attention", "multi_head"))
                    hint = (" (nn.MultiheadAttention / nn.Transformer* layers: give them dropout=0 and add "
                            "nn.Dropout after them)") if attention else ""
                    raise ConfigError(
                        f"the model's forward calls {probe.refused} in train mode: random numbers the simulator "
                        "cannot key to the run's seed (results would change with the global torch seed and differ "
                        "between engines); use nn.Dropout or F.dropout (keyed per client, round and step)"
                        f"{hint}, or draw the randomness outside forward")
                found.append(probe.calls)
    finally:
        module.train(was)
        with torch.no_grad():
            for n, b in module.named_buffers():
                b.copy_(saved[n])
    small, large = found
    if len(small) != len(large) or any(a[0] != b[0] for a, b in zip(small, large)):
        raise ConfigError("the model's forward makes different F.dropout calls on 2 and on 4 rows; make the F.dropout "
                          "calls of a forward pass independent of the batch")
    for k, ((p, a), (_, b)) in enumerate(zip(small, large)):
        if a != b or a != int(a):
            raise ConfigError(f"F.dropout call {k + 1} of the model's forward (p = {p}) drops a tensor whose size does "
                              "not grow with the batch (e.g. a weight); the simulator keys dropout per sample: drop "
                              "activations, or apply the randomness outside forward")
    return [(p, int(a)) for p, a in small]
