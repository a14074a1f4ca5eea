"""fedhv: task-wise federated multi-objective optimization.

The package implements FedHV (closed-form inverse-slack hypervolume weights from
objective reports; Dehghanpour et al., "FedHV: Low-Overhead Hypervolume Weighting
for Federated Multi-Objective Optimization") together with its baselines, the
paper's benchmarks, a batched single-machine simulator and the run-directory
tooling around it.
"""

__version__ = "0.1.0"

# Public API (docs/api.md). Loaded lazily (PEP 562): `fedhv table` / `fedhv plot` import
# `fedhv.results`, which must not import torch.
_API = {
    "Task": "fedhv.api", "FederatedDataset": "fedhv.api", "History": "fedhv.api", "calibrate": "fedhv.api",
    "simulate": "fedhv.api", "FedHV": "fedhv.api", "Uniform": "fedhv.api", "FSMGDA": "fedhv.api",
    "FedCMOO": "fedhv.api", "FSMGDAConfig": "fedhv.algorithms", "FedCMOOConfig": "fedhv.algorithms",
    "FedHVConfig": "fedhv.algorithms", "Method": "fedhv.algorithms", "BuildContext": "fedhv.algorithms",
    "Built": "fedhv.algorithms", "Linear": "fedhv.algorithms", "InverseLoss": "fedhv.algorithms",
    "RLW": "fedhv.algorithms", "DWA": "fedhv.algorithms", "FAMO": "fedhv.algorithms", "STCH": "fedhv.algorithms",
    "HVWeighting": "fedhv.weighting", "HVBackward": "fedhv.weighting",
    "reference_from_losses": "fedhv.weighting",
    "UserBenchmark": "fedhv.data.user", "register_benchmark": "fedhv.registry", "register_model": "fedhv.registry",
    "register_method": "fedhv.algorithms.method",
    "FedHVError": "fedhv.errors", "ConfigError": "fedhv.errors", "DataError": "fedhv.errors",
    "DatasetTooLarge": "fedhv.api.materialize", "RunDirError": "fedhv.results.rundir",
}

__all__ = [
    "DWA",
    "FAMO",
    "FSMGDA",
    "RLW",
    "STCH",
    "BuildContext",
    "Built",
    "ConfigError",
    "DataError",
    "DatasetTooLarge",
    "FSMGDAConfig",
    "FedCMOO",
    "FedCMOOConfig",
    "FedHV",
    "FedHVConfig",
    "FedHVError",
    "FederatedDataset",
    "HVBackward",
    "HVWeighting",
    "History",
    "InverseLoss",
    "Linear",
    "Method",
    "RunDirError",
    "Task",
    "Uniform",
    "UserBenchmark",
    "__version__",
    "calibrate",
    "reference_from_losses",
    "register_benchmark",
    "register_method",
    "register_model",
    "simulate",
]


def __getattr__(name: str) -> object:
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'fedhv' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
