"""Evaluation metrics: per-task accuracy and loss, aggregate metrics, hypervolume."""

from fedhv.metrics.evaluate import evaluate_means, evaluate_record, evaluate_tasks, per_sample_losses
from fedhv.metrics.summary import aggregate_metrics, hypervolume, task_metrics

__all__ = ["aggregate_metrics", "evaluate_means", "evaluate_record", "evaluate_tasks", "hypervolume", "per_sample_losses",
           "task_metrics"]
