"""Materialising map-style datasets: the public names of :mod:`fedhv.data.materialize`."""

from __future__ import annotations

from fedhv.data.materialize import DatasetTooLarge, available_bytes, materialize, pil_to_tensor

__all__ = ["DatasetTooLarge", "available_bytes", "materialize", "pil_to_tensor"]
