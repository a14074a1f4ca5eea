"""The docstring check of .ci/run covers the whole public API (issue 39, item 6).

``ruff check --select D src`` checks numpy-style docstrings in the files that
``[tool.ruff.lint.per-file-ignores]`` in pyproject.toml does not exempt: the one negated
pattern (``"!src/fedhv/{...}"``) lists the public API. A module that comes to define a name
``fedhv`` exports must be on that list, or its docstrings would go unchecked.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from fnmatch import fnmatch
from pathlib import Path

from conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _public_patterns() -> list[str]:
    ignores = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]["per-file-ignores"]
    negated = [k[1:] for k, rules in ignores.items() if k.startswith("!") and "D" in rules]
    assert len(negated) == 1, negated
    m = re.fullmatch(r"(.*)\{(.*)\}", negated[0])
    assert m is not None, negated[0]
    return [m.group(1) + alt for alt in m.group(2).split(",")]


def _defining_files() -> dict[str, str]:
    fedhv = importlib.import_module("fedhv")
    files = {"fedhv": "src/fedhv/__init__.py"}
    for name in fedhv.__all__:
        if name == "__version__":
            continue
        module = inspect.getmodule(getattr(fedhv, name))
        assert module is not None and module.__file__ is not None, name
        files[name] = Path(module.__file__).resolve().relative_to(REPO).as_posix()
    for path in (REPO / "src" / "fedhv" / "api").glob("*.py"):
        files[f"fedhv.api.{path.stem}"] = path.relative_to(REPO).as_posix()
    return files


def test_every_module_defining_a_public_name_has_its_docstrings_checked() -> None:
    patterns = _public_patterns()
    unchecked = {name: file for name, file in _defining_files().items()
                 if not any(fnmatch(file, pattern) for pattern in patterns)}
    assert not unchecked, f"add these files to the public pattern in pyproject.toml: {unchecked}"


def test_a_module_off_the_list_would_be_found() -> None:
    patterns = _public_patterns()
    assert any(fnmatch("src/fedhv/api/simulate.py", p) for p in patterns)
    assert not any(fnmatch("src/fedhv/experiment/runner.py", p) for p in patterns)
