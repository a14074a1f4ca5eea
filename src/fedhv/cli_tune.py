"""``fedhv tune``: its arguments and its command (every method tuned under one budget, docs/methods.md)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any


def add_tune_parser(sub: Any) -> None:
    """The ``tune`` sub-command's arguments."""
    tune = sub.add_parser("tune", help="tune every method's learning rates and hyper-parameters on the validation "
                          "split, with one budget for all (Optuna; resumable)")
    tune.add_argument("setting", metavar="SETTING", help="preset name or TOML file")
    tune.add_argument("--methods", default="uniform,fsmgda,fedcmoo,fedhv",
                      help="comma-separated (default: the paper's four)")
    tune.add_argument("--trials", type=int, default=20, help="trials per method (default 20); the first is the "
                      "setting's values")
    tune.add_argument("--rounds", type=int, help="rounds per trial (default: the setting's)")
    tune.add_argument("--objective", default="mean-worst",
                      help="mean-worst (default: (MeanAcc + WorstAcc) / 2), mean-acc, worst-acc or hv, on the "
                      "validation split")
    tune.add_argument("--window", type=int, default=10,
                      help="the objective averages the last N validation evaluations (default 10)")
    tune.add_argument("--pruner", default="halving", help="halving (successive halving, default), median or none")
    tune.add_argument("--first-rung", type=int, default=0,
                      help="the first round a trial may be stopped at (default: rounds / reduction^2, at an evaluation)")
    tune.add_argument("--reduction", type=int, default=3, help="halving: keep 1/N of the trials at each rung (default 3)")
    tune.add_argument("--startup", type=int, default=3, help="median: finished trials before it stops any (default 3)")
    tune.add_argument("--range", dest="ranges", action="append", default=[], metavar="KEY=LOW:HIGH",
                      help="replace a declared range: lr.global=0.5:2 (factors on every method's rate), stch.mu=0.1:2, "
                      "calibration.margin=0.05:0.3 (repeatable)")
    tune.add_argument("--seed", type=int, default=0, help="the trials' training seed and the sampler's (default 0)")
    tune.add_argument("--out", help="tune folder (default runs/tune-<setting>)")
    tune.add_argument("--storage", help="Optuna storage URL (default: sqlite:///OUT/optuna.db); a database server "
                      "shares one tuning between drivers")
    tune.add_argument("--threads", type=int, help="local: torch threads of the trials (default: all cores)")
    tune.add_argument("--backend", choices=("local", "ray"), default="local",
                      help="local: one trial at a time in this process (default); ray: trials as Ray tasks")
    tune.add_argument("--address", help="ray: the cluster to join (default: a local, loopback-only Ray instance)")
    tune.add_argument("--cpus-per-run", type=float, default=1.0, help="ray: CPUs (and torch threads) per trial")
    tune.add_argument("--num-cpus", type=int, help="ray without --address: the local instance's CPUs (default: all)")
    tune.add_argument("--parallel", type=int, help="ray: trials at once (default: the cluster's CPUs / --cpus-per-run)")
    tune.add_argument("--retries", type=int, default=3, help="ray: new attempts after a lost worker (default 3)")
    tune.add_argument("--data-dir", help="data root (default: $FEDHV_DATA or ~/.cache/fedhv/data)")
    tune.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config value of the setting (repeatable; kept in the chosen configuration)")


def _ranges(items: list[str], error: type[Exception]) -> tuple[tuple[str, float, float], ...]:
    out = []
    for item in items:
        key, _, bounds = item.partition("=")
        low, _, high = bounds.partition(":")
        try:
            lo, hi = float(low), float(high)
        except ValueError:
            raise error(f"--range {item!r}: give KEY=LOW:HIGH, e.g. --range stch.mu=0.1:2") from None
        if not key.strip() or not (math.isfinite(lo) and math.isfinite(hi)):
            raise error(f"--range {item!r}: give KEY=LOW:HIGH with finite numbers, e.g. --range stch.mu=0.1:2")
        out.append((key.strip(), lo, hi))
    return tuple(out)


def run_tune_command(args: argparse.Namespace) -> int:
    """``fedhv tune``: check the plan (before anything runs), then tune on this process or on Ray."""
    from fedhv.cli_args import UsageError
    from fedhv.cli_args import csv_list as _csv_list
    from fedhv.cli_args import method_arg as _method
    from fedhv.cli_args import quote as _quote
    from fedhv.config import load_config
    from fedhv.experiment.grid import setting_source
    from fedhv.experiment.tune import pin_calibration, run_tune
    from fedhv.experiment.tune_space import Pruning, TunePlan, check_plan, trial_configs

    ray_only = {"--address": args.address, "--num-cpus": args.num_cpus, "--parallel": args.parallel,
                "--cpus-per-run": args.cpus_per_run != 1.0 or None, "--retries": args.retries != 3 or None}
    if args.backend == "local" and any(v is not None for v in ray_only.values()):
        raise UsageError(f"{', '.join(k for k, v in ray_only.items() if v is not None)}: only with --backend ray")
    if args.backend == "ray" and args.threads is not None:
        raise UsageError("--threads is the local backend's; with --backend ray each trial uses --cpus-per-run threads")
    for flag, value in (("--threads", args.threads), ("--num-cpus", args.num_cpus), ("--parallel", args.parallel)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value} must be >= 1")
    if not (math.isfinite(args.cpus_per_run) and args.cpus_per_run > 0):
        raise UsageError(f"--cpus-per-run {args.cpus_per_run} must be a finite number > 0, e.g. 1")
    if args.retries < 0:
        raise UsageError(f"--retries {args.retries}: give 0 or more")
    methods = tuple(_method(m) for m in _csv_list("--methods", args.methods, str))
    source = setting_source(args.setting)
    base = load_config(source, args.overrides)  # the setting and the user's overrides, validated
    rounds = base.rounds if args.rounds is None else args.rounds
    execution = [f"data.root={_quote(args.data_dir)}"] if args.data_dir else []
    if args.backend == "local":
        import os

        execution.append(f"threads={args.threads or os.cpu_count() or 1}")
    plan = TunePlan(source, base.setting, methods, args.trials, rounds, tuple(args.overrides), args.objective,
                    args.window, Pruning(args.pruner, args.first_rung, args.reduction, args.startup), args.seed,
                    _ranges(args.ranges, UsageError))
    if args.trials >= 1 and rounds >= 1:
        plan = pin_calibration(plan, execution)
    plan = check_plan(plan, trial_configs(plan, execution))
    out = Path(args.out or f"runs/tune-{plan.name}").resolve()
    print(f"tune {out}: {', '.join(methods)}; per method {plan.trials} trials x {plan.rounds} rounds "
          f"({plan.trials * plan.rounds} rounds at most), objective {plan.objective} on validation, pruner "
          f"{plan.pruning.kind}" + (f" from round {plan.pruning.first_rung}" if plan.pruning.kind != "none" else ""),
          flush=True)
    try:
        if args.backend == "ray":
            from fedhv.experiment.grid_ray import RayOptions
            from fedhv.experiment.tune_ray import run_tune_ray

            opts = RayOptions(args.address, args.cpus_per_run, 0.0, "shared", args.retries, args.num_cpus)
            report = run_tune_ray(plan, out, args.storage, opts, execution, args.parallel)
        else:
            report = run_tune(plan, out, args.storage, execution)
    except KeyboardInterrupt:
        print(f"tune {out}: stopped; the running trials were checkpointed. Rerun the same command to continue.",
              file=sys.stderr)
        raise
    budget = report.record["budget"]
    for line in report.lines:
        print(line)
    for method, m in report.record["methods"].items():
        states = [t["state"] for t in m["trials"]]
        print(f"{method}: {m['counted']} trials ({states.count('complete')} finished, {states.count('pruned')} "
              f"stopped early, {states.count('fail')} failed or re-queued), {m['rounds_run']} of "
              f"{budget['rounds_per_method']} rounds, {m['cpu_s'] / 3600:.3f} CPU-hours")
    print(f"budget: {budget['trials_per_method']} trials x {budget['rounds_per_trial']} rounds per method; trials "
          f"{budget['trial_cpu_hours']:.3f} CPU-hours, calibration {budget['calibration_seconds']:.0f} s; "
          f"{report.seconds:.0f} s")
    print(f"chosen: {report.chosen}  (fedhv grid {report.chosen} --methods {','.join(methods)})")
    print(f"record: {out / 'record.json'}, trials in {out / 'trials'}")
    return 0
