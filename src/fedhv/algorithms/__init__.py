"""Federated multi-objective algorithms as pure round logic with explicit state."""

from fedhv.algorithms.base import Algorithm, ClientReplies, RoundRequest, StepResult
from fedhv.algorithms.fedhv import FedHV, FedHVState
from fedhv.algorithms.uniform import Uniform

__all__ = ["Algorithm", "ClientReplies", "FedHV", "FedHVState", "RoundRequest", "StepResult", "Uniform"]
