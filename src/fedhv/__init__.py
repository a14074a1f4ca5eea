"""fedhv: task-wise federated multi-objective optimization.

The package implements FedHV (closed-form inverse-slack hypervolume weights from
objective reports; Dehghanpour et al., "FedHV: Low-Overhead Hypervolume Weighting
for Federated Multi-Objective Optimization") together with its baselines, the
paper's benchmarks, a batched single-machine simulator and the run-directory
tooling around it.
"""

__version__ = "0.1.0"
