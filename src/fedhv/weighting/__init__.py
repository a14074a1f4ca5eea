"""Task-weighting rules: FedHV's inverse-slack map (also as torch modules), MGDA min-norm, simplex projection."""

from fedhv.weighting.hypervolume import HVWeights, hv_weights
from fedhv.weighting.minnorm import MinNormResult, min_norm, min_norm_two
from fedhv.weighting.module import HVBackward, HVWeighting, reference_from_losses
from fedhv.weighting.simplex import project_simplex

__all__ = [
    "HVBackward", "HVWeighting", "HVWeights", "MinNormResult", "hv_weights", "min_norm", "min_norm_two", "project_simplex",
    "reference_from_losses",
]
