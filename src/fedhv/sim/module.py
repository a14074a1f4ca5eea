"""A user's ``nn.Module`` as a multi-task model: moved to :mod:`fedhv.models.module` (names kept here)."""

from __future__ import annotations

from fedhv.models.module import ModuleAdapter, vmap_problem

__all__ = ["ModuleAdapter", "vmap_problem"]
