"""Composition root: configuration -> data, model, algorithm, engine -> run directory."""

from fedhv.experiment.runner import run_experiment

__all__ = ["run_experiment"]
