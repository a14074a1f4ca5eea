"""The ``fedhv`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Sequence

from fedhv.cli_args import UsageError  # re-exported: this module's name before cli_args
from fedhv.cli_args import csv_list as _csv_list
from fedhv.cli_args import method_arg as _method
from fedhv.cli_args import quote as _quote
from fedhv.cli_grid import add_grid_parser, run_grid_command
from fedhv.cli_tune import add_tune_parser, run_tune_command
from fedhv.errors import FedHVError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("setting", nargs="?", help="preset name (see `fedhv presets`) or a TOML file")
    p.add_argument("--data-dir", help="data root (default: $FEDHV_DATA or ~/.cache/fedhv/data)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.local_steps=5 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedhv", description="Task-wise federated multi-objective optimization.")
    parser.add_argument("--version", action="version", version=f"fedhv {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train one method on one setting, or resume a run")
    _common(run)
    run.add_argument("--resume", metavar="RUN_DIR",
                     help="continue the interrupted run in RUN_DIR from its last checkpoint (give no SETTING)")
    run.add_argument("--method", help="fedhv (default), uniform, fsmgda or fedcmoo")
    run.add_argument("--seed", type=int, help="training seed (default 0)")
    run.add_argument("--rounds", type=int, help="number of adaptive rounds")
    run.add_argument("--engine", choices=["batched", "sequential"], help="client execution engine")
    run.add_argument("--device", help="cpu (default), cuda or cuda:N; with --resume: continue on this device")
    run.add_argument("--out", help="run directory, new or empty (default runs/<setting>-<method>-s<seed>-<time>)")
    run.add_argument("--overwrite", action="store_true",
                     help="replace the finished run in --out (an unfinished one is never replaced)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--accept-changed-code", action="store_true",
                     help="with --resume: resume even when the module data.benchmark names changed since the run "
                     "began (the run then mixes two versions of that code)")
    stats = sub.add_parser("partition-stats", help="per-client label statistics and heterogeneity of a setting's "
                           "partition (validates only the partition keys)")
    _common(stats)
    stats.add_argument("--format", choices=["text", "csv", "json"], default="text",
                       help="text (default), csv (the heterogeneity summaries, one tidy table) or json (everything)")
    stats.add_argument("--gradients", action="store_true", help="also the per-task gradient dissimilarity zeta^2 "
                       "(paper A.2) at the initial model or --model: one forward/backward pass per client")
    stats.add_argument("--model", metavar="RUN_DIR", help="with --gradients: the model.pt (or run directory) to "
                       "measure at (default: the setting's initial model)")
    stats.add_argument("--grad-clients", type=int, default=100, help="with --gradients: at most this many clients "
                       "(a seeded sample when N is larger; default 100)")
    show = sub.add_parser("show-config", help="print a setting's resolved configuration")
    _common(show)
    show.add_argument("--method", help="method whose learning rates to resolve")
    show.add_argument("--out", metavar="FILE", help="write the configuration to FILE (atomically, only when it is "
                      "valid) instead of printing it; a shell redirect leaves an empty file behind an error")
    sub.add_parser("presets", help="list the bundled settings, one line each")
    add_grid_parser(sub)
    add_tune_parser(sub)
    table = sub.add_parser("table", help="the paper's tables from run directories (no torch needed)")
    table.add_argument("dir", help="folder searched recursively for finished run directories")
    table.add_argument("--table", default="all", help="comma-separated tables: 1,8,9,11,7,10,12,13,fairness,theory "
                       "(all: these), ranks (every method ranked), intervals (bootstrap intervals and verdicts)")
    table.add_argument("--format", choices=["markdown", "latex", "csv"], default="markdown")
    table.add_argument("--paper", action="store_true", help="add the paper's published values and our difference")
    table.add_argument("--statistic", choices=["last10", "scheduled", "final"],
                       help="each run's value: the mean of its last ten scheduled evaluations (default of ranks and "
                       "intervals), its last scheduled one (paper B.5, default of the paper's tables) or the extra "
                       "one after the last round")
    table.add_argument("--split", choices=["test", "val"], default="test",
                       help="the evaluated set the tables read (val: the server-side validation set)")
    table.add_argument("--reference", default="fedhv,uniform", metavar="METHODS",
                       help="intervals: comma-separated methods the verdicts compare with (default fedhv,uniform)")
    table.add_argument("--out", help="folder: write one file per table (table1.md, table9.tex, table11.csv, ...) "
                       "instead of printing")
    flower = sub.add_parser("flower", help="real federated runs on Flower (pip install 'fedhv[flower]')")
    flower_sub = flower.add_subparsers(dest="flower_command", required=True)
    local = flower_sub.add_parser("local", help="a SuperLink and --nodes SuperNodes on 127.0.0.1, one run")
    _common(local)
    local.add_argument("--nodes", type=int, help="SuperNodes = clients (partition.clients); required unless --resume")
    local.add_argument("--resume", metavar="RUN_DIR", help="continue the interrupted Flower (or fedhv run) run in "
                       "RUN_DIR from its last checkpoint (give no SETTING)")
    local.add_argument("--tls", action="store_true", help="TLS to the SuperLink with a fresh test CA (docs/flower.md)")
    local.add_argument("--auth", action="store_true", help="SuperNode authentication (needs --tls): one registered "
                       "key per SuperNode")
    local.add_argument("--secure", action="store_true", help="secure aggregation (SecAgg+): the server learns only "
                       "the clients' mean update and report (flower.secure_aggregation = true; docs/security.md)")
    local.add_argument("--method", help="fedhv (default), uniform, fsmgda or fedcmoo")
    local.add_argument("--seed", type=int, help="training seed (default 0)")
    local.add_argument("--rounds", type=int, help="number of adaptive rounds")
    local.add_argument("--out", help="run directory, new or empty (default runs/<setting>-<method>-s<seed>-flower-<time>)")
    local.add_argument("--isolation", choices=["process", "subprocess"], default="process",
                       help="process (default): one long-lived ClientApp process per SuperNode; subprocess: "
                       "Flower's fresh process per message")
    local.add_argument("--stage-timeout", type=float, default=0.0,
                       help="seconds a stage waits for replies; later ones count as dropped (default 0: wait)")
    local.add_argument("--node-data", metavar="DIR", help="SuperNode K serves its own samples from DIR/client-K.npz "
                       "(written by `fedhv flower export`) instead of partition K of the setting")
    local.add_argument("--quiet", action="store_true", help="no progress bar")
    local.add_argument("--accept-changed-code", action="store_true",
                       help="with --resume: resume even when the module data.benchmark names changed since the run "
                       "began (the run then mixes two versions of that code)")
    export = flower_sub.add_parser("export", help="write each client's training samples of a setting to "
                                   "DIR/client-K.npz (a SuperNode's own data file, docs/flower.md)")
    _common(export)
    export.add_argument("--nodes", type=int, help="as for `flower local`: partition.clients = N (the same "
                        "partition `fedhv flower local SETTING --nodes N` uses)")
    export.add_argument("--out", required=True, help="folder for the client-K.npz files")
    export.add_argument("--clients", help="comma-separated client ids (default: all)")
    plot = sub.add_parser("plot", help="learning curves, weights and wall-clock figures (no torch needed)")
    plot.add_argument("dir", nargs="?", help="folder searched recursively for finished run directories")
    plot.add_argument("--examples", metavar="SETTING", help="instead of run figures: example images of SETTING's "
                      "benchmark (paper Figure 4; needs its data: --data-dir or $FEDHV_DATA)")
    plot.add_argument("--data-dir", help="data root for --examples (default: $FEDHV_DATA or ~/.cache/fedhv/data)")
    plot.add_argument("--out", help="figure folder (default DIR/figures, or ./figures with --examples)")
    plot.add_argument("--formats", default="png,pdf", help="comma-separated file formats (default png,pdf)")
    plot.add_argument("--size", choices=["column", "page"], default="page",
                      help="figure width: one paper column (3.3 in) or the page (6.9 in, default)")
    return parser


def _version() -> str:
    """The installed distribution's version, or ``fedhv.__version__`` when not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedhv")
    except PackageNotFoundError:
        from fedhv import __version__

        return __version__


def _preset_line(name: str) -> str:
    """One line describing preset ``name``: benchmark, partition, participation, rounds, K."""
    from fedhv.config.loader import load_setting

    d = load_setting(name)
    part, train, ev = d.get("partition", {}), d.get("train", {}), d.get("eval", {})
    sizes = (f"N = {part.get('clients')} x {part.get('samples_per_client')} samples"
             if part.get("sizes", "equal") == "equal" else
             f"N = {part.get('clients')}, {part.get('sizes')} sizes (mean {part.get('samples_per_client')})")
    return (f"{name:<16} {d.get('data', {}).get('benchmark')}, alpha = {part.get('alpha')} {part.get('strata')}, "
            f"{sizes}, "
            f"M = {train.get('clients_per_round')} per round, {d.get('rounds')} rounds, batch "
            f"{train.get('batch_size')}, K = {train.get('local_steps')}, test every {ev.get('test_period')} rounds")


def _overrides(args: argparse.Namespace) -> list[str]:
    out = list(args.overrides)
    if getattr(args, "data_dir", None):
        out.append(f"data.root={_quote(args.data_dir)}")
    if getattr(args, "method", None) is not None:
        args.method = _method(args.method)
    for flag, key in (("method", "method"), ("seed", "seed"), ("rounds", "rounds"), ("engine", "engine"),
                      ("device", "device")):
        value = getattr(args, flag, None)
        if value is not None:
            out.append(f"{key}={_quote(value) if isinstance(value, str) else value}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    args = build_parser().parse_args(argv)
    warnings.simplefilter("default")
    warnings.formatwarning = lambda msg, cat, *a, **k: f"warning: {msg}\n"  # type: ignore[assignment]
    _setup_logging()
    try:
        return _dispatch(args)
    except FedHVError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", None)  # fedhv.experiment.runner.Terminated: SIGTERM
        if signum is not None:
            print(f"terminated (signal {signum}); finished rounds are kept in the run directory", file=sys.stderr)
            return 128 + int(signum)
        print("interrupted; finished rounds are kept in the run directory", file=sys.stderr)
        return 130


class _TqdmHandler(logging.Handler):
    """Log records as ``warning: ...`` lines that do not break progress bars."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm  # type: ignore[import-untyped]

        tqdm.write(f"{record.levelname.lower()}: {record.getMessage()}", file=sys.stderr)


def _setup_logging() -> None:
    logger = logging.getLogger("fedhv")
    if not any(isinstance(h, _TqdmHandler) for h in logger.handlers):
        logger.addHandler(_TqdmHandler())
    logger.setLevel(logging.WARNING)
    logger.propagate = False


def _dispatch(args: argparse.Namespace) -> int:
    from fedhv.config import load_config, preset_names

    if args.command == "presets":
        for name in preset_names():
            print(_preset_line(name))
        return 0
    if args.command == "run" and args.resume:
        return _resume(args)
    if args.command == "grid":
        return run_grid_command(args)
    if args.command == "tune":
        return run_tune_command(args)
    if args.command == "table":
        return _table(args)
    if args.command == "plot":
        return _plot(args)
    if args.command == "flower":
        return _flower(args)
    if not args.setting:
        raise UsageError(f"fedhv {args.command}: give a SETTING (a preset name, see `fedhv presets`, or a TOML file)")
    if args.command == "partition-stats":  # only the partition keys are validated (fedhv.stats)
        from fedhv.stats import load_partition_config, print_partition_stats

        print_partition_stats(load_partition_config(args.setting, _overrides(args)), args.format, args.gradients,
                              args.model, args.grad_clients)
        return 0
    # show-config is an inspection command: it imports no code a (received) configuration names
    cfg = load_config(args.setting, _overrides(args), import_code=args.command != "show-config")
    if args.command == "show-config":
        from fedhv.code_digest import reference_module
        from fedhv.config import dumps, to_dict

        module = reference_module(cfg.data.benchmark)
        if module is not None:
            print(f"note: data.benchmark = {cfg.data.benchmark!r} names code (module {module!r}); show-config does "
                  "not import it", file=sys.stderr)

        text = dumps(to_dict(cfg))
        if args.out:
            from pathlib import Path

            from fedhv.results.rundir import write_atomic

            write_atomic(Path(args.out), text)
        else:
            print(text, end="")
        return 0
    from fedhv.config.flower import refuse_in_simulator

    refuse_in_simulator(cfg)  # run_experiment refuses it too; here before torch loads or --overwrite deletes
    from fedhv._malloc import tune_allocator
    from fedhv.experiment.runner import claim_run_dir, run_experiment

    if args.overwrite and args.out is None:
        raise UsageError("--overwrite replaces the run in --out; give --out DIR")
    tune_allocator()
    # Claimed (created, checked, locked) before any data is loaded: a bad --out fails at once.
    run = claim_run_dir(cfg, args.out, overwrite=args.overwrite)
    print(f"run directory: {run.path}", flush=True)
    summary = run_experiment(cfg, run, progress=not args.quiet)
    _print_summary(summary)
    print(f"run directory: {run.path}")
    return 0


def _flower(args: argparse.Namespace) -> int:
    """``fedhv flower local`` / ``export``: every flwr import stays inside fedhv.flower."""
    if args.flower_command == "export":
        return _flower_export(args)
    from fedhv.flower import require_flwr

    require_flwr()
    from tqdm import tqdm  # type: ignore[import-untyped]

    from fedhv.config.flower import check_wait

    check_wait("--stage-timeout", args.stage_timeout)

    from fedhv.flower.local import local_config, resume_config, run_local, sigterm_raises

    resume = None
    if args.resume:
        extra = [flag for flag, value in (("SETTING", args.setting), ("--set", args.overrides),
                                          ("--data-dir", args.data_dir), ("--method", args.method),
                                          ("--seed", args.seed), ("--rounds", args.rounds), ("--out", args.out))
                 if value is not None and value != []]
        if extra:
            raise UsageError(f"--resume continues a run with the configuration in its config.toml; drop "
                             f"{', '.join(extra)}")
        resume, cfg = args.resume, resume_config(args.resume, args.accept_changed_code)
        if args.nodes is not None and args.nodes != cfg.partition.clients:
            raise UsageError(f"--nodes {args.nodes} but the run has partition.clients = {cfg.partition.clients}; "
                             f"drop --nodes or give --nodes {cfg.partition.clients}")
        args.nodes = cfg.partition.clients
    elif not args.setting:
        raise UsageError("fedhv flower local: give a SETTING (a preset name, see `fedhv presets`, or a TOML file)")
    elif args.nodes is None:
        raise UsageError("fedhv flower local: give --nodes N (one SuperNode per client)")
    else:
        secure = ["flower.secure_aggregation=true"] if args.secure else []
        cfg = local_config(args.setting, args.nodes, [*_overrides(args), *secure])
    if args.secure and not cfg.flower.secure_aggregation:
        raise UsageError(f"--secure with --resume {args.resume}: the run was not secure (its config.toml has "
                         "flower.secure_aggregation = false); resume it without --secure")
    bar = tqdm(total=cfg.rounds, desc=f"flower {cfg.setting} {cfg.method} s{cfg.seed} ({args.nodes} nodes)",
               disable=args.quiet, dynamic_ncols=True, mininterval=0.5)

    cal_bar: list[tqdm] = []

    def progress(done: int, total: int) -> None:
        bar.update(max(min(done, total) - bar.n, 0))

    def calibration(done: int, total: int) -> None:  # FedHV's reference calibration, before round 1
        if not cal_bar:
            cal_bar.append(tqdm(total=total, desc="calibration", disable=args.quiet, dynamic_ncols=True, leave=False))
        cal_bar[0].update(max(min(done, total) - cal_bar[0].n, 0))

    with sigterm_raises():
        try:
            run_dir = run_local(None if resume else cfg, args.nodes, args.out, isolation=args.isolation,
                                stage_timeout=args.stage_timeout, progress=progress, tls=args.tls, auth=args.auth,
                                resume=resume, node_data=args.node_data, calibration=calibration,
                                accept_changed_code=args.accept_changed_code)
        finally:
            for b in [*cal_bar, bar]:
                b.close()
    import json

    _print_summary(json.loads((run_dir / "summary.json").read_text()))
    print(f"run directory: {run_dir}")
    return 0


def _flower_export(args: argparse.Namespace) -> int:
    """``fedhv flower export SETTING --out DIR``: client K's samples to ``DIR/client-K.npz``."""
    from fedhv.config import load_config
    from fedhv.data.node_file import export_partition, node_data_file

    if not args.setting:
        raise UsageError("fedhv flower export: give a SETTING (a preset name, see `fedhv presets`, or a TOML file)")
    if args.nodes is not None:
        from fedhv.flower.local import local_config

        cfg = local_config(args.setting, args.nodes, _overrides(args))
    else:
        cfg = load_config(args.setting, _overrides(args))
    n = cfg.partition.clients
    clients = list(range(n)) if args.clients is None else _csv_list("--clients", args.clients, int)
    bad = [c for c in clients if not 0 <= c < n]
    if bad or not clients:
        raise UsageError(f"--clients {args.clients}: the setting has clients 0..{n - 1} (partition.clients = {n}); "
                         "give ids in that range")
    for c in clients:
        path = export_partition(cfg, c, node_data_file(args.out, c))
        print(f"client {c}: {path}")
    return 0


def _resume(args: argparse.Namespace) -> int:
    extra = [flag for flag, value in (("SETTING", args.setting), ("--set", args.overrides), ("--data-dir", args.data_dir),
                                      ("--method", args.method), ("--seed", args.seed), ("--rounds", args.rounds),
                                      ("--engine", args.engine), ("--out", args.out),
                                      ("--overwrite", args.overwrite))
             if value is not None and value is not False and value != []]
    if extra:
        raise UsageError(
            f"--resume continues a run with the configuration in its config.toml; drop {', '.join(extra)}"
        )
    from fedhv._malloc import tune_allocator
    from fedhv.experiment import resume_experiment

    tune_allocator()
    _print_summary(resume_experiment(args.resume, progress=not args.quiet, device=args.device,
                                     accept_changed_code=args.accept_changed_code))
    return 0


def _finished_runs(folder: str, statistic: str | None = None, split: str = "test") -> list:
    from fedhv.results.collect import failure_of, find_runs

    try:
        runs, unfinished = find_runs(folder, statistic=statistic, split=split)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    failed = {run: f for run in unfinished if (f := failure_of(run)) is not None}
    for run, failure in failed.items():
        print(f"note: left out, failed after {failure.get('rounds_done')} rounds: {run}: {failure.get('error')}: "
              f"{failure.get('message')}", file=sys.stderr)
    if len(unfinished) > len(failed):
        print(f"note: {len(unfinished) - len(failed)} unfinished run(s) left out (resume them with "
              "`fedhv run --resume DIR`)", file=sys.stderr)
    if not runs:
        raise UsageError(f"{folder}: no finished run directories (with summary.json) found")
    return runs


def _table(args: argparse.Namespace) -> int:
    from fedhv.results.table_model import render, write_tables
    from fedhv.results.tables import EXTRA_TABLES, TABLES, build_tables

    which = list(TABLES) if args.table == "all" else _csv_list("--table", args.table, str)
    bad = [t for t in which if t not in TABLES + EXTRA_TABLES]
    if bad:
        raise UsageError(f"--table {','.join(bad)}: fedhv makes tables {', '.join(TABLES + EXTRA_TABLES)}")
    tables = build_tables(_finished_runs(args.dir, statistic=args.statistic, split=args.split), which,
                          paper=args.paper, references=_csv_list("--reference", args.reference, str))
    if not tables:
        raise UsageError(f"{args.dir}: the runs found give none of tables {', '.join(which)}")
    for line in dict.fromkeys(w for t in tables for w in t.warnings):
        print(f"note: {line}", file=sys.stderr)
    if args.out is None:
        print(render(tables, args.format), end="")
        return 0
    try:
        files = write_tables(tables, args.format, args.out)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot write tables there ({exc.strerror or exc}); "
                         "choose a writable folder") from None
    for f in files:
        print(f)
    return 0


def _plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fedhv.results.plots import make_figures, supported_formats

    supported = supported_formats()  # PlotDependencyError ("pip install 'fedhv[plot]'") before reading any run
    if (args.dir is None) == (args.examples is None):
        raise UsageError("fedhv plot needs a run folder DIR or --examples SETTING (one of them)")
    formats = _csv_list("--formats", args.formats, str)
    bad = [f for f in formats if f not in supported]
    if bad:
        raise UsageError(f"--formats {','.join(bad)}: not a figure format; choose from {', '.join(supported)}")
    if args.examples is not None:
        from fedhv.results.examples_fig import make_examples

        overrides = [] if args.data_dir is None else [f"data.root={_quote(args.data_dir)}"]
        for f in make_examples(args.examples, overrides, Path(args.out or "figures"), formats, args.size):
            print(f)
        return 0
    out = Path(args.out) if args.out else Path(args.dir) / "figures"
    runs = _finished_runs(args.dir)
    try:
        files = make_figures(runs, out, formats, size=args.size)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write figures there ({exc.strerror or exc}); "
                         "choose a writable folder") from None
    for f in files:
        print(f)
    return 0


def _num(value: object, spec: str) -> str:
    """``value`` formatted with ``spec``, or ``n/a`` when it is missing (``null`` in summary.json)."""
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "n/a"


def _print_summary(summary: dict) -> None:
    acc = summary.get("task_acc") or []
    print(
        f"{summary.get('method')} seed {summary.get('seed')}: MeanAcc {_num(summary.get('mean_acc'), '.2f')}  "
        f"WorstAcc {_num(summary.get('worst_acc'), '.2f')}  MeanLoss {_num(summary.get('mean_loss'), '.4f')}  "
        f"HV {_num(summary.get('hv'), '.3f')}  task acc {', '.join(_num(a, '.2f') for a in acc) or 'n/a'}  "
        f"({_num(summary.get('wall_clock_s'), '.1f')} s)"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
