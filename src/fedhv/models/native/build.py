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

from fedhv import procfs, safe_io

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
    line = procfs.cpuinfo_line("flags", "Features")
    if line is not None:
        return line
    import platform
    return platform.processor() + platform.machine()


def _sources() -> dict[str, bytes]:
    pkg = resources.files("fedhv.models.native")
    return {name: pkg.joinpath(name).read_bytes() for name in SOURCES}


#: Accepted spellings of ``FEDHV_NATIVE`` (case-insensitive).
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
#: A temporary ``.tmp.so`` older than this (seconds) is a build that was killed: removed.
_STALE_S = 3600.0


def native_switch(value: str | None) -> bool:
    """``FEDHV_NATIVE``: unset or a true spelling = kernels on, a false spelling = off; others refused."""
    if value is None or value.strip() == "":
        return True
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    from fedhv.errors import ConfigError

    raise ConfigError(f"FEDHV_NATIVE = {value!r} is not a switch; use one of {', '.join(_TRUE)} (kernels on) or "
                      f"{', '.join(_FALSE)} (PyTorch's layers)")


def _private_dir(path: Path) -> str | None:
    """Why ``path`` may not be trusted as a kernel cache (``None``: owned by this user, writable by no one else)."""
    try:
        st = path.lstat()
    except OSError as exc:
        return str(exc)
    if path.is_symlink():
        return f"{path} is a symbolic link"
    if st.st_uid != os.getuid():
        return f"{path} belongs to uid {st.st_uid}, not to this user ({os.getuid()})"
    if st.st_mode & 0o022:
        return f"{path} is writable by its group or others (mode {oct(st.st_mode & 0o777)})"
    return None


def _digest_file(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def trusted(path: Path) -> str | None:
    """Why the cached library ``path`` must not be loaded (``None``: it may be).

    The folder and the library must belong to this user and be writable by no one else, and the
    library's SHA-256 must equal the one recorded at build time (``<name>.sha256``, same rules): a
    library someone else could replace is never loaded.
    """
    for item in (path.parent, path, _digest_file(path)):
        why = _private_dir(item)
        if why is not None:
            return why
    try:
        recorded = _digest_file(path).read_text().strip()
    except OSError as exc:
        return str(exc)
    if recorded != _sha256(path):
        return f"{path} does not match the SHA-256 recorded when it was built"
    return None


def _clean_stale(folder: Path) -> None:
    """Remove temporary libraries of builds that were killed (older than an hour)."""
    import time

    with contextlib.suppress(OSError):
        for stale in folder.glob("*.tmp.so"):
            with contextlib.suppress(OSError):
                if time.time() - stale.lstat().st_mtime > _STALE_S:
                    stale.unlink()


def _build(cxx: list[str], sources: dict[str, bytes], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _clean_stale(target.parent)
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
        os.chmod(tmp, 0o700)
        digest = _digest_file(target)
        safe_io.write_atomic(digest, _sha256(Path(tmp)) + "\n", mode=0o600, replace_link=True)  # owner only
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
            if not path.exists() and not path.is_symlink():
                try:
                    _build(cxx, sources, path)
                except OSError:  # a read-only cache: build for this process only
                    path = _private_build(cxx, sources, path.name)
            why = trusted(path)
            if why is not None and _private_dir(path.parent) is None and not path.is_symlink():
                _build(cxx, sources, path)  # our own folder (e.g. a library built before digests): rebuild it
                why = trusted(path)
            if why is not None:  # never load what someone else could have replaced: build a private copy
                warnings.warn(f"fedhv: the cached kernel library is not trusted ({why}); building a private copy "
                              "for this process", RuntimeWarning, stacklevel=3)
                path = _private_build(cxx, sources, path.name)
            lib = ctypes.CDLL(str(path))
            _declare(lib)
            _CACHE["path"] = path  # type: ignore[assignment]
        except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as err:
            warnings.warn(f"fedhv: the compiled kernels are unavailable ({err}); using PyTorch's layers (slower; "
                          "the same maths with another float summation order, so results agree within seed noise, "
                          "not bit for bit)", RuntimeWarning, stacklevel=3)
            lib = None
        _CACHE["lib"] = lib
        return lib


def _private_build(cxx: list[str], sources: dict[str, bytes], name: str) -> Path:
    """Build into a private temporary folder (mode 0o700), removed when the process exits."""
    import atexit

    folder = Path(tempfile.mkdtemp(prefix="fedhv-kernels-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / name
    _build(cxx, sources, path)
    return path


def library_identity() -> str | None:
    """``kernels-<key>.so`` of this machine's build (``None`` without a compiler): what a run records."""
    found = library_path()
    return None if found is None else found[0].name


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
