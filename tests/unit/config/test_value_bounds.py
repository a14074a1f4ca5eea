"""Every value that sizes memory is bounded and validated before work starts (docs/security.md,
"Bounds"): one ``error:`` line naming the key, the value and the fix, never an allocation until the
kernel's OOM killer stops the process. The runs that would allocate on code without the bounds run
in a child with an address-space limit (``RLIMIT_AS``) and a timeout."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedhv.config import load_config
from fedhv.config.validation import validate
from fedhv.errors import ConfigError

from conftest import SMALL

LIMIT_BYTES = 3 << 30


def _fedhv(*args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """``fedhv ARGS`` in a child limited to LIMIT_BYTES of address space."""
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({LIMIT_BYTES}, {LIMIT_BYTES}))
        from fedhv.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    try:
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"fedhv {' '.join(args)} ran past {timeout} s instead of refusing the value")


def _one_error_line(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize(("override", "words"), [
    ("diagnostics.probe_samples=1000000000", ("diagnostics.probe_samples = 1000000000", "bound", "lower it")),
    ("train.batch_size=10000000", ("train.batch_size = 10000000", "bound", "lower it")),
    ("eval.batch_size=1000000000", ("eval.batch_size = 1000000000", "bound")),
    ("partition.clients=1000000000", ("partition.clients = 1000000000", "bound")),
    ("train.local_steps=100000000", ("train.local_steps x train.batch_size", "lower one of them")),
])
def test_values_that_size_memory_are_bounded_before_any_data(override: str, words: tuple[str, ...]) -> None:
    proc = _fedhv("show-config", "multimnist", "--set", override, "--set", "partition.sizes=\"lognormal\"")
    _one_error_line(proc, *words)


@pytest.mark.needs_data
def test_a_batch_above_the_largest_client_is_refused_before_training(tmp_path: Path) -> None:
    """Unequal (lognormal) sizes: only the partition knows the largest client; a batch above it sized
    the batch plan (``[steps, batch]`` per client) whatever the clients hold."""
    sets = [a for o in SMALL for a in ("--set", o) if not o.startswith("train.batch_size")]
    out = tmp_path / "run"
    proc = _fedhv("run", "multimnist", "--method", "uniform", "--rounds", "1", "--out", str(out), "--quiet", *sets,
                  "--set", "partition.sizes=\"lognormal\"", "--set", "train.batch_size=500000")
    line = _one_error_line(proc, "train.batch_size = 500000", "largest client", "lower train.batch_size")
    assert "lognormal" in line
    assert not out.exists()  # refused before the run directory was kept


@pytest.mark.parametrize(("section", "key", "value"), [
    ("fedhv", "reference", (math.nan, 1.0)),
    ("fedhv", "reference", (math.inf, 1.0)),
    ("fedhv", "rho_clip", math.inf),
    ("calibration", "margin", math.inf),
    ("partition", "alpha", math.nan),
])
def test_a_config_built_in_python_refuses_non_finite_numbers(section: str, key: str, value: object) -> None:
    """The TOML loader refuses NaN / inf; a configuration built in Python (``dataclasses.replace``,
    ``fedhv.methods`` objects, ``fedhv.simulate``) reaches :func:`validate` directly."""
    cfg = load_config("multimnist")
    changed = dataclasses.replace(getattr(cfg, section), **{key: value})
    bad = cfg.with_section(section, changed) if section in cfg.sections else \
        dataclasses.replace(cfg, **{section: changed})
    with pytest.raises(ConfigError) as info:
        validate(bad)
    message = str(info.value)
    assert message.startswith(f"{section}.{key}") and "finite" in message and "\n" not in message, message


def test_fedhv_method_object_with_an_infinite_rho_clip_is_refused() -> None:
    from fedhv.methods import FedHV

    cfg = FedHV(rho_clip=math.inf, reference=(1.0, 1.0)).configure(load_config("multimnist"))
    with pytest.raises(ConfigError, match=r"fedhv\.rho_clip = inf must be a finite number"):
        validate(cfg)


@pytest.mark.parametrize(("flag", "value", "bound"), [
    ("--cpus-per-run", "inf", "a finite number > 0"),
    ("--cpus-per-run", "nan", "a finite number > 0"),
    ("--cpus-per-run", "0", "a finite number > 0"),
    ("--gpus-per-run", "nan", "a finite number >= 0"),
    ("--gpus-per-run", "inf", "a finite number >= 0"),
    ("--gpus-per-run", "-1", "a finite number >= 0"),
])
def test_grid_resources_per_run_must_be_finite(tmp_path: Path, flag: str, value: str, bound: str) -> None:
    """Refused before the grid is planned or Ray is started (the unknown setting would fail later)."""
    proc = subprocess.run([sys.executable, "-m", "fedhv.cli", "grid", str(tmp_path / "no-such-setting.toml"),
                           "--backend", "ray", flag, value, "--out", str(tmp_path / "grid")],
                          capture_output=True, text=True, timeout=120, check=False)
    _one_error_line(proc, flag, bound)
    assert not (tmp_path / "grid").exists()


@pytest.mark.parametrize(("overrides", "words"), [
    (("method='dwa'", "dwa.report_batches=10000000000000000000"),
     ("dwa.report_batches = 10000000000000000000", "bound", "\"all\"")),  # was 15.7 GB in 80 s
    (("fedhv.report_batches=100000000",), ("fedhv.report_batches = 100000000", "bound")),  # was std::bad_alloc
    (("method='famo'", "famo.report_batches=1000000", "train.batch_size=64"),
     ("famo.report_batches x train.batch_size = 1000000 x 64", "report plan", "famo.report_batches = \"all\"")),
    (("partition.clients=40000", "partition.samples_per_client=40000"),  # each bound held alone: a 12.8 GB plan
     ("partition.clients x partition.samples_per_client = 40000 x 40000", "partition.samples_per_client = 1677")),
    (("method='fedcmoo-upgrad'", "fedcmoo-upgrad.power_iterations=10000000000000000000"),  # no round in 150 s
     ("fedcmoo-upgrad.power_iterations = 10000000000000000000", "bound", "e.g. 2")),
])
def test_report_budgets_and_products_are_bounded_before_any_data(overrides: tuple[str, ...],
                                                                 words: tuple[str, ...]) -> None:
    proc = _fedhv("show-config", "multimnist", *[a for o in overrides for a in ("--set", o)])
    _one_error_line(proc, *words)


def test_a_toml_report_budget_is_bounded(tmp_path: Path) -> None:
    """A TOML ``[dwa] report_batches = 10**19`` passed ``show-config``."""
    setting = tmp_path / "huge.toml"
    setting.write_text('extends = "multimnist"\nmethod = "dwa"\n\n[dwa]\nreport_batches = 10000000000000000000\n')
    _one_error_line(_fedhv("show-config", str(setting)), "dwa.report_batches = 10000000000000000000", "bound")


@pytest.mark.parametrize(("args", "words"), [
    (("--front", "100000000"), ("--front 100000000", "100,000,001 directions", "bound of 10,000", "--front 9999")),
    (("--front", "4", "--margins", "1e308"), ("--margins 1e+308", "bound", "--margins 0.15,0.3")),
])
def test_front_sweeps_are_bounded_before_any_data(tmp_path: Path, args: tuple[str, ...],
                                                  words: tuple[str, ...]) -> None:
    """``--front 100000000`` built every lattice row in Python (MemoryError after 18 s); ``--margins 1e308``
    overflowed FedHV's reference (NaN weights). Both are refused while planning, before the data is read."""
    out = tmp_path / "grid"
    proc = _fedhv("grid", "multimnist", *args, "--out", str(out), "--workers", "1", timeout=60)
    _one_error_line(proc, *words)
    assert not out.exists()


@pytest.mark.parametrize(("override", "words"), [
    ("dwa.temperature=1e-320", ("dwa.temperature = 1e-320", "bound", "e.g. 2.0")),
    ("stch.mu=1e-320", ("stch.mu = 1e-320", "bound", "e.g. 1.0")),
    ("rlw.std=1e308", ("rlw.std = 1e+308", "bound", "e.g. 1.0")),
    ("famo.lr=1e308", ("famo.lr = 1e+308", "bound", "e.g. 0.025")),
    ("fsmgda-cagrad.c=1e308", ("fsmgda-cagrad.c = 1e+308", "bound", "e.g. 0.4")),
    ("fsmgda-upgrad.reg_eps=1e308", ("fsmgda-upgrad.reg_eps = 1e+308", "bound", "e.g. 1e-4")),
    ("fedmgda-plus.reg_eps=1e308", ("fedmgda-plus.reg_eps = 1e+308", "bound", "e.g. 1e-9")),
    ("fedcmoo-pref.preference=[1e308, 1e308]", ("fedcmoo-pref.preference = [1e+308, 1e+308]", "range")),
    ("fedhv.rho_clip=1e-320", ("fedhv.rho_clip = 1e-320", "bound", "e.g. 1e-6")),
    ("calibration.margin=1e308", ("calibration.margin = 1e+308", "bound", "e.g. 0.15")),
])
def test_settings_that_gave_nan_weights_are_refused_naming_a_value_that_works(override: str,
                                                                              words: tuple[str, ...]) -> None:
    """Accepted finite settings gave NaN or all-zero weights (exit 0, or a stop blaming the learning rate) or
    crashed a Gramian solver mid-run; each is now refused before any data, naming a value that works."""
    method = override.split(".")[0]
    sets = [f"method='{method}'"] if method != "calibration" else []
    with pytest.raises(ConfigError) as info:
        load_config("multimnist", [*sets, override])
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message
