"""Federated multi-objective algorithms as pure round logic with explicit state."""

from fedhv.algorithms.base import Algorithm, Federation, Replies, Request, StepResult
from fedhv.algorithms.fedhv import FedHV, FedHVState
from fedhv.algorithms.uniform import Uniform

__all__ = ["Algorithm", "FedHV", "FedHVState", "Federation", "Replies", "Request", "StepResult", "Uniform"]
