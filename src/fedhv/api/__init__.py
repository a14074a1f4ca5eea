"""The public Python API (re-exported by :mod:`fedhv`).

Tasks, federated datasets, methods, calibration and simulation for a user's own model and
data.
"""

from fedhv.api.dataset import FederatedDataset
from fedhv.api.simulate import History, calibrate, simulate
from fedhv.api.tasks import Task
from fedhv.methods import FSMGDA, FedCMOO, FedHV, Uniform

__all__ = ["FSMGDA", "FedCMOO", "FedHV", "FederatedDataset", "History", "Task", "Uniform", "calibrate", "simulate"]
