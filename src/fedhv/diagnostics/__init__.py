"""Diagnostics of a run: the paper's theory quantities and per-client fairness (``docs/diagnostics.md``)."""

from fedhv.diagnostics.clients import client_fairness, client_means, fairness_summary, jain_index, population_objective
from fedhv.diagnostics.theory import draw_probe, loghv_quantities, slack_bound, task_gradients
from fedhv.diagnostics.tracker import Diagnostics

__all__ = [
    "Diagnostics", "client_fairness", "client_means", "draw_probe", "fairness_summary", "jain_index",
    "loghv_quantities", "population_objective", "slack_bound", "task_gradients",
]
