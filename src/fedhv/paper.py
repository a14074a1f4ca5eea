"""Published values of the FedHV paper, kept as data (no torch).

Source: Dehghanpour, Azimi-Abarghouyi & Brinton, "FedHV: Low-Overhead Hypervolume
Weighting for Federated Multi-Objective Optimization" (Tables 1 and 6).
"""

from __future__ import annotations

#: Table 6: frozen training references r^train per benchmark family.
REFERENCES: dict[str, tuple[float, ...]] = {
    "multimnist": (2.458940, 2.453542),
    "mnist-fmnist": (2.454883, 2.464302),
    "cifar10-mnist": (2.452658, 2.466771),
    "celeba5": (1.297312, 1.023714, 1.060341, 1.108676, 1.085493),
}

#: Table 1: final (MeanAcc, WorstAcc) as (mean, std) pairs per setting and method.
TABLE1: dict[str, dict[str, tuple[tuple[float, float], tuple[float, float]]]] = {
    "multimnist": {
        "uniform": ((90.17, 0.18), (88.14, 0.34)),
        "fsmgda": ((88.78, 1.38), (86.15, 2.53)),
        "fedcmoo": ((89.89, 0.16), (88.79, 0.57)),
        "fedhv": ((90.72, 0.65), (88.94, 0.61)),
    },
    "mnist-fmnist": {
        "uniform": ((86.41, 0.51), (76.98, 0.77)),
        "fsmgda": ((84.84, 0.87), (75.58, 1.05)),
        "fedcmoo": ((86.69, 0.18), (78.58, 0.66)),
        "fedhv": ((86.35, 0.45), (77.03, 0.70)),
    },
}
