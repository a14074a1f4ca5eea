"""Mutation testing of fedhv's core with mutmut, module by module, with a score report.

Runs ``mutmut run`` (configuration: ``[tool.mutmut]`` in pyproject.toml) over each core
module group, one worker, and prints and writes the mutation score per module:

    score = (killed + timed out) / (mutants tried),

where a mutant that no selected test executes ("no tests") counts as tried and not killed.
Every surviving mutant is listed with its diff (``mutmut show``). Not part of CI: on two
cores the whole core (about 2,100 mutants, 1.5-20 s each) takes hours; ``--sample N`` keeps
every N-th mutant of each source file (mutants sorted by function name, then number:
deterministic, and every file keeps at least its first mutant), which is how
docs/testing.md's scores were taken.

Usage::

    pip install -e '.[test,dev]'
    FEDHV_DATA=/path/to/data python scripts/mutation.py [--modules weighting,metrics] [--sample 8]
        [--report mutation-report.md] [--dry-run]

mutmut works in ``mutants/`` (a copy of src/ and tests/, git-ignored); results are cached
there, so a second run only tries mutants whose function changed. Delete ``mutants/`` to
start afresh.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTMUT = [sys.executable, "-m", "mutmut"]

#: Module groups: name -> (mutant-name glob, source-path prefix).
MODULES: dict[str, tuple[str, str]] = {
    "weighting": ("fedhv.weighting.*", "src/fedhv/weighting/"),
    "algorithms": ("fedhv.algorithms.*", "src/fedhv/algorithms/"),
    "metrics": ("fedhv.metrics.*", "src/fedhv/metrics/"),
    "data/partition": ("fedhv.data.partition.*", "src/fedhv/data/partition.py"),
    "sim/plan": ("fedhv.sim.plan.*", "src/fedhv/sim/plan.py"),
    "results/collect": ("fedhv.results.collect.*", "src/fedhv/results/collect.py"),
}
KILLED = {1, 3, 36, 24, -24, 152, 255}  # a failing test, a pytest error, or a timeout
NO_TESTS = {5, 33}
_NUMBER = re.compile(r"__mutmut_(\d+)$")


def load_results() -> dict[str, dict[str, int | None]]:
    """Exit code per mutant name, per source path (``mutants/<path>.meta``)."""
    out: dict[str, dict[str, int | None]] = {}
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        rel = str(meta.relative_to(ROOT / "mutants"))[: -len(".meta")]
        out[rel] = dict(json.loads(meta.read_text())["exit_code_by_key"])
    return out


def _order(name: str) -> tuple[str, int]:
    m = _NUMBER.search(name)
    return (name[: m.start()] if m else name, int(m.group(1)) if m else 0)


def sample(names: list[str], every: int) -> list[str]:
    """Every ``every``-th mutant of one file, in (function, number) order, from the first."""
    return sorted(names, key=_order)[::every]


def ensure_generated() -> None:
    """Generate the mutants and the test map (cached in mutants/) without trying any mutant.

    A ``mutmut run`` whose pattern matches no mutant generates, collects the per-test
    statistics, then stops at its "nothing matches" check.
    """
    if not load_results():
        subprocess.run([*MUTMUT, "run", "--max-children", "1", "no-such-mutant*"], cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    if not load_results():
        sys.exit("error: mutmut generated no mutants: run `python -m mutmut run` by hand to see why")


def run_module(names: list[str], log: Path) -> float:
    """Try ``names`` with one worker; return the wall time in seconds."""
    start = time.monotonic()
    with log.open("a") as fh:
        for i in range(0, len(names), 200):  # keep command lines short
            subprocess.run([*MUTMUT, "run", "--max-children", "1", *names[i : i + 200]], cwd=ROOT,
                           stdout=fh, stderr=subprocess.STDOUT, check=False)
    return time.monotonic() - start


def show(name: str) -> str:
    r = subprocess.run([*MUTMUT, "show", name], cwd=ROOT, capture_output=True, text=True, check=False)
    return r.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modules", default=",".join(MODULES), help="comma-separated: " + ", ".join(MODULES))
    ap.add_argument("--sample", type=int, default=1, help="try every N-th mutant of each file (default 1: all)")
    ap.add_argument("--report", type=Path, default=ROOT / "mutants" / "mutation-report.md")
    ap.add_argument("--dry-run", action="store_true", help="report the cached results without running mutmut")
    args = ap.parse_args(argv)
    chosen = [m.strip() for m in args.modules.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in MODULES]
    if unknown:
        sys.exit(f"error: --modules {','.join(unknown)} is not a core group; use names from {', '.join(MODULES)}")
    if args.sample < 1:
        sys.exit(f"error: --sample {args.sample} is not a step; use an integer N >= 1 (every N-th mutant)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    if not args.dry_run:
        ensure_generated()
    log = ROOT / "mutants" / "mutation-run.log"
    rows: list[tuple[str, int, int, int, int, int, int, float | None]] = []
    survivors: list[tuple[str, str, str]] = []
    seconds: dict[str, float] = {}
    for module in chosen:
        _, prefix = MODULES[module]
        per_file = {p: r for p, r in load_results().items() if p.startswith(prefix)}
        picked = [n for r in per_file.values() for n in sample(list(r), args.sample)]
        if not args.dry_run and picked:
            seconds[module] = run_module(picked, log)
        wanted = set(picked)
        results = {n: c for r in load_results().values() for n, c in r.items() if n in wanted}
        killed = sum(c in KILLED for c in results.values())
        no_tests = sorted(n for n, c in results.items() if c in NO_TESTS)
        survived = sorted((n for n, c in results.items() if c == 0), key=_order)
        untried = sum(c is None for c in results.values())
        tried = len(results) - untried
        total = sum(len(r) for r in per_file.values())
        rows.append((module, total, len(picked), killed, tried, len(survived), len(no_tests), seconds.get(module)))
        survivors += [(module, n, "survived") for n in survived] + [(module, n, "no tests") for n in no_tests]
    lines = ["| module | mutants | tried | killed | survived | no tests | score | time |", "|---|---|---|---|---|---|---|---|"]
    for module, total, n_picked, killed, tried, surv, nt, secs in rows:
        score = f"{100 * killed / tried:.0f}% ({killed}/{tried})" if tried else "-"
        t = f"{secs / 60:.1f} min" if secs is not None else "-"
        lines.append(f"| {module} | {total} | {n_picked} | {killed} | {surv} | {nt} | {score} | {t} |")
    print("\n".join(lines))
    body = [f"# mutation report (sample: every {args.sample}th mutant per file)", "", *lines, "", "## survivors", ""]
    for module, name, kind in survivors:
        print(f"{kind}: {name}")
        body += [f"### {name} ({kind})", "", "```diff", show(name), "```", ""]
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text("\n".join(body) + "\n")
    print(f"report: {args.report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
