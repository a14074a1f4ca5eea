"""The code a configuration names, found and digested without importing it.

``data.benchmark = "mypkg.tasks:make_benchmark"`` names a module that fedhv imports and calls.
A run directory received from someone else (or resumed after an edit) must say which code it
will run before it runs it, and must not silently mix two versions of that code in one run:

- :func:`code_record` locates the module the way ``import`` would (``sys.modules``, then each
  finder of ``sys.meta_path`` with the parent package's search path) but executes nothing
  (a dotted name's parent packages are located, not imported), and digests its source: every
  ``*.py`` file of the top-level package (sorted by relative path; at most :data:`MAX_FILES`
  files of at most :data:`MAX_FILE_BYTES` bytes each, else the module's own file), or the
  module's file when it is a plain module. A run records it in ``environment.json["code"]``
  at its start.
- :func:`reference_module` tells a ``module:attr`` reference from a registered name without
  importing anything (``fedhv show-config``).

Bottom layer: imports nothing from fedhv but :mod:`fedhv.errors`.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

from fedhv.errors import ConfigError

__all__ = ["MAX_FILES", "MAX_FILE_BYTES", "code_record", "locate", "reference_module"]

#: Most source files of one package that are digested (a larger package: its named module only).
MAX_FILES = 5000
#: Largest source file read for the digest (a larger one is digested by its size and name only).
MAX_FILE_BYTES = 64 << 20
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def reference_module(value: str, where: str = "data.benchmark") -> str | None:
    """The module a ``module:attr`` reference names (``None`` for a registered name); checks its
    form only and imports nothing.

    Raises
    ------
    ConfigError
        ``value`` has a ``:`` but no module or attribute, or the module is not a dotted name.
    """
    if ":" not in value:
        return None
    module, _, attr = value.partition(":")
    if not module or not attr or not _DOTTED.match(module) or not all(_DOTTED.match(a) for a in attr.split(".")):
        raise ConfigError(f"{where} = {value!r} is not 'module:attribute'; write it like "
                          "\"mypkg.tasks:make_benchmark\"")
    return module


def _spec(name: str, path: Any) -> ModuleSpec | None:
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None) if module is not None else None
    if isinstance(spec, ModuleSpec):
        return spec
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, path)
        except Exception:  # noqa: BLE001, S112 - a finder that fails here cannot find it; try the next
            continue
        if spec is not None:
            return spec
    return None


def locate(module: str) -> tuple[ModuleSpec, ModuleSpec] | None:
    """``(top-level spec, module spec)`` of ``module`` without executing it; ``None`` when not found."""
    parts = module.split(".")
    top = spec = None
    path = None
    for i in range(len(parts)):
        spec = _spec(".".join(parts[: i + 1]), path)
        if spec is None:
            return None
        top = top or spec
        path = spec.submodule_search_locations
        if i < len(parts) - 1 and path is None:
            return None
    assert top is not None and spec is not None
    return top, spec


def _regular(path: Path) -> os.stat_result | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _file_digest(path: Path, st: os.stat_result) -> str:
    if st.st_size > MAX_FILE_BYTES:
        return f"size:{st.st_size}"
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sources(roots: list[Path]) -> list[tuple[str, Path]] | None:
    """``(relative name, path)`` of every regular ``*.py`` file under ``roots``; ``None`` past :data:`MAX_FILES`."""
    found: list[tuple[str, Path]] = []
    for k, root in enumerate(roots):
        for folder, dirs, files in os.walk(root):  # links to folders are not followed
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = Path(folder) / name
                    found.append((f"{k}/{path.relative_to(root).as_posix()}", path))
                    if len(found) > MAX_FILES:
                        return None
    return sorted(found)


def code_record(benchmark: str) -> dict[str, Any] | None:
    """What ``environment.json["code"]`` records about the module ``benchmark`` names (``None`` for a
    registered name): ``module``, ``file`` (its source file), ``scope`` (``"package"``: every source
    file of its top-level package; ``"module"``: its own file), ``files`` and ``sha256`` (``None`` when
    it cannot be located without importing it). Nothing is imported."""
    module = reference_module(benchmark)
    if module is None:
        return None
    out: dict[str, Any] = {"benchmark": benchmark, "module": module, "file": None, "scope": None, "files": 0,
                           "sha256": None}
    found = locate(module)
    if found is None:
        return out
    top, spec = found
    origin = Path(spec.origin) if spec.origin and spec.has_location else None
    out["file"] = None if origin is None else str(origin)
    roots = [Path(p) for p in (top.submodule_search_locations or [])]
    sources = _sources(roots) if roots else None
    scope = "package"
    if sources is None:
        scope = "module"
        sources = [] if origin is None else [(origin.name, origin)]
    h = hashlib.sha256()
    n = 0
    for name, path in sources:
        st = _regular(path)
        if st is None:
            continue
        h.update(f"{name}\0{_file_digest(path, st)}\n".encode())
        n += 1
    if n == 0:
        return out
    out.update(scope=scope, files=n, sha256=h.hexdigest())
    return out
