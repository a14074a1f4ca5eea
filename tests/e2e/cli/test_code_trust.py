"""Who decides what code runs: no module of the working directory in the processes fedhv starts,
and a resumed run names the code it imports and refuses code that changed since the run began.

- ``fedhv grid --workers 2`` started from a folder holding ``threading.py`` / ``argparse.py`` /
  ``json.py``: multiprocessing's spawn workers (``python -c …``) and its resource tracker put the
  working directory first on ``sys.path``; they now start with ``PYTHONSAFEPATH=1``
  (:mod:`fedhv.safe_path`) and import none of them (a planted module writes a marker file and then
  hands over to the real one, so the run itself completes either way).
- ``fedhv flower local``'s watchdog (``python -m fedhv.flower.lifetime``) and every process of a
  local deployment carry the same variable.
- ``fedhv run --resume`` of a run naming a ``module:attr`` benchmark prints the module and file it
  imports, and refuses when the module's source digest (recorded in ``environment.json`` at the
  start) changed, naming the override; ``fedhv show-config`` of a received config imports nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import SMALL, SUPPORT

BIN = Path(sys.executable).parent
#: A planted module: it marks that it ran (file ``MARKER-<module>-<pid>`` next to it), then
#: replaces itself by the real module, so the process goes on as if nothing happened.
PLANTED = '''import importlib, os, sys
_here = os.path.dirname(os.path.abspath(__file__))
open(os.path.join(_here, "MARKER-%s-%d" % (__name__, os.getpid())), "w").close()
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
del sys.modules[__name__]
sys.modules[__name__] = importlib.import_module(__name__)
'''


def plant(folder: Path, *modules: str) -> Path:
    """``folder`` holding a planted ``<module>.py`` for each of ``modules``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in modules:
        (folder / f"{name}.py").write_text(PLANTED)
    return folder


def markers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("MARKER-*"))


def test_the_planted_module_does_run_where_the_working_directory_is_on_sys_path(tmp_path: Path) -> None:
    """The probe itself: ``python -c`` without the safe path imports the planted module (so an absent
    marker below means the module was not imported, not that the probe is broken)."""
    here = plant(tmp_path / "cwd", "json")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    done = subprocess.run([sys.executable, "-c", "import json; print(json.dumps([1]))"], cwd=here, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "[1]", done.stderr
    assert [m.rsplit("-", 1)[0] for m in markers(here)] == ["MARKER-json"]
    done = subprocess.run([sys.executable, "-c", "import json"], cwd=here, env={**env, "PYTHONSAFEPATH": "1"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and len(markers(here)) == 1


def test_safe_child_path_sets_the_variable_for_the_block_only() -> None:
    from fedhv.safe_path import safe_child_path

    before = os.environ.get("PYTHONSAFEPATH")
    with safe_child_path():
        assert os.environ["PYTHONSAFEPATH"] == "1"
    assert os.environ.get("PYTHONSAFEPATH") == before


@pytest.mark.needs_data
def test_grid_spawn_workers_import_nothing_from_the_working_directory(tmp_path: Path) -> None:
    """``fedhv grid --workers 2`` (the console script, as a user runs it) from a folder holding
    ``threading.py``, ``argparse.py`` and ``json.py``: before, the resource tracker and both spawn
    workers ran the planted ``threading.py``; now no process does, and the runs finish."""
    here = plant(tmp_path / "cwd", "threading", "argparse", "json")
    sets = [a for o in [*SMALL, "calibration.rounds=1"] for a in ("--set", o)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONSAFEPATH", None)
    done = subprocess.run([str(BIN / "fedhv"), "grid", "multimnist", "--methods", "uniform", "--seeds", "0,1",
                           "--rounds", "1", "--out", str(tmp_path / "grid"), "--workers", "2", "--threads", "1",
                           "--quiet", *sets], cwd=here, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert all((tmp_path / "grid" / "multimnist" / "uniform" / f"s{s}" / "summary.json").is_file() for s in (0, 1))
    assert markers(here) == [], "imported from the working directory: " + ", ".join(markers(here))


def _sigterm_caught(pid: int) -> bool:
    """Whether process ``pid`` installed a SIGTERM handler (``SigCgt`` of ``/proc/PID/status``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt"))
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_flower_local_watchdog_imports_nothing_from_the_working_directory(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog of ``fedhv flower local`` (``python -m fedhv.flower.lifetime``, started in the
    launcher's working directory) ran a planted ``argparse.py`` before; with the deployment's
    environment it now reaches its loop (its SIGTERM handler installed) without importing it."""
    from fedhv.flower.lifetime import MARK
    from fedhv.flower.local import FLWR_ENV, Deployment

    here = plant(tmp_path / "cwd", "argparse", "json")
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    dep = Deployment(workdir, {**env, **FLWR_ENV, MARK: uuid.uuid4().hex}, 1, 0)
    monkeypatch.chdir(here)
    dep.start_watchdog()
    assert dep.watchdog is not None
    try:
        deadline = time.monotonic() + 60
        while not _sigterm_caught(dep.watchdog.pid) and dep.watchdog.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert markers(here) == [], "imported from the working directory: " + ", ".join(markers(here))
        assert dep.watchdog.poll() is None and _sigterm_caught(dep.watchdog.pid), (workdir / "watchdog.log").read_text()
    finally:
        dep.watchdog.terminate()
        dep.watchdog.wait(timeout=30)


# ----------------------------------------------------------------------------- item: received runs and their code

BENCH_CONFIG = """setting = "{name}"
method = "uniform"
rounds = 2
dtype = "float64"
[data]
benchmark = "{name}:make_benchmark"
[partition]
clients = 3
samples_per_client = 60
[train]
clients_per_round = 2
batch_size = 8
local_steps = 2
[eval]
test_period = 1
[lr.uniform]
global = 1.0
local = 0.05
"""
#: Marks every import of the module (file ``IMPORTED-<module>-<pid>`` next to it).
IMPORT_MARK = ('import os as _os\nopen(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), '
               '"IMPORTED-%s-%d" % (__name__, _os.getpid())), "w").close()\n')


def user_module(folder: Path, name: str) -> Path:
    """``folder/<name>.py``: tests/support/bn_benchmark.py's benchmark, marking each import of it."""
    folder.mkdir(parents=True, exist_ok=True)
    source = (SUPPORT / "bn_benchmark.py").read_text()
    path = folder / f"{name}.py"
    path.write_text(source.replace("from __future__ import annotations\n",
                                   "from __future__ import annotations\n\n" + IMPORT_MARK, 1))
    return path


def imported(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("IMPORTED-*"))


def _forget(name: str) -> None:
    sys.modules.pop(name, None)
    from fedhv.data import user

    for key in [k for k in user._LOADED if k[0].startswith(f"{name}:")]:
        del user._LOADED[key]


@pytest.fixture()
def user_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A finished-then-reopened run of a ``module:attr`` benchmark (summary.json and model.pt removed, so
    it resumes from its last checkpoint): ``(run dir, module file, module name)``."""
    from helpers import cli

    name = f"trust_bench_{uuid.uuid4().hex[:8]}"
    code = tmp_path / "code"
    module = user_module(code, name)
    monkeypatch.syspath_prepend(str(code))
    setting = tmp_path / f"{name}.toml"
    setting.write_text(BENCH_CONFIG.format(name=name))
    out = tmp_path / "run"
    done = cli("run", str(setting), "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    for gone in ("summary.json", "model.pt"):
        (out / gone).unlink()
    _forget(name)
    try:
        yield out, module, name
    finally:
        _forget(name)


def test_a_run_records_the_digest_of_the_code_its_benchmark_names(user_run: tuple[Path, Path, str]) -> None:
    import hashlib
    import json

    out, module, name = user_run
    code = json.loads((out / "environment.json").read_text())["code"]
    assert code["module"] == name and code["file"] == str(module) and code["scope"] == "module"
    assert code["sha256"] == hashlib.sha256(f"{module.name}\0{hashlib.sha256(module.read_bytes()).hexdigest()}\n"
                                            .encode()).hexdigest()


def test_resume_names_the_module_and_file_it_imports(user_run: tuple[Path, Path, str]) -> None:
    from helpers import cli

    out, module, name = user_run
    done = cli("run", "--resume", str(out), "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if "importing module" in line]
    assert len(lines) == 1 and repr(name) in lines[0] and str(module) in lines[0], done.stderr
    assert (out / "summary.json").is_file()


def test_the_code_check_is_made_once_per_run_and_process(user_run: tuple[Path, Path, str],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """An entry point checks before it starts its back-end (the Flower ServerApp, before its handshake)
    and the runner again: the same run, module and source are checked and named once per process; a
    changed source is checked (and refused) again."""
    from fedhv.experiment.checkpoint import ResumeError
    from fedhv.experiment.code_check import check_resume_code

    out, module, _ = user_run
    text = (out / "config.toml").read_text()
    with caplog.at_level("WARNING", logger="fedhv"):
        first = check_resume_code(out, text)
        again = check_resume_code(out, text)
    assert first == again and first is not None
    assert len([r for r in caplog.records if "importing module" in r.getMessage()]) == 1
    module.write_text(module.read_text() + "\n# changed\n")
    with pytest.raises(ResumeError, match="changed since the run began"):
        check_resume_code(out, text)


def test_resume_refuses_a_module_that_changed_since_the_run_began(user_run: tuple[Path, Path, str]) -> None:
    """The module's file changed after the run began: ``fedhv run --resume`` (a real process) stops
    with one line naming the module, its file and the override, before importing it; with
    ``--accept-changed-code`` it resumes, saying so."""
    from helpers import cli

    out, module, name = user_run
    module.write_text(module.read_text().replace("manual_seed(0)", "manual_seed(1)"))  # other data
    for stale in module.parent.glob("IMPORTED-*"):
        stale.unlink()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(module.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "fedhv.cli", "run", "--resume", str(out), "--quiet"], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"module {name!r} ({module})" in last and "changed since the run began" in last, last
    assert "--accept-changed-code" in last
    assert imported(module.parent) == [], "the changed module was imported before the refusal"
    assert not (out / "summary.json").exists()
    done = cli("run", "--resume", str(out), "--quiet", "--accept-changed-code")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resuming anyway (--accept-changed-code)" in done.stderr
    assert (out / "summary.json").is_file()


def test_inspection_commands_import_no_code_a_received_run_names(user_run: tuple[Path, Path, str],
                                                                  tmp_path: Path) -> None:
    """``fedhv show-config`` of the run's ``config.toml``, ``fedhv table`` and ``fedhv plot`` of its
    folder: the module is never imported (show-config names it instead)."""
    from helpers import cli

    out, module, name = user_run
    done = cli("run", "--resume", str(out), "--quiet")  # finished again, so table / plot read it
    assert done.returncode == 0, done.stderr[-2000:]
    _forget(name)
    for stale in module.parent.glob("IMPORTED-*"):
        stale.unlink()
    shown = cli("show-config", str(out / "config.toml"))
    assert shown.returncode == 0, shown.stderr
    assert f'benchmark = "{name}:make_benchmark"' in shown.stdout
    assert f"names code (module {name!r}); show-config does not import it" in shown.stderr
    table = cli("table", str(out.parent), "--table", "1", "--format", "csv")
    assert table.returncode == 0, table.stderr
    figures = cli("plot", str(out.parent), "--out", str(tmp_path / "figures"), "--formats", "png")
    assert figures.returncode == 0, figures.stderr
    assert imported(module.parent) == [] and name not in sys.modules
