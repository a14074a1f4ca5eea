"""Task-weighting rules: FedHV's inverse-slack map, MGDA min-norm, simplex projection."""

from fedhv.weighting.hypervolume import HVWeights, hv_weights
from fedhv.weighting.minnorm import MinNormResult, min_norm, min_norm_two
from fedhv.weighting.simplex import project_simplex

__all__ = ["HVWeights", "MinNormResult", "hv_weights", "min_norm", "min_norm_two", "project_simplex"]
