"""What a method declares about its tuning: the dimensions ``fedhv tune`` searches (docs/methods.md,
"Tuning every method under one budget").

A method's search space is :meth:`fedhv.algorithms.method.Method.search_space`: its two learning rates
(:data:`LEARNING_RATES`, from the base class) and the dimensions of its own hyper-parameters, declared in
its own module as the class attribute ``tuning`` (a Gramian rule declares them on the rule). A dimension
names a configuration key:

- :class:`Rate`: the method's server (``global``) or local learning rate, log-uniform between ``low``
  and ``high`` times the rate the setting gives it (``[lr.<method>]``, or the rates it borrows), written
  as ``lr.<method>.global`` / ``lr.<method>.local``;
- :class:`Range` / :class:`Choice` with a plain key (``"mu"``): the key of the method's own section,
  ``<method>.mu``; with a dotted key (``"calibration.margin"``): that configuration key itself (one value
  for the whole configuration, so two methods of one tuning cannot both tune it).

``authors`` holds the values the method's paper or its authors' code use; a declared range must contain
them and the section's default (``tests/unit/experiment/test_tune_space.py`` checks every method).
Nothing here imports a tuning library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedhv.errors import ConfigError

__all__ = ["LEARNING_RATES", "Choice", "Dimension", "Range", "Rate", "config_key"]


@dataclass(frozen=True)
class Rate:
    """A learning rate, log-uniform in ``[low * v, high * v]`` around the setting's rate ``v``.

    Attributes
    ----------
    which : str
        ``"global"`` (the server rate ``eta_g``) or ``"local"`` (the clients' ``eta_l``).
    low, high : float
        The factors on the setting's rate (default ``1/4 ... 4``).
    """

    which: str
    low: float = 0.25
    high: float = 4.0

    @property
    def key(self) -> str:
        """``lr.global`` or ``lr.local`` (a method's key is :func:`config_key`)."""
        return f"lr.{self.which}"

    def check(self, where: str) -> None:
        """Refuse an unknown rate or an empty, inverted or non-positive range (one line)."""
        if self.which not in ("global", "local"):
            raise ConfigError(f"{where}: Rate({self.which!r}) names no learning rate; use Rate('global') or "
                              "Rate('local')")
        _check_bounds(where, self.key, self.low, self.high, log=True)

    def bounds(self, rate: float) -> tuple[float, float]:
        """The absolute range around the setting's ``rate``."""
        return self.low * rate, self.high * rate


@dataclass(frozen=True)
class Range:
    """A number in ``[low, high]``: uniform, log-uniform (``log``) or an integer (``integer``).

    Attributes
    ----------
    key : str
        The section key (``"mu"``: ``<method>.mu``) or a dotted configuration key (``"calibration.margin"``).
    low, high : float
        The bounds, ``low < high`` (``low > 0`` when ``log``).
    log : bool
        Sample the logarithm uniformly.
    integer : bool
        Integers only.
    authors : tuple of float
        The paper's or the authors' values (inside the range).
    """

    key: str
    low: float
    high: float
    log: bool = False
    integer: bool = False
    authors: tuple[float, ...] = ()

    def check(self, where: str) -> None:
        """Refuse an empty, inverted or (with ``log``) non-positive range, and authors' values outside it."""
        _check_bounds(where, self.key, self.low, self.high, self.log)
        if self.integer and (self.low != int(self.low) or self.high != int(self.high)):
            raise ConfigError(f"{where}: search range {self.key} = [{self.low}, {self.high}] is integer; give "
                              "whole-number bounds")
        for value in self.authors:
            if not self.contains(value):
                raise ConfigError(f"{where}: search range {self.key} = [{self.low}, {self.high}] leaves out the "
                                  f"authors' value {value}; widen the range to include it")

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is a number inside the range."""
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and self.low <= value <= self.high and (not self.integer or value == int(value)))


@dataclass(frozen=True)
class Choice:
    """One of a few values (e.g. the authors' three weight decays).

    Attributes
    ----------
    key : str
        As for :class:`Range`.
    values : tuple
        The choices (numbers, strings or booleans), at least two, all different.
    """

    key: str
    values: tuple[Any, ...]

    @property
    def authors(self) -> tuple[Any, ...]:
        """Every choice is one someone used."""
        return self.values

    def check(self, where: str) -> None:
        """Refuse fewer than two choices or a repeated one."""
        if len(self.values) < 2:
            raise ConfigError(f"{where}: search choice {self.key} = {list(self.values)} has fewer than two values; "
                              "give at least two, or leave the key out of the search")
        if len(set(map(repr, self.values))) != len(self.values):
            raise ConfigError(f"{where}: search choice {self.key} = {list(self.values)} repeats a value; list each "
                              "once")

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is one of the choices."""
        return any(type(value) is type(v) and value == v for v in self.values)


#: A dimension of a search space.
Dimension = Rate | Range | Choice

#: The learning rates every method tunes (:meth:`fedhv.algorithms.method.Method.search_space`): each
#: log-uniform from 1/4 to 4 times the setting's rate.
LEARNING_RATES: tuple[Rate, ...] = (Rate("global"), Rate("local"))


def config_key(method: str, dim: Dimension) -> str:
    """The configuration key ``dim`` sets for ``method``: ``lr.<method>.global``, ``<method>.<key>`` or
    the dotted key itself."""
    if isinstance(dim, Rate):
        return f"lr.{method}.{dim.which}"
    return dim.key if "." in dim.key else f"{method}.{dim.key}"


def _check_bounds(where: str, key: str, low: float, high: float, log: bool) -> None:
    for bound in (low, high):
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound):
            raise ConfigError(f"{where}: search range {key} = [{low}, {high}] needs two finite numbers")
    if low == high:
        raise ConfigError(f"{where}: search range {key} = [{low}, {high}] is empty; give low < high, or leave the "
                          "key out of the search")
    if low > high:
        raise ConfigError(f"{where}: search range {key} = [{low}, {high}] is inverted; give low < high, e.g. "
                          f"[{high}, {low}]")
    if log and low <= 0:
        raise ConfigError(f"{where}: search range {key} = [{low}, {high}] is log-uniform and needs low > 0; give a "
                          "positive lower bound, or a uniform range")
