"""Issue 28, items 2 and 3: the cached kernel library is checked before it is loaded, a library
without the kernels falls back with one warning, killed builds leave nothing, ``FEDHV_NATIVE``
takes the usual boolean spellings, and the switch is recorded (a resume with another one warns).

On the code before this stop: a replaced library's constructor ran silently, a library without
the symbols crashed with ``AttributeError``, ``FEDHV_NATIVE=false`` left the kernels on, and
``environment.json`` did not record the switch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedhv.errors import ConfigError
from fedhv.models.native.build import compiler

needs_cxx = pytest.mark.skipif(compiler() is None, reason="no C++ compiler on this machine")
LOAD = "from fedhv.models import native; import sys; print(native.available())"


def _python(code: str, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, FEDHV_CACHE=str(cache), PYTHONWARNINGS="always", **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=300,
                          check=False)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache with this machine's kernel library (built once for the module)."""
    cache = tmp_path_factory.mktemp("cache")
    if compiler() is not None:
        assert _python(LOAD, cache).returncode == 0
    return cache


def _copy(built: Path, tmp_path: Path) -> tuple[Path, Path]:
    cache = tmp_path / "cache"
    shutil.copytree(built, cache)  # copies the modes too
    (lib,) = (cache / "kernels").glob("kernels-*.so")
    return cache, lib


def test_fedhv_native_takes_boolean_spellings_and_refuses_others() -> None:
    from fedhv.models.native.build import native_switch

    for on in (None, "", "1", "true", "TRUE", "yes", "on"):
        assert native_switch(on) is True
    for off in ("0", "false", "False", "no", "off"):
        assert native_switch(off) is False
    with pytest.raises(ConfigError, match="FEDHV_NATIVE = 'maybe' is not a switch"):
        native_switch("maybe")


@needs_cxx
def test_the_build_records_a_digest_only_the_owner_can_write(built: Path) -> None:
    (lib,) = (built / "kernels").glob("kernels-*.so")
    digest = lib.with_name(lib.name + ".sha256")
    import hashlib

    assert digest.read_text().strip() == hashlib.sha256(lib.read_bytes()).hexdigest()
    for path in (built / "kernels", lib, digest):
        assert path.stat().st_mode & 0o022 == 0, path


@pytest.mark.deploy
@needs_cxx
def test_a_replaced_library_is_never_loaded(built: Path, tmp_path: Path) -> None:
    """A library holding a constructor, put in place of the cached one: its constructor must not run."""
    cache, lib = _copy(built, tmp_path)
    marker = tmp_path / "constructor-ran"
    src = tmp_path / "evil.c"
    src.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void evil(void) {{ '
                   f'FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    subprocess.run([*compiler(), "-x", "c", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)  # type: ignore[misc]
    done = _python(LOAD, cache)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr
    assert not marker.exists()  # the digest did not match: rebuilt, never loaded
    # a folder others can write: not trusted, a private copy is built (with one warning)
    os.chmod(cache / "kernels", 0o777)
    done = _python(LOAD, cache)
    assert done.stdout.strip() == "True" and "not trusted" in done.stderr and "writable by its group or others" in \
        done.stderr
    assert not marker.exists()


@needs_cxx
def test_a_library_without_the_kernels_falls_back_with_one_warning(built: Path, tmp_path: Path) -> None:
    import hashlib

    cache, lib = _copy(built, tmp_path)
    src = tmp_path / "empty.c"
    src.write_text("int fedhv_nothing(void) { return 0; }\n")
    subprocess.run([*compiler(), "-x", "c", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)  # type: ignore[misc]
    lib.with_name(lib.name + ".sha256").write_text(hashlib.sha256(lib.read_bytes()).hexdigest() + "\n")
    done = _python(LOAD, cache)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("compiled kernels are unavailable") == 1


@pytest.mark.deploy
@needs_cxx
def test_killed_builds_and_private_builds_leave_nothing(built: Path, tmp_path: Path) -> None:
    cache, lib = _copy(built, tmp_path)
    stale = cache / "kernels" / "kernels-x.1234.tmp.so"
    stale.write_bytes(b"half")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    lib.unlink()  # force a build in the cache folder
    assert _python(LOAD, cache).stdout.strip() == "True"
    assert not stale.exists()
    # a read-only cache: the private build's folder is removed when the process ends
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (cache / "kernels" / lib.name).unlink()
    os.chmod(cache / "kernels", 0o500)
    try:
        done = _python(LOAD, cache, TMPDIR=str(tmp))
    finally:
        os.chmod(cache / "kernels", 0o700)
    assert done.stdout.strip() == "True", done.stderr
    assert not list(tmp.glob("fedhv-kernels-*"))


@pytest.mark.deploy
@pytest.mark.needs_data
def test_the_switch_is_recorded_and_a_resume_with_another_warns(tmp_path: Path) -> None:
    from conftest import SMALL

    out = tmp_path / "run"
    sets = [a for o in [*SMALL, "rounds=2", "calibration.rounds=1"] for a in ("--set", o)]
    run = [sys.executable, "-m", "fedhv.cli", "run", "multimnist", "--method", "uniform", "--out", str(out), *sets]
    done = subprocess.run(run, capture_output=True, text=True, timeout=300, check=False,
                          env=dict(os.environ, FEDHV_NATIVE="on"))
    assert done.returncode == 0, done.stderr[-2000:]
    native = json.loads((out / "environment.json").read_text())["kernels"]["native"]
    assert native["enabled"] is True and (native["library"] or "").startswith("kernels-") or compiler() is None
    for name in ("summary.json", "model.pt"):  # an unfinished run to resume
        (out / name).unlink()
    done = subprocess.run([sys.executable, "-m", "fedhv.cli", "run", "--resume", str(out)], capture_output=True,
                          text=True, timeout=300, check=False, env=dict(os.environ, FEDHV_NATIVE="off"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "float kernels" in done.stderr and "'enabled': False" in done.stderr
    resumed = [json.loads(line) for line in (out / "resumes.jsonl").read_text().splitlines()]
    assert resumed[-1]["kernels"]["native"] == {"enabled": False, "library": None}
