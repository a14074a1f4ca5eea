"""Published values of the FedHV paper, kept as data (no torch).

Source: Dehghanpour, Azimi-Abarghouyi & Brinton, "FedHV: Low-Overhead Hypervolume
Weighting for Federated Multi-Objective Optimization" (Table 6). The other published
values the tables compare with live in ``fedhv/results/paper_tables.json``.
"""

from __future__ import annotations

#: Table 6: frozen training references r^train per benchmark family.
REFERENCES: dict[str, tuple[float, ...]] = {
    "multimnist": (2.458940, 2.453542),
    "mnist-fmnist": (2.454883, 2.464302),
    "cifar10-mnist": (2.452658, 2.466771),
    "celeba5": (1.297312, 1.023714, 1.060341, 1.108676, 1.085493),
}
