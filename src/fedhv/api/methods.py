"""The methods as configuration objects.

Re-exported from :mod:`fedhv.methods`, the layer both the Python API and the configuration
path build runs from.
"""

from fedhv.methods import FSMGDA, FedCMOO, FedHV, Method, Uniform, calibrated_range, slack_scale_values

__all__ = ["FSMGDA", "FedCMOO", "FedHV", "Method", "Uniform", "calibrated_range", "slack_scale_values"]
