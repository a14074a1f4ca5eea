"""Build-at-first-use of fedhv's C++ kernels (no torch headers: plain C ABI, loaded with ctypes).

The shared library is compiled once per (source, flags, compiler version, CPU feature flags)
into the cache directory and reused by every later process; concurrent first uses (test
workers, Flower clients) each compile to a private temporary name and move the result
into place atomically, so no process ever loads a half-written file.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import warnings
from importlib import resources
from pathlib import Path

#: The library's sources: headers first, then the compiled translation units.
SOURCES = ("common.h", "conv1.cpp", "pool.cpp")
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-std=c++17", "-shared", "-fPIC", "-pthread", "-fopenmp")

_LOCK = threading.Lock()
_CACHE: dict[str, ctypes.CDLL | None] = {}


def cache_dir() -> Path:
    """``$FEDHV_CACHE/kernels`` (fedhv's cache, as for derived data), else
    ``$XDG_CACHE_HOME/fedhv/kernels``, else ``~/.cache/fedhv/kernels``."""
    if os.environ.get("FEDHV_CACHE"):
        return Path(os.environ["FEDHV_CACHE"]) / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedhv" / "kernels"


def compiler() -> list[str] | None:
    """The C++ compiler command (``$CXX`` or ``c++``/``g++``/``clang++`` on ``PATH``), or ``None``."""
    if os.environ.get("CXX"):
        return shlex.split(os.environ["CXX"])
    for name in ("c++", "g++", "clang++"):
        if shutil.which(name):
            return [name]
    return None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform
    return platform.processor() + platform.machine()


def _sources() -> dict[str, bytes]:
    pkg = resources.files("fedhv.models.native")
    return {name: pkg.joinpath(name).read_bytes() for name in SOURCES}


def _build(cxx: list[str], sources: dict[str, bytes], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp.so", dir=target.parent)
    os.close(fd)
    try:
        with tempfile.TemporaryDirectory() as src:
            for name, text in sources.items():
                Path(src, name).write_bytes(text)
            units = [str(Path(src, name)) for name in sources if name.endswith(".cpp")]
            done = subprocess.run([*cxx, *FLAGS, *units, "-o", tmp], capture_output=True, text=True, timeout=300,
                                  check=False)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "compiler failed")
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def library_path() -> tuple[Path, list[str], dict[str, bytes]] | None:
    """Where the compiled library for this machine lives, with the compiler and the sources
    that build it (``None`` without a working compiler)."""
    cxx = compiler()
    if cxx is None:
        return None
    sources = _sources()
    try:
        version = subprocess.run([*cxx, "--version"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    key = hashlib.sha256(b"\0".join([*sources.values(), " ".join(FLAGS).encode(), version.encode(),
                                     _cpu_flags().encode()])).hexdigest()[:20]
    return cache_dir() / f"kernels-{key}.so", cxx, sources


def load_library() -> ctypes.CDLL | None:
    """The loaded kernel library, building it on first use; ``None`` (and one warning) if it cannot be."""
    if "lib" in _CACHE:
        return _CACHE["lib"]
    with _LOCK:
        if "lib" in _CACHE:
            return _CACHE["lib"]
        lib = None
        try:
            found = library_path()
            if found is None:
                raise RuntimeError("no C++ compiler found (set CXX or install g++)")
            path, cxx, sources = found
            if not path.exists():
                try:
                    _build(cxx, sources, path)
                except OSError:  # a read-only cache: build for this process only
                    path = Path(tempfile.mkdtemp(prefix="fedhv-kernels-")) / path.name
                    _build(cxx, sources, path)
            lib = ctypes.CDLL(str(path))
            _declare(lib)
        except (OSError, RuntimeError, subprocess.SubprocessError) as err:
            warnings.warn(f"fedhv: the compiled kernels are unavailable ({err}); "
                          "using PyTorch's layers (slower, same results)", RuntimeWarning, stacklevel=3)
            lib = None
        _CACHE["lib"] = lib
        return lib


def _declare(lib: ctypes.CDLL) -> None:
    """Argument types of the C entry points (pointers, int64 sizes, int thread count)."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for dtype in ("f32", "f64"):
        fwd = getattr(lib, f"fedhv_conv1_forward_{dtype}")
        fwd.argtypes = [ptr, i64, i64, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, ctypes.c_int]
        fwd.restype = None
        bwd = getattr(lib, f"fedhv_conv1_backward_{dtype}")
        bwd.argtypes = [ptr, i64, i64, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, ctypes.c_int]
        bwd.restype = None
        for name in ("forward", "backward"):
            pool = getattr(lib, f"fedhv_pool_{name}_{dtype}")
            pool.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, ctypes.c_int]
            pool.restype = None
