"""A method written in one file of an installed package, used through every entry point of fedhv.

The package is ``examples/own_method/lossprop.py`` (loss-proportional task weights) installed the
way pip leaves a package: the module plus a ``.dist-info`` folder whose ``entry_points.txt``
declares ``[fedhv.methods] lossprop = lossprop:LossProp``. Nothing in fedhv names it. Every step
runs in its own process (the registry of this test process stays as it is):

- ``fedhv.simulate(..., method=LossProp(...))``: the weights the run logs follow the method's formula
  (computed here from the logged reports, in numpy);
- ``fedhv run`` with a TOML file holding ``method = "lossprop"`` and a ``[lossprop]`` section, plus a
  ``--set lossprop.power=2`` override: recorded in ``config.toml``; a bad value and a misspelt key
  are one-line errors naming the key; the run killed with SIGKILL after round 2 and resumed equals
  the uninterrupted run bit for bit (the method's state went through the checkpoint);
- ``fedhv grid`` (worker processes) runs it beside Uniform and ``fedhv table`` shows its row;
- ``flwr run`` of the repository's Flower App in the Simulation Engine with ``method = "lossprop"``
  equals ``fedhv run`` on the sequential engine (clients, reports, weights, final model).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedhv.experiment.kill_point import PAUSE_ENV, PAUSE_FILE
from flower_support import assert_gone, needs_flwr, rounds_of, theta_of

from conftest import REPO, SMALL

PLUGIN = REPO / "examples" / "own_method" / "lossprop.py"
TIMING = ("wall_clock", "time_", "seconds")


def _install(site: Path) -> Path:
    """The plug-in as an installed distribution: the module and its ``.dist-info`` with the entry point."""
    site.mkdir(parents=True, exist_ok=True)
    shutil.copy(PLUGIN, site / "lossprop.py")
    info = site / "lossprop-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lossprop\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedhv.methods]\nlossprop = lossprop:LossProp\n")
    return site


def _env(site: Path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(site), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}


def _fedhv(site: Path, *args: str, timeout: int = 600, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedhv.cli", *args], env=_env(site, **extra), capture_output=True,
                          text=True, timeout=timeout, check=False)


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not any(t in k for t in TIMING)}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _lossprop_weights(reports: list[list[float]], decay: float, power: float) -> list[list[float]]:
    """The oracle: ``E^t = decay E^{t-1} + (1 - decay) F^t`` (``E^0 = F^0``), ``w^{t+1} ∝ E^t ** power``."""
    out, average = [], None
    for f in np.asarray(reports, dtype=np.float64):
        average = f if average is None else decay * average + (1 - decay) * f
        s = np.maximum(average, 0.0) ** power
        out.append((s / s.sum()).tolist())
    return out


def _setting(tmp_path: Path) -> Path:
    """A user's TOML file: the method, its section, its learning rates (the preset shrunk by ``--set``)."""
    toml = tmp_path / "plug.toml"
    toml.write_text(textwrap.dedent("""\
        extends = "multimnist"
        setting = "plug"
        method = "lossprop"
        rounds = 4
        dtype = "float64"

        [lossprop]
        decay = 0.5

        [lr.lossprop]
        global = 1.0
        local = 0.3

        [checkpoint]
        period = 1
        """))
    return toml


#: ``--set`` arguments shrinking the preset (:data:`conftest.SMALL`).
SHRINK = [x for item in SMALL for x in ("--set", item)]


@pytest.mark.needs_data
def test_a_method_in_one_installed_file_runs_through_every_entry_point(tmp_path: Path) -> None:
    site = _install(tmp_path / "site")
    setting = _setting(tmp_path)
    assert "[lossprop]" in setting.read_text()

    # --- fedhv.simulate in Python: the method object passes in; its weights follow its formula.
    script = textwrap.dedent("""
        import json, torch, fedhv
        from lossprop import LossProp, LossPropConfig
        g = torch.Generator().manual_seed(0)
        x = torch.randn(240, 6, generator=g)
        a, b = (x[:, 0] > 0).long(), x[:, 1:3].sum(1, keepdim=True)
        data = fedhv.FederatedDataset.from_tensors(
            x, [a, b], tasks=[fedhv.Task("a", "classification", size=2), fedhv.Task("b", "regression", size=1)],
            partition="dirichlet", clients=6, samples_per_client=40, alpha=0.5)

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU())
                self.heads = torch.nn.ModuleList([torch.nn.Linear(8, 2), torch.nn.Linear(8, 1)])

            def forward(self, inputs):
                h = self.encoder(inputs)
                return [head(h) for head in self.heads]

        torch.manual_seed(0)
        model = Net()
        hist = fedhv.simulate(model, data, LossProp(lr_global=1.0, config=LossPropConfig(decay=0.5, power=2.0)),
                              rounds=4, clients_per_round=3, batch_size=8, local_steps=2, seed=0, progress=False)
        print(json.dumps({"reports": [r["report"] for r in hist.rounds],
                          "next": [r["next_weights"] for r in hist.rounds],
                          "weights": [r["weights"] for r in hist.rounds]}))
    """)
    res = subprocess.run([sys.executable, "-c", script], env=_env(site), capture_output=True, text=True,
                         timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    logged = json.loads(res.stdout.strip().splitlines()[-1])
    want = _lossprop_weights(logged["reports"], 0.5, 2.0)
    np.testing.assert_allclose(logged["next"], want, rtol=1e-12)
    assert logged["weights"][0] == [0.5, 0.5] and logged["weights"][1:] == logged["next"][:-1]

    # --- fedhv run with a TOML file and an override: its section is recorded.
    full = tmp_path / "full"
    res = _fedhv(site, "run", str(setting), *SHRINK, "--set", "lossprop.power=2", "--out", str(full), "--quiet")
    assert res.returncode == 0, res.stderr[-3000:]
    config = (full / "config.toml").read_text()
    assert "[lossprop]\ndecay = 0.5\npower = 2.0" in config and 'method = "lossprop"' in config
    rounds = rounds_of(full)
    np.testing.assert_allclose([r["next_weights"] for r in rounds],
                               _lossprop_weights([r["report"] for r in rounds], 0.5, 2.0), rtol=1e-12)

    # --- bad input names the key, the value and the fix, before any round.
    bad = _fedhv(site, "run", str(setting), *SHRINK, "--set", "lossprop.decay=1.5", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith(
        "lossprop.decay = 1.5 must be in [0, 1), e.g. 0.8"), bad.stderr
    typo = _fedhv(site, "run", str(setting), *SHRINK, "--set", "lossprop.decya=0.5", "--out", str(tmp_path / "typo"))
    assert typo.returncode == 2 and "unknown config key 'lossprop.decya'; did you mean 'lossprop.decay'?" \
        in typo.stderr, typo.stderr
    assert not (tmp_path / "bad").exists() and not (tmp_path / "typo").exists()

    # --- killed after round 2 (SIGKILL), resumed: the same run bit for bit (state through the checkpoint).
    part = tmp_path / "part"
    proc = subprocess.Popen([sys.executable, "-m", "fedhv.cli", "run", str(setting), *SHRINK, "--set", "lossprop.power=2",
                             "--out", str(part), "--quiet"], env=_env(site, **{PAUSE_ENV: "2"}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (part / PAUSE_FILE).exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before pausing"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert len(rounds_of(part)) == 2 and not (part / "summary.json").exists()
    resumed = _fedhv(site, "run", "--resume", str(part), "--quiet")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for name in ("rounds.jsonl", "metrics.jsonl"):
        a = [_strip(json.loads(line)) for line in (full / name).read_text().splitlines()]
        b = [_strip(json.loads(line)) for line in (part / name).read_text().splitlines()]
        assert a == b, name
    assert _strip(json.loads((full / "summary.json").read_text())) == \
        _strip(json.loads((part / "summary.json").read_text()))
    assert torch.equal(theta_of(full), theta_of(part))

    # --- a grid (worker processes) beside Uniform, then the table.
    grid = tmp_path / "grid"
    res = _fedhv(site, "grid", str(setting), "--methods", "uniform,lossprop", "--seeds", "0", "--rounds", "2",
                 *SHRINK, "--set", "lossprop.power=2", "--set", "lr.uniform={global=1.0, local=0.3}", "--workers", "2", "--out", str(grid), "--quiet")
    assert res.returncode == 0, res.stderr[-3000:]
    run = grid / "plug" / "lossprop" / "s0"
    assert (run / "summary.json").is_file() and (grid / "plug" / "uniform" / "s0" / "summary.json").is_file()
    assert [_strip(r) for r in rounds_of(run)] == [_strip(r) for r in rounds[:2]]  # the grid's process = fedhv run
    table = _fedhv(site, "table", str(grid), "--table", "1")
    assert table.returncode == 0 and "lossprop" in table.stdout and "uniform" in table.stdout.lower(), \
        table.stdout + table.stderr
    costs = _fedhv(site, "table", str(grid), "--table", "12")  # its own Table 12 entry, from its class
    assert costs.returncode == 0 and "moving average of the reports" in costs.stdout, costs.stdout + costs.stderr


@pytest.mark.needs_data
@needs_flwr
def test_a_method_in_one_installed_file_runs_in_the_flower_app(tmp_path: Path) -> None:
    from fedhv.flower.lifetime import marked, sweep
    from fedhv.flower.procs import free_ports

    site = _install(tmp_path / "site")
    keys = dict(item.split("=", 1) for item in [*SMALL, "train.clients_per_round=3",
                                                "dtype='float64'", "data.max_test_samples=300", "train.lr_global=1.0",
                                                "train.lr_local=0.3", "lossprop.decay=0.5"])
    keys.pop("partition.clients")  # the app's own key: clients=3
    sets = [f"{k}={v}" for k, v in keys.items()]  # each key once (the app's set is one TOML text)
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = ":local:"\n')
    token = uuid.uuid4().hex
    env = _env(site, FLWR_HOME=str(home), FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_ports(1)[0]),
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_UPDATE_CHECK="1", FEDHV_DEPLOYMENT=token,
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    out = tmp_path / "flower"
    run_config = f'method="lossprop" rounds=2 seed=3 clients=3 set="{"; ".join(sets)}" out="{out}"'
    seen: list[int] = []
    try:
        res = subprocess.run([str(Path(sys.executable).parent / "flwr"), "run", str(REPO / "flower-app"), "sim",
                              "--federation-config", "num-supernodes=3 client-resources-num-cpus=1",
                              "--run-config", run_config, "--stream"],
                             capture_output=True, text=True, env=env, timeout=600, check=False)
        seen = marked(token)
    finally:
        sweep(token, grace_s=3.0)
    log = res.stdout + res.stderr
    assert res.returncode == 0 and "fedhv: finished: MeanAcc" in log, log[-3000:]
    assert seen and not marked(token)
    assert_gone(set(seen))
    sim = tmp_path / "sim"
    args = [x for item in [*sets, "partition.clients=3", "rounds=2", "seed=3", "method='lossprop'",
                           "engine='sequential'"]
            for x in ("--set", item)]
    done = _fedhv(site, "run", "multimnist", *args, "--out", str(sim), "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    got, want = rounds_of(out), rounds_of(sim)
    assert [r["clients"] for r in got] == [r["clients"] for r in want] and len(got) == 2
    assert [r["report"] for r in got] == [r["report"] for r in want]
    assert [r["next_weights"] for r in got] == [r["next_weights"] for r in want]
    assert torch.equal(theta_of(out), theta_of(sim))
