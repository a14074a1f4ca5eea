"""Registries (benchmarks, models, methods) and user benchmarks from a TOML file or Python."""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fedhv
from fedhv.config import load_config
from fedhv.errors import ConfigError
from fedhv.experiment.setup import federated_data, new_model

from conftest import REPO, SMALL

EXAMPLE = REPO / "examples" / "user_benchmark"
FEDHV = str(Path(sys.executable).with_name("fedhv"))


def _cli(*args: str, cwd: Path, extra_path: Path | None = None,
         extra_site: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    paths = [str(p) for p in (extra_path, extra_site) if p is not None]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, env.get("PYTHONPATH", "")]))
    return subprocess.run([FEDHV, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def _resnet18_gn_params(tasks: int, attributes: int) -> int:
    """ResNet-18 (CIFAR stem, no bias in convolutions, GroupNorm affine = 2 per channel) + linear heads."""
    total = 3 * 64 * 9 + 2 * 64  # stem conv 3x3 3->64, GroupNorm(64)
    cin = 64
    for cout in (64, 128, 256, 512):
        for block in range(2):
            c_in = cin if block == 0 else cout
            total += c_in * cout * 9 + 2 * cout + cout * cout * 9 + 2 * cout
            if c_in != cout:
                total += c_in * cout + 2 * cout  # 1x1 projection shortcut + GroupNorm
        cin = cout
    return total + tasks * (512 * attributes + attributes)


#: Paper B.3: the architecture of each benchmark, counted layer by layer (weights + biases).
ARCHITECTURES = {
    # LeNet: conv 1->10 3x3, conv 10->15 3x3, linear 540->50; per task 50->50->10
    "multimnist": ("LeNetMTL", (10 * 9 + 10) + (15 * 90 + 15) + (540 * 50 + 50) + 2 * ((50 * 50 + 50) + (50 * 10 + 10))),
    "mnist-fmnist": ("LeNetMTL", 28515 + 2 * 3060),
    # CNN: conv 3->64 3x3, conv 64->64 3x3, linear 4096->384->192; per task 192->100->10
    "cifar10-mnist": ("CifarCNN", (64 * 27 + 64) + (64 * 576 + 64) + (4096 * 384 + 384) + (384 * 192 + 192)
                      + 2 * ((192 * 100 + 100) + (100 * 10 + 10))),
    # ResNet-18 with GroupNorm(2); five heads of 8 attributes
    "celeba5": ("ResNet18GN", _resnet18_gn_params(5, 8)),
}


@pytest.mark.parametrize("benchmark", sorted(ARCHITECTURES))
def test_builtin_benchmarks_get_the_papers_architecture(benchmark: str) -> None:
    from fedhv.registry import BENCHMARKS, MODELS

    spec = BENCHMARKS.get(benchmark)
    model = MODELS.get(spec.model)(spec.num_classes)
    cls, params = ARCHITECTURES[benchmark]
    assert type(model).__name__ == cls
    assert sum(p.numel() for p in model.parameters()) == params


def test_registry_register_get_names_and_errors() -> None:
    from fedhv.registry import BENCHMARKS, METHODS, Registry

    reg: Registry[int] = Registry("method", "method", "fedhv.algorithms", "register one with my_register(name)")
    assert reg.names() == ()  # that package registers into METHODS, not into this registry
    reg.register("one", 1)

    @reg.register("two")
    def two() -> int:
        return 2

    assert reg.get("one") == 1 and reg.get("two") is two and reg.names() == ("one", "two") and "two" in reg
    with pytest.raises(ConfigError, match=r"^method = 'on' is not supported \(did you mean 'one'\?\); choose one of "
                                          r"one, two, or register one with my_register\(name\)$"):
        reg.get("on")
    with pytest.raises(ConfigError, match="already registered; choose another name or pass replace=True"):
        reg.register("one", 3)
    reg.register("one", 3, replace=True)
    assert reg.get("one") == 3
    with pytest.raises(ConfigError, match="without ':'"):
        reg.register("a:b", 4)
    # The built-ins register through the same API.
    gramian = {f"{x}-{r}" for x in ("fsmgda", "fedcmoo")
               for r in ("upgrad", "dualproj", "cagrad", "pcgrad", "imtl-g", "aligned-mtl")}
    assert set(METHODS.names()) == {"fedhv", "uniform", "fsmgda", "fedcmoo", "dwa", "rlw", "linear", "inverse-loss",
                                    "famo", "stch", "fedmgda-plus", "fedcmoo-pref", *gramian}
    assert BENCHMARKS.names()[:4] == ("multimnist", "mnist-fmnist", "cifar10-mnist", "celeba5")
    with pytest.raises(ConfigError, match=r"data.benchmark = 'multimnit' is not supported \(did you mean "
                                          r"'multimnist'\?\).*or name a factory as 'module:attribute'"):
        load_config("multimnist", ["data.benchmark=multimnit"])


def _write_pkg(root: Path, name: str, body: str) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")
    (root / name / "tasks.py").write_text(textwrap.dedent(body))


def test_user_benchmark_errors_name_the_key_the_value_and_the_fix(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _write_pkg(tmp_path, "regpkg_bad", """
        import fedhv
        NOT_CALLABLE = 3
        def wrong_type():
            return {"tasks": ["a"]}
        """)
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = {
        "regpkg_missing.tasks:make": r"data.benchmark = 'regpkg_missing.tasks:make': module 'regpkg_missing.tasks' "
                                     r"cannot be imported \(ModuleNotFoundError: .*\); put its folder on PYTHONPATH",
        "regpkg_bad.tasks:make": r"data.benchmark = 'regpkg_bad.tasks:make': module 'regpkg_bad.tasks' has no "
                                 r"attribute 'make'; name the function that returns a fedhv.UserBenchmark",
        "regpkg_bad.tasks:NOT_CALLABLE": r"'NOT_CALLABLE' is a int, not callable; name a function",
        "regpkg_bad.tasks:": r"is not 'module:attribute'",
    }
    for value, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_config("multimnist", [f'data.benchmark="{value}"'])
    cfg = load_config("multimnist", ['data.benchmark="regpkg_bad.tasks:wrong_type"'])
    with pytest.raises(ConfigError, match=r"data.benchmark = 'regpkg_bad.tasks:wrong_type' returned a dict; "
                                          r"return fedhv.UserBenchmark\("):
        federated_data(cfg)
    # The CLI: exit 2 with one `error:` line, no traceback, no run directory left behind.
    proc = _cli("run", "multimnist", "--set", 'data.benchmark="regpkg_bad.tasks:wrong_type"', "--out",
                str(tmp_path / "run"), cwd=tmp_path, extra_path=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "error: data.benchmark = 'regpkg_bad.tasks:wrong_type' returned a dict" in proc.stderr
    assert not (tmp_path / "run" / "config.toml").exists()


def test_benchmark_registered_in_python_runs_with_its_own_data_and_model() -> None:
    x = torch.randn(300, 4, generator=torch.Generator().manual_seed(0))
    y = [(x[:, 0] > 0).long(), (x[:, 1] > 0).long()]
    calls = []

    @fedhv.register_benchmark("reg-test-python")
    def make() -> fedhv.UserBenchmark:
        calls.append(1)
        return fedhv.UserBenchmark(tasks=["a", "b"], train=(x, y), test=(x[:50], [t[:50] for t in y]),
                                   model=lambda: _TwoHeads(), strata=(x[:, 2] > 0).long())

    cfg = load_config("multimnist", [*SMALL, "data.benchmark=reg-test-python", "partition.strata=first-label"])
    data = federated_data(cfg)
    assert data.task_names == ("a", "b") and data.num_classes == (2, 2)
    assert data.parts.shape == (6, 64) and torch.equal(data.train_x.double(), x.double())
    # the user's strata drive the Dirichlet partition (not the labels): the same partition as the rule applied by hand
    from fedhv.data.partition import dirichlet_partition

    expected = dirichlet_partition((x[:, 2] > 0).long().numpy(), 6, 64, cfg.partition.alpha, cfg.partition.seed)
    assert torch.equal(data.parts.cpu(), torch.from_numpy(expected))
    m1, m2 = new_model(cfg, data, 0), new_model(cfg, data, 0)
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))  # seeded re-initialisation
    assert sum(p.numel() for p in m1.parameters()) == (4 * 8 + 8) + 2 * (8 * 2 + 2)
    assert len(calls) == 1  # built once per process
    with pytest.raises(ConfigError, match="'reg-test-python' is already registered"):
        fedhv.register_benchmark("reg-test-python", lambda: 0)


class _TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
        self.heads = torch.nn.ModuleList([torch.nn.Linear(8, 2), torch.nn.Linear(8, 2)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(x)
        return [head(h) for head in self.heads]


@pytest.mark.deploy
def test_example_user_benchmark_grid_then_table_shows_the_runs_numbers(tmp_path: Path) -> None:
    out = tmp_path / "grid"
    proc = _cli("grid", str(EXAMPLE / "config.toml"), "--methods", "uniform,fedhv", "--seeds", "0,1", "--rounds", "4",
                "--workers", "1", "--out", str(out), cwd=tmp_path, extra_path=EXAMPLE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    env = json.loads((out / "toy" / "fedhv" / "s0" / "environment.json").read_text())
    assert env["data"]["benchmark"] == "mypkg.tasks:make_benchmark" and env["data"]["user"]["version"] == "1"
    assert len(env["data"]["user"]["sha256"]) == 64
    table = _cli("table", str(out), "--table", "1", "--format", "csv", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    rows = {(r["method"], r["metric"]): r for r in csv.DictReader(io.StringIO(table.stdout)) if r["setting"] == "toy"}
    for method in ("uniform", "fedhv"):
        summaries = [json.loads((out / "toy" / method / f"s{s}" / "summary.json").read_text()) for s in (0, 1)]
        assert all(s["rounds"] == 4 for s in summaries)
        for key in ("mean_acc", "worst_acc"):
            values = [s[key] for s in summaries]
            row = rows[(method, key)]
            assert float(row["mean"]) == pytest.approx(statistics.mean(values), abs=1e-12)
            assert float(row["std"]) == pytest.approx(statistics.stdev(values), abs=1e-12)
            assert row["n_seeds"] == "2"
    assert summaries[0]["mean_acc"] > 50.0  # two binary-or-better tasks, chance is 37.5 % on average
    # model.pt holds the user's module's own keys (issue 27: before, a "module." prefix), loadable as documented
    import sys

    import torch

    sys.path.insert(0, str(EXAMPLE))
    try:
        from mypkg.tasks import MLP  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(EXAMPLE))
    stored = torch.load(out / "toy" / "fedhv" / "s0" / "model.pt", weights_only=True)
    assert stored["round"] == 4
    MLP().load_state_dict(stored["state_dict"])  # strict: the same keys


def _installed(site: Path, name: str) -> None:
    """An installed distribution in ``site`` (a ``.dist-info`` folder, as pip writes it) whose entry
    point registers the example's factory as benchmark ``name``."""
    info = site / "toy_fedhv_tasks-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-fedhv-tasks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[fedhv.benchmarks]\n{name} = mypkg.tasks:make_benchmark\n")


@pytest.mark.deploy
def test_installed_package_registers_a_benchmark_by_entry_point(tmp_path: Path) -> None:
    """A package that declares ``[project.entry-points."fedhv.benchmarks"] toy-ep = "mypkg.tasks:make_benchmark"``
    is usable by name in every process: a grid whose spawned workers never imported it in Python."""
    site = tmp_path / "site"
    _installed(site, "toy-ep")
    setting = tmp_path / "toy-ep.toml"
    setting.write_text((EXAMPLE / "config.toml").read_text().replace('"mypkg.tasks:make_benchmark"', '"toy-ep"'))
    shown = _cli("show-config", str(setting), cwd=tmp_path, extra_path=EXAMPLE, extra_site=site)
    assert shown.returncode == 0, shown.stderr[-2000:]
    out = tmp_path / "grid"
    proc = _cli("grid", str(setting), "--methods", "uniform", "--seeds", "0", "--rounds", "2", "--workers", "1",
                "--out", str(out), cwd=tmp_path, extra_path=EXAMPLE, extra_site=site)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(next(out.rglob("summary.json")).read_text())
    assert summary["rounds"] == 2
    # without the installed package the name is unknown, with a one-line error listing the built-ins
    missing = _cli("show-config", str(setting), cwd=tmp_path, extra_path=EXAMPLE)
    assert missing.returncode == 2 and "data.benchmark = 'toy-ep' is not supported" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_a_built_in_only_path_names_a_module_attribute_benchmark_as_a_user_benchmark(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``fedhv partition-stats`` and Flower read image files: a ``module:attribute`` value is refused as a
    user benchmark (it was once refused as an unknown name whose fix was to name it as module:attribute)."""
    from fedhv.data.benchmarks import load_benchmark

    monkeypatch.syspath_prepend(str(EXAMPLE))
    with pytest.raises(ConfigError, match=r"'mypkg.tasks:make_benchmark' is a user benchmark .*use fedhv run / grid"):
        load_benchmark("mypkg.tasks:make_benchmark")
