"""Composition root: configuration -> data, model, algorithm, engine -> run directory."""

from fedhv.experiment.runner import resume_experiment, run_experiment

__all__ = ["resume_experiment", "run_experiment"]
