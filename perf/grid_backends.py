"""The same grid on the local process pool and on Ray, on this machine: Ray's overhead.

    FEDHV_DATA=... python perf/grid_backends.py [--rounds 30] [--seeds 0,42,2026]

MultiMNIST, the four methods × the seeds (FedHV's 20-round calibration included), each grid
into a fresh folder, one after the other:

- ``--workers 1`` (one process, all cores as torch threads),
- ``--workers 2`` (two processes, one thread each),
- ``--backend ray`` with ``--cpus-per-run 1`` (a local Ray instance, two tasks at a time, one
  thread each: the same resources as ``--workers 2``),
- ``--backend ray`` with ``--cpus-per-run 2`` (one task at a time: as ``--workers 1``).

Prints each grid's wall clock, Ray's against the pool with the same resources, and checks
that each Ray grid's ``fedhv table`` (its wall-clock rows left out) equals the pool's with the
same threads per run. The numbers depend on the machine's
load: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seeds", default="0,42,2026")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fedhv-grid-backends-"))
    common = ["multimnist", "--seeds", args.seeds, "--rounds", str(args.rounds), "--quiet"]
    paths = {"--workers 1": ["--workers", "1"], "--workers 2": ["--workers", "2"],
             "--backend ray --cpus-per-run 1": ["--backend", "ray", "--cpus-per-run", "1"],
             "--backend ray --cpus-per-run 2": ["--backend", "ray", "--cpus-per-run", "2"]}
    wall: dict[str, float] = {}
    tables: dict[str, str] = {}
    for i, (name, flags) in enumerate(paths.items()):
        out = base / f"g{i}"
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "fedhv.cli", "grid", *common, *flags, "--out", str(out)],
                             capture_output=True, text=True, check=False)
        wall[name] = time.perf_counter() - t0
        if res.returncode != 0:
            raise SystemExit(f"{name} failed:\n{res.stderr[-3000:]}")
        csv = subprocess.run([sys.executable, "-m", "fedhv.cli", "table", str(out), "--format", "csv"],
                             capture_output=True, text=True, check=True).stdout
        tables[name] = "\n".join(r for r in csv.splitlines() if not r.split(",")[3].endswith("_s"))  # not the clocks
        print(f"{name}: {wall[name]:.0f} s", flush=True)
    same = {"--backend ray --cpus-per-run 1": "--workers 2", "--backend ray --cpus-per-run 2": "--workers 1"}
    print("\n| grid | wall clock | against the pool with the same resources |\n|---|---|---|")
    for name, seconds in wall.items():
        ref = same.get(name)
        ratio = f"{seconds / wall[ref]:.3f} × `{ref}` ({100 * (seconds / wall[ref] - 1):+.1f} %)" if ref else "–"
        print(f"| `{name}` | {seconds:.0f} s | {ratio} |")
    for ray_name, ref in same.items():  # same threads per run: the same floats
        print(f"`fedhv table` of `{ray_name}` equals `{ref}`'s: {tables[ray_name] == tables[ref]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
