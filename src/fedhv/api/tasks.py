"""A user's tasks (:class:`Task`) and their objective: the public names of :mod:`fedhv.objectives`.

The one objective concept lives in :mod:`fedhv.objectives` (bottom layer, so data, metrics
and the engines use it without importing the public API); this module keeps the names
``fedhv.api.tasks.Task``, ``TaskObjective``, ``TaskMetric``, ``ACCURACY``, ``KINDS``,
``LossFn`` and ``as_tasks`` working.
"""

from __future__ import annotations

from fedhv.objectives import ACCURACY, KINDS, LossFn, Task, TaskMetric, TaskObjective, as_tasks

__all__ = ["ACCURACY", "KINDS", "LossFn", "Task", "TaskMetric", "TaskObjective", "as_tasks"]
