"""Federated multi-objective methods, one module each.

A method's module holds its hyper-parameters (its configuration section), its round logic with
explicit state, and its registration (:mod:`fedhv.algorithms.method`). Importing this package
registers the built-in methods.
"""

from fedhv.algorithms import aggregators, fedcmoo_pref, fedmgda_plus  # noqa: F401  (register the Gramian methods)
from fedhv.algorithms.base import (
    Algorithm,
    Federation,
    Replies,
    Request,
    StepDraw,
    StepResult,
    fedavg_step,
    mean_update,
)
from fedhv.algorithms.dwa import DWA, DWAConfig
from fedhv.algorithms.famo import FAMO, FAMOConfig
from fedhv.algorithms.fedcmoo import FedCMOO, FedCMOOAlgorithm, FedCMOOConfig, FedCMOOState
from fedhv.algorithms.fedhv import FedHV, FedHVAlgorithm, FedHVConfig, FedHVState
from fedhv.algorithms.fsmgda import FSMGDA, FSMGDAAlgorithm, FSMGDAConfig, FSMGDAState
from fedhv.algorithms.inverse_loss import InverseLoss, InverseLossConfig
from fedhv.algorithms.linear import Linear, LinearConfig
from fedhv.algorithms.loss_only import LossOnlyAlgorithm, LossOnlyMethod, LossOnlyState, ScaledLossOnlyState
from fedhv.algorithms.method import BuildContext, Built, Method, register
from fedhv.algorithms.rlw import RLW, RLWConfig
from fedhv.algorithms.stch import STCH, STCHConfig
from fedhv.algorithms.uniform import Uniform, UniformAlgorithm, UniformConfig, UniformState

__all__ = [
    "DWA",
    "FAMO",
    "FSMGDA",
    "RLW",
    "STCH",
    "Algorithm",
    "BuildContext",
    "Built",
    "DWAConfig",
    "FAMOConfig",
    "FSMGDAAlgorithm",
    "FSMGDAConfig",
    "FSMGDAState",
    "FedCMOO",
    "FedCMOOAlgorithm",
    "FedCMOOConfig",
    "FedCMOOState",
    "FedHV",
    "FedHVAlgorithm",
    "FedHVConfig",
    "FedHVState",
    "Federation",
    "InverseLoss",
    "InverseLossConfig",
    "Linear",
    "LinearConfig",
    "LossOnlyAlgorithm",
    "LossOnlyMethod",
    "LossOnlyState",
    "Method",
    "RLWConfig",
    "Replies",
    "Request",
    "STCHConfig",
    "ScaledLossOnlyState",
    "StepDraw",
    "StepResult",
    "Uniform",
    "UniformAlgorithm",
    "UniformConfig",
    "UniformState",
    "fedavg_step",
    "mean_update",
    "register",
]
