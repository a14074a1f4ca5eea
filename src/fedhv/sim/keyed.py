"""Keyed randomness inside a user's ``forward``: moved to :mod:`fedhv.models.keyed` (names kept here)."""

from __future__ import annotations

from fedhv.models.keyed import (
    KeyedDropout,
    KeyedFunctional,
    MaskBox,
    RandomOps,
    RandomProbe,
    functional_site,
    probe_random,
    unkeyed_call,
)

__all__ = ["KeyedDropout", "KeyedFunctional", "MaskBox", "RandomOps", "RandomProbe", "functional_site", "probe_random",
           "unkeyed_call"]
