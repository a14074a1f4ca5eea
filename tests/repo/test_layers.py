"""Every module on its own floor (docs/design.md "Layers"): the import-linter contracts hold, the
layer report finds no upward import the contracts do not name, and names kept where modules moved."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

#: (old module, name) -> (new module, name): the names that moved in issue 39 still import from
#: their old places, as the same objects.
MOVED = {
    ("fedhv.api.tasks", "Task"): ("fedhv.objectives", "Task"),
    ("fedhv.api.tasks", "TaskObjective"): ("fedhv.objectives", "TaskObjective"),
    ("fedhv.api.tasks", "ACCURACY"): ("fedhv.objectives", "ACCURACY"),
    ("fedhv.api.dataset", "FederatedDataset"): ("fedhv.data.dataset", "FederatedDataset"),
    ("fedhv.api.dataset", "RaggedParts"): ("fedhv.data.parts", "RaggedParts"),
    ("fedhv.api.materialize", "DatasetTooLarge"): ("fedhv.data.materialize", "DatasetTooLarge"),
    ("fedhv.api.arguments", "as_seed"): ("fedhv.checks", "as_seed"),
    ("fedhv.sim.module", "ModuleAdapter"): ("fedhv.models.module", "ModuleAdapter"),
    ("fedhv.sim.keyed", "KeyedDropout"): ("fedhv.models.keyed", "KeyedDropout"),
    ("fedhv.experiment.setup", "load_data"): ("fedhv.data.configured", "load_data"),
    ("fedhv.experiment.setup", "federated_data"): ("fedhv.data.configured", "federated_data"),
    ("fedhv.experiment.setup", "DTYPES"): ("fedhv.data.configured", "DTYPES"),
    ("fedhv.stats", "participation_factor"): ("fedhv.data.heterogeneity", "participation_factor"),
    ("fedhv.results.plots", "method_color"): ("fedhv.results.plot_style", "method_color"),
    ("fedhv.results.plots", "PlotDependencyError"): ("fedhv.results.plot_style", "PlotDependencyError"),
    ("fedhv.cli", "UsageError"): ("fedhv.cli_args", "UsageError"),
    ("fedhv.flower.lifetime", "alive"): ("fedhv.procfs", "alive"),
    ("fedhv.flower.lifetime", "start_ticks"): ("fedhv.procfs", "start_ticks"),
    ("fedhv.flower.procs", "session_children"): ("fedhv.procfs", "session_children"),
    ("fedhv.flower.client", "node_partition"): ("fedhv.flower.node_config", "node_partition"),
    ("fedhv.flower.strategy", "FedHVStrategy"): ("fedhv.flower.strategy_compose", "FedHVStrategy"),
    ("fedhv.flower.strategy", "fedhv_strategy"): ("fedhv.flower.strategy_compose", "fedhv_strategy"),
}


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()), ids=lambda v: ".".join(v))
def test_moved_names_import_from_their_old_modules(old: tuple[str, str], new: tuple[str, str]) -> None:
    assert getattr(importlib.import_module(old[0]), old[1]) is getattr(importlib.import_module(new[0]), new[1])


def test_import_linter_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"  # installed with the test extra (fedhv[lint])
    done = subprocess.run([str(lint) if lint.exists() else "lint-imports", "--no-cache"], check=False, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_layer_report_lists_no_upward_import_or_cycle_outside_the_contracts_ignores() -> None:
    import grimp  # noqa: F401 - import-linter's graph library, installed with the test extra
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "layers.py")], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=True)
    lines = done.stdout.splitlines()
    upward = [ln for ln in lines if ln.startswith(("upward:", "sibling:"))]
    assert all(ln.endswith("[ignored by the contract]") for ln in upward), upward
    assert "## modules in no layer: 0" in lines
    assert not any("WARNING" in ln for ln in lines), lines
