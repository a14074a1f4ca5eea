"""Every registered method's section, fuzzed through ``--set``, a TOML file and the Python API (issue 52).

Classes of input that once crashed a run or sized its memory or time without bound -- integers far beyond
any run (``dwa.report_batches = 10**19``, ``fedcmoo-*.power_iterations = 10**19``), subnormal and huge finite
floats (``dwa.temperature = 1e-320``, ``famo.lr = 1e308``, ``fsmgda-cagrad.c = 1e308``), lists of huge
entries (``linear.weights = [1e308, 1e308]``) -- are drawn for every numeric key of every method, so the next
key of the same kind is covered too:

- the three ways in agree: the value is accepted by all of them or refused by all with one line naming the key;
- an accepted value runs one round of its method on synthetic replies (every stage a method asks for): its
  weights pass their check (:mod:`fedhv.algorithms.weight_check`) or the round stops with one line naming the
  method, never a raw traceback, NaN weights or an unbounded loop;
- every integer key refuses ``10**19`` with its bound, before any data is loaded.
"""

from __future__ import annotations

import dataclasses
import math
import time
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedhv.algorithms  # noqa: F401  (registers the built-in methods)
from fedhv.algorithms.base import Replies, Request
from fedhv.algorithms.weight_check import problem
from fedhv.config import load_config
from fedhv.config.validation import validate
from fedhv.errors import ConfigError, FedHVError
from fedhv.models.params import TaskSlices
from fedhv.registry import METHODS

M = 2  # tasks of the synthetic problem
D = 12  # parameters: encoder 0..7, head 0 at 8..9, head 1 at 10..11
FLOATS = [0.0, -1.0, 5e-324, 1e-320, 1e-300, 1e-30, 1e-6, 1e-3, 0.1, 0.5, 1.0, 3.0, 100.0, 1e6, 1e30, 1e100,
          1e300, 1e308, 1.7976931348623157e308, -1e308]
INTS = [-1, 0, 1, 2, 5, 1000, 10**6, 10**6 + 1, 2**24, 2**24 + 1, 2**31, 10**19]
#: Reports the dry rounds see: ordinary losses, a falling and a vanishing one.
REPORTS = [np.array([2.3, 0.7]), np.array([1.5, 0.5]), np.array([1.2, 1e-12])]


def _keys() -> list[tuple[str, str, str]]:
    """``(method, key, kind)`` for every numeric key of every registered method's section."""
    out = []
    for name in METHODS.names():
        section = METHODS.get(name).section
        hints = typing.get_type_hints(section)
        for f in dataclasses.fields(section):
            tp = hints[f.name]
            if tp is bool or tp is str:
                continue
            kind = ("int" if tp is int else "float" if tp is float else
                    "floats" if "tuple" in str(tp) else "budget" if "int" in str(tp) else None)
            if kind is not None:
                out.append((name, f.name, kind))
    return out


KEYS = _keys()


def _value(kind: str) -> st.SearchStrategy[Any]:
    if kind in ("int", "budget"):
        return st.sampled_from(INTS)
    if kind == "float":
        return st.sampled_from(FLOATS)
    return st.lists(st.sampled_from(FLOATS), min_size=M, max_size=M).map(tuple)


def _toml(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(float(value)) if isinstance(value, float) else repr(value)


def _verdict(make: Any) -> tuple[str, Any]:
    try:
        return "ok", make()
    except ConfigError as exc:
        return "refused", str(exc)


def _python(name: str, key: str, value: Any) -> Any:
    cfg = load_config("multimnist")
    section = dataclasses.replace(METHODS.get(name).section(), **{key: value})
    cfg = dataclasses.replace(cfg.with_section(name, section), method=name)
    validate(cfg)
    return cfg


@dataclasses.dataclass
class _Calibration:
    reference: list[float]
    max_report: list[float]
    margin: float
    reports: dict[str, list[list[float]]]


class _Context:
    """A :class:`~fedhv.algorithms.method.BuildContext` of a synthetic two-task problem."""

    num_tasks = M
    task_names = ("a", "b")
    seed = 0
    benchmark = "synthetic"

    def task_slices(self) -> TaskSlices:
        return TaskSlices(torch.arange(8), (torch.arange(8, 10), torch.arange(10, 12)))

    def calibration(self) -> _Calibration:
        return _Calibration([2.45, 0.85], [2.3, 0.7], 0.15, {"0": [[2.3, 0.7], [2.0, 0.6]]})

    def initial_losses(self) -> np.ndarray:
        return np.array([2.3, 0.7])


class _Synthetic:
    """Answers every stage a method asks for with fixed synthetic replies of two clients."""

    def __init__(self, report: np.ndarray, round_idx: int) -> None:
        self.round_idx = round_idx
        self._report = report
        g = torch.Generator().manual_seed(round_idx)
        self._grads = torch.randn(2, M, D, generator=g, dtype=torch.float64)

    @property
    def clients(self) -> np.ndarray:
        return np.array([0, 1])

    def exchange(self, theta: torch.Tensor, request: Request) -> Replies:
        k = 2
        reports = torch.tensor(np.stack([self._report] * k)) if request.report is not None else None
        grads = None
        if request.gradients is not None:
            grads = torch.einsum("ti,kid->ktd", torch.as_tensor(request.gradients, dtype=torch.float64), self._grads)
        deltas = None
        if request.train is not None:
            deltas = -0.01 * torch.einsum("ti,kid->ktd", torch.as_tensor(request.train, dtype=torch.float64),
                                          self._grads)
        return Replies(self.clients, reports=reports, gradients=grads, deltas=deltas)

    def count_uplink(self, n: int) -> None:
        pass

    def count_downlink(self, n: int) -> None:
        pass

    def relay(self, down_bytes: int, up_bytes: int) -> None:
        pass


def _dry_rounds(cfg: Any, key: str) -> None:
    """Three rounds of ``cfg``'s method on synthetic replies: checked weights, or one line naming ``key``."""
    name = cfg.method
    method = METHODS.get(name).from_config(cfg)
    try:
        algorithm = method.build(_Context()).algorithm
        state = algorithm.init_state(M)
        theta = torch.zeros(D, dtype=torch.float64)
        start = time.perf_counter()
        for t, report in enumerate(REPORTS):
            result = algorithm.round(state, theta, _Synthetic(report, t))
            theta, state = result.theta, result.state
            weights = getattr(state, "weights", getattr(state, "last_weights", None))
            if weights is not None:
                assert problem(np.asarray(weights), "finite", M) is None, (name, weights)
            assert torch.isfinite(theta).all(), (name, theta)
        assert time.perf_counter() - start < 30, f"{name}: three synthetic rounds took over 30 s"
    except FedHVError as exc:
        message = str(exc)
        assert "\n" not in message and f"{name}.{key}" in message, message


@pytest.mark.parametrize("name", sorted({k[0] for k in KEYS}))
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_methods_section_refuses_or_runs_checked_weights(name: str, data: st.DataObject, tmp_path: Path
                                                               ) -> None:
    key, kind = data.draw(st.sampled_from([(k, kd) for n, k, kd in KEYS if n == name]), label="key")
    value = data.draw(_value(kind), label="value")
    text = _toml(value)
    via_set = _verdict(lambda: load_config("multimnist", [f"method='{name}'", f"{name}.{key}={text}"]))
    toml = tmp_path / f"{name}-{key}.toml"
    toml.write_text(f'extends = "multimnist"\nmethod = "{name}"\n\n["{name}"]\n{key} = {text}\n')
    via_toml = _verdict(lambda: load_config(str(toml)))
    via_python = _verdict(lambda: _python(name, key, value))
    verdicts = {"--set": via_set[0], "TOML": via_toml[0], "Python": via_python[0]}
    assert len(set(verdicts.values())) == 1, (f"{name}.{key} = {text}", verdicts, via_set[1], via_toml[1],
                                              via_python[1])
    if via_set[0] == "refused":
        for message in (via_set[1], via_toml[1], via_python[1]):
            assert "\n" not in message and f"{name}.{key}" in message, message
        return
    _dry_rounds(via_set[1], key)


INT_KEYS = [(n, k) for n, k, kd in KEYS if kd in ("int", "budget")]


@pytest.mark.parametrize(("name", "key"), INT_KEYS, ids=[f"{n}.{k}" for n, k in INT_KEYS])
def test_every_integer_key_is_bounded(name: str, key: str) -> None:
    """An integer a method reads sizes a loop or an allocation: ``10**19`` is refused, naming the bound."""
    with pytest.raises(ConfigError, match=rf"^{name}\.{key} = 10000000000000000000 .*bound") as info:
        load_config("multimnist", [f"method='{name}'", f"{name}.{key}=10000000000000000000"])
    assert "\n" not in str(info.value)


def test_the_fuzz_covers_the_keys_of_the_issue() -> None:
    """The classes of input above reach the keys issue 52 found (so a new key of the same kind is covered)."""
    found = {f"{n}.{k}" for n, k, _ in KEYS}
    assert {"dwa.report_batches", "dwa.temperature", "stch.mu", "rlw.std", "famo.lr", "linear.weights",
            "fsmgda-cagrad.c", "fsmgda-upgrad.reg_eps", "fedcmoo-pref.preference",
            "fedcmoo-upgrad.power_iterations", "fedhv.report_batches"} <= found
    assert all(math.isfinite(v) for v in FLOATS)
