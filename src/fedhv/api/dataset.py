"""A user's data as a federated dataset: the public names of :mod:`fedhv.data.dataset`.

:class:`FederatedDataset` lives in the data layer (user benchmarks and the composition root
build it without importing the public API); this module keeps ``fedhv.api.dataset``'s names.
"""

from __future__ import annotations

from fedhv.data.dataset import FederatedDataset, TensorLike
from fedhv.data.parts import RaggedParts

__all__ = ["FederatedDataset", "RaggedParts", "TensorLike"]
