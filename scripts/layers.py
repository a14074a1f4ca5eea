"""List fedhv's upward imports and import cycles (docs/design.md "Layers").

The layers are read from the ``layers`` contract in ``[tool.importlinter]`` of
``pyproject.toml`` (the contract ``lint-imports`` checks), so this script and CI agree on
what "down" means. It reports, from the import graph grimp builds (every ``import``
statement, including those inside functions and under ``TYPE_CHECKING``):

- every direct import from a module to one in a higher layer, or between two
  independent siblings of one layer (``a | b``), marked when the contract ignores it;
- every module that no layer holds;
- every import cycle: the strongly connected components of the module graph with more
  than one module, each with its imports.

Usage (from the repository root; another checkout's code with ``PYTHONPATH``)::

    .venv/bin/python scripts/layers.py [--config pyproject.toml]
    PYTHONPATH=/path/to/other/src .venv/bin/python scripts/layers.py --config pyproject.toml

Exit status 0 always (``lint-imports`` is the check); the report goes to stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grimp

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def layer_table(config: Path) -> tuple[str, list[list[str]], list[bool], set[tuple[str, str]]]:
    """The container, the layers (top first; each a list of module names), whether each
    layer's members are independent, and the contract's ignored imports."""
    tool = tomllib.loads(config.read_text())["tool"]["importlinter"]
    contract = next(c for c in tool["contracts"] if c["type"] == "layers")
    (container,) = contract["containers"]
    layers, independent = [], []
    for raw in contract["layers"]:
        sep = ":" if ":" in raw else "|"
        layers.append([f"{container}.{part.strip()}" for part in raw.split(sep)])
        independent.append(sep == "|")
    ignored = set()
    for line in contract.get("ignore_imports", []):
        a, b = (s.strip() for s in line.split("->"))
        ignored.add((a, b))
    return container, layers, independent, ignored


def position(module: str, layers: list[list[str]]) -> tuple[int, str] | None:
    """``(layer index, member)`` of ``module`` (top layer = 0), or ``None``."""
    for i, members in enumerate(layers):
        for m in members:
            if module == m or module.startswith(m + "."):
                return i, m
    return None


def cycles(graph: grimp.ImportGraph, modules: list[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    adj = {m: sorted(graph.find_modules_directly_imported_by(m) & set(modules)) for m in modules}
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on.add(v)
            if i < len(adj[v]):
                work.append((v, i + 1))
                w = adj[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("pyproject.toml"))
    args = parser.parse_args(argv)
    container, layers, independent, ignored = layer_table(args.config)
    graph = grimp.build_graph(container, cache_dir=None)
    package = Path(__import__(container).__file__).parent
    print(f"# {container} from {package}")
    for d in sorted(p for p in package.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        if any(d.glob("*.py")) and not (d / "__init__.py").exists():
            print(f"WARNING: {d} has no __init__.py: grimp does not see its modules")
    modules = sorted(graph.modules)
    upward, unplaced = [], []
    for m in modules:
        here = position(m, layers)
        if here is None:
            if m != container:
                unplaced.append(m)
            continue
        for imported in sorted(graph.find_modules_directly_imported_by(m)):
            there = position(imported, layers)
            if there is None:
                continue
            up = there[0] < here[0]
            sibling = there[0] == here[0] and there[1] != here[1] and independent[here[0]]
            if up or sibling:
                lines = graph.get_import_details(importer=m, imported=imported)
                where = ", ".join(str(d["line_number"]) for d in lines)
                kind = "upward" if up else "sibling"
                note = "  [ignored by the contract]" if (m, imported) in ignored else ""
                upward.append(f"{kind}: {m} -> {imported} (line {where}){note}")
    found = cycles(graph, modules)
    print(f"\n## upward imports and imports between independent siblings: {len(upward)}")
    print("\n".join(upward))
    print(f"\n## modules in no layer: {len(unplaced)}")
    print("\n".join(unplaced))
    print(f"\n## import cycles (strongly connected modules): {len(found)}")
    for comp in found:
        print(" <-> ".join(comp))
        for a in comp:
            for b in sorted(graph.find_modules_directly_imported_by(a) & set(comp)):
                print(f"    {a} -> {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
