"""Task-weighting rules."""

from fedhv.weighting.hypervolume import HVWeights, hv_weights

__all__ = ["HVWeights", "hv_weights"]
