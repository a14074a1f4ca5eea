"""``fedhv grid``: its arguments and its command (the local pool or Ray, docs/cluster.md)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any


def add_grid_parser(sub: Any) -> None:
    """The ``grid`` sub-command's arguments."""
    grid = sub.add_parser("grid", help="run every setting x method x seed (resumable, parallel)")
    grid.add_argument("settings", nargs="+", metavar="SETTING", help="preset names or TOML files")
    grid.add_argument("--methods", help="comma-separated (default: the paper's four; with --front: fedhv,linear,fedcmoo-pref)")
    grid.add_argument("--seeds", default="0,42,2026", help="comma-separated training seeds (default: the paper's)")
    grid.add_argument("--out", default="runs/grid", help="grid directory (default runs/grid)")
    grid.add_argument("--workers", type=int, help="parallel worker processes of the local pool (default 1)")
    grid.add_argument("--threads", type=int, help="torch threads per worker (default: cores / workers)")
    grid.add_argument("--backend", choices=("local", "ray"), default="local",
                      help="local: a process pool on this machine (default); ray: every run a Ray task (docs/cluster.md)")
    grid.add_argument("--address", help="ray: the cluster to join (ray start's address; default: a local Ray instance)")
    grid.add_argument("--cpus-per-run", type=float, default=1.0, help="ray: CPUs (and torch threads) per run (default 1)")
    grid.add_argument("--gpus-per-run", type=float, default=0.0,
                      help="ray: GPUs per run, fractions share a device (default 0; > 0 runs on cuda)")
    grid.add_argument("--storage", choices=("auto", "shared", "ship"), default="auto",
                      help="ray: where runs write: in place on a shared filesystem, or shipped back (default auto)")
    grid.add_argument("--retries", type=int, default=3, help="ray: new attempts after a lost worker or node (default 3)")
    grid.add_argument("--num-cpus", type=int, help="ray without --address: the local instance's CPUs (default: all)")
    grid.add_argument("--ablation", help="FedHV ablation sweep: report-budget, participation, local-steps or all "
                      "(paper C.5; use --methods fedhv); server-lr: every method at 0.5x and 2x its own eta_g")
    grid.add_argument("--front", metavar="SPEC",
                      help="trace fronts (docs/fronts.md): every method aimed at each direction u -- H (the interior "
                           "Das-Dennis lattice), uniform (the paper's direction) or 'a,b;c,d'")
    grid.add_argument("--margins", default="0.15",
                      help="with --front: FedHV's margins delta, r = max F^cal + delta m u (default 0.15)")
    grid.add_argument("--rounds", type=int, help="override every run's number of rounds")
    grid.add_argument("--data-dir", help="data root (default: $FEDHV_DATA or ~/.cache/fedhv/data)")
    grid.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config value in every run (repeatable)")
    grid.add_argument("--quiet", action="store_true", help="no progress bar")


def _check_resources(args: argparse.Namespace, error: type[Exception]) -> None:
    """Refuse a non-finite or out-of-range ``--cpus-per-run`` / ``--gpus-per-run`` (one line naming the flag,
    the value and the fix), before anything is planned or started."""
    for flag, value, low, example in (("--cpus-per-run", args.cpus_per_run, 0.0, "1"),
                                      ("--gpus-per-run", args.gpus_per_run, None, "0.5")):
        if not math.isfinite(value) or (low is not None and not value > low) or value < 0:
            bound = "a finite number > 0" if low is not None else "a finite number >= 0"
            raise error(f"{flag} {value} must be {bound}, e.g. {flag} {example}")


def run_grid_command(args: argparse.Namespace) -> int:
    """``fedhv grid``: plan, then run on the local pool or on Ray; exit 1 when a run failed."""
    from fedhv.cli_args import UsageError
    from fedhv.cli_args import csv_list as _csv_list
    from fedhv.cli_args import method_arg as _method
    from fedhv.cli_args import quote as _quote
    from fedhv.experiment.grid import plan_grid, run_grid

    _check_resources(args, UsageError)
    ray_only = {"--address": args.address, "--num-cpus": args.num_cpus, "--cpus-per-run": args.cpus_per_run != 1.0 or None,
                "--gpus-per-run": args.gpus_per_run or None, "--storage": args.storage != "auto" or None,
                "--retries": args.retries != 3 or None}
    if args.backend == "ray" and (args.workers is not None or args.threads is not None):
        raise UsageError("--workers / --threads are the local pool's; with --backend ray the runs in parallel are the "
                         "cluster's CPUs / --cpus-per-run, and each run uses --cpus-per-run threads")
    if args.backend == "local" and any(v is not None for v in ray_only.values()):
        flags = ", ".join(k for k, v in ray_only.items() if v is not None)
        raise UsageError(f"{flags}: only with --backend ray")
    args.workers = 1 if args.workers is None else args.workers
    if args.workers < 1 or (args.threads is not None and args.threads < 1):
        raise UsageError(f"--workers {args.workers} / --threads {args.threads} must be >= 1")
    if args.front is not None and args.ablation is not None:
        raise UsageError("--front and --ablation are two sweeps: run them as separate grids (or one after the other "
                         "into the same --out)")
    if args.front is None and args.margins != "0.15":
        raise UsageError("--margins: only with --front (the margins of FedHV's references along each direction)")
    default = "fedhv,linear,fedcmoo-pref" if args.front is not None else "uniform,fsmgda,fedcmoo,fedhv"
    methods = [_method(m) for m in _csv_list("--methods", args.methods or default, str)]
    seeds = _csv_list("--seeds", args.seeds, int)
    overrides = list(args.overrides)
    if args.data_dir:
        overrides.append(f"data.root={_quote(args.data_dir)}")
    if args.rounds is not None:
        overrides.append(f"rounds={args.rounds}")
    if args.backend == "ray" and args.gpus_per_run > 0 and not any(o.startswith("device=") for o in overrides):
        overrides.append('device="cuda"')  # Ray gives each task its share of a GPU as cuda:0
    out = Path(args.out).resolve() if args.backend == "ray" else Path(args.out)  # workers may start elsewhere
    if args.front is not None:
        from fedhv.experiment.grid_front import plan_front

        jobs, calibrations = plan_front(args.settings, methods, seeds, out, overrides, args.front,
                                        _csv_list("--margins", args.margins, float))
    else:
        jobs, calibrations = plan_grid(args.settings, methods, seeds, out, overrides, args.ablation)
    try:
        if args.backend == "ray":
            from fedhv.experiment.grid_ray import RayOptions, run_grid_ray

            opts = RayOptions(args.address, args.cpus_per_run, args.gpus_per_run, args.storage, args.retries,
                              args.num_cpus)
            report = run_grid_ray(jobs, calibrations, out, opts, progress=not args.quiet)
        else:
            report = run_grid(jobs, calibrations, out, args.workers, args.threads, progress=not args.quiet)
    except KeyboardInterrupt:
        print(f"grid {out}: stopped; queued runs were not started, running ones were checkpointed. "
              "Rerun the same command to continue.", file=sys.stderr)
        raise
    print(f"grid {out}: {len(report.done)} run(s) finished, {len(report.skipped)} already done, "
          f"{len(report.failed)} failed, {report.seconds:.0f} s")
    for where, why in report.failed.items():
        print(f"  failed: {where}: {why}", file=sys.stderr)
    return 1 if report.failed else 0
