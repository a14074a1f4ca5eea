"""Round timing: engines (sequential vs batched) and methods, measured in one process.

Usage::

    FEDHV_DATA=../shared/data python perf/round_time.py [SETTING] [--rounds R]
        [--methods all | uniform,fedhv,...] [--set k=v ...] [--no-sequential] [--profile N [--profile-only]]

Part 1 times FedHV rounds with both engines: seconds per round (median of ``R`` timed
rounds after a warm-up), the client-time split into objective reports and local
training, FLOPs per round (``torch.utils.flop_counter`` on the sequential engine:
convolutions and matrix products, forward and backward), achieved GFLOP/s and the
batched/sequential ratio, and the achieved GFLOP/s of the report pass and of the training
pass separately, and the round's share of the machine's measured fp32 peak (``peak.py``).
Where the model runs a compiled kernel (:mod:`fedhv.models.native`: LeNet's first layer,
and the pooling of a last convolution), Part 1 also times the batched engine with the
kernels disabled (row ``batched-pt``): their before/after in one run. Then the batched
report pass and one test evaluation run alternately with the plain ``model(x)`` forward in
PyTorch's own layers (no compiled kernel) and the fast inference path
(:mod:`fedhv.models.inference`),
median wall and CPU seconds of each, plus the evaluation time of a whole run (every
``eval.test_period`` rounds and the final one). Part 2 times one round of each method with
the batched engine (every registered method by default), split into client and server time, as
ratios to Uniform, with the cost of the method's weight rule alone (the map from the round's reports or
Gramian to the next weights, median of 50 calls on the round's own inputs) and its share of the round;
and projects
each method's whole run (:func:`end_to_end`: ``rounds`` rounds, the test evaluations and, for
FedHV, its uniform-weight calibration; the accounting of the paper's Table 13) with its ratio
to FedHV (``--set rounds=300`` for Table 13's run length). The 1-minute
load average is printed at the start and the end (other processes share the cores).

Every timing line ends with the process's peak RSS so far (``getrusage`` ``ru_maxrss``;
monotone, so a line's value bounds everything measured up to it) and, on CUDA, the peak
device memory of that measurement (``torch.cuda.max_memory_allocated``, reset before it).
With ``--set precision=bf16`` Part 1 also times the batched fp32 FedHV round and prints the
bf16 / fp32 ratio. ``--profile N`` prints the top ``N`` operators (self CPU time) of one
batched FedHV round under ``torch.profiler``. ``--no-sequential`` skips the sequential
engine (e.g. for the scaling runs over ``train.clients_per_round``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import resource
import statistics
import time

import numpy as np
import torch
from peak import fp32_peak, measure
from torch.utils.flop_counter import FlopCounterMode

from fedhv._malloc import tune_allocator
from fedhv.config import load_config
from fedhv.experiment.method_setup import build_method
from fedhv.experiment.runner import eval_due
from fedhv.experiment.setup import federated_data, make_engine, new_model, sample_clients
from fedhv.metrics.evaluate import evaluate_tasks
from fedhv.models import get_flat, native, set_flat
from fedhv.models.inference import plain_forward
from fedhv.sim.federation import SimFederation


def memory_note(device: str) -> str:
    """Peak RSS so far (and the CUDA peak since the last reset), for the end of a timing line."""
    note = f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"
    if device.startswith("cuda"):
        note += f", CUDA peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
        torch.cuda.reset_peak_memory_stats()
    return note


def time_rounds(cfg, data, method: str, engine_name: str, rounds: int,  # type: ignore[no-untyped-def]
                reference: str | tuple[float, ...] = "paper"):
    """Median (total, client, server, CPU) seconds of ``rounds`` rounds after one warm-up.

    CPU is the process's CPU time (``time.process_time``: all threads, user + system); on a
    shared, loaded machine it moves far less with the load than the wall time does.
    ``reference``: FedHV's (no calibration is timed).
    """
    run_cfg = dataclasses.replace(cfg, method=method, engine=engine_name).with_section(
        "fedhv", dataclasses.replace(cfg.section("fedhv"), reference=reference))
    run_cfg = load_config_like(run_cfg)
    alg = build_method(run_cfg, data, calibration=_timing_calibration(run_cfg, data)).algorithm
    model = new_model(run_cfg, data, 0)
    engine = make_engine(run_cfg, model, data, 0, "bench")
    theta = get_flat(model).clone()
    state = alg.init_state(data.num_tasks)
    samples = []
    last: tuple = ()
    for r in range(rounds + 1):
        fed = SimFederation(engine, sample_clients(0, "bench", r, data.num_clients, cfg.train.clients_per_round), r)
        t0, c0 = time.perf_counter(), time.process_time()
        res = alg.round(state, theta, fed)
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        last = (state, res.log)
        state = res.state
        if r:
            samples.append((total, fed.client_seconds, total - fed.client_seconds, cpu))
    LAST_ROUND[method] = last
    return tuple(statistics.median(s[i] for s in samples) for i in range(4)), engine, alg


def _timing_calibration(cfg, data):  # type: ignore[no-untyped-def]
    """A stand-in calibration for the methods that read one (STCH's nadir): the initial losses as every
    report (no calibration rounds are timed; FedHV times with the paper's reference)."""
    from fedhv.experiment.calibration import CalibrationResult
    from fedhv.experiment.method_setup import initial_losses

    f = initial_losses(cfg, data, 0).tolist()
    return CalibrationResult([v + 0.15 for v in f], f, 0.15, [0], {"0": [f]})


#: Per method, the last timed round's (state before it, log): the inputs :func:`rule_seconds` times the rule on.
LAST_ROUND: dict[str, tuple] = {}


def rule_seconds(method: str, alg, calls: int = 50) -> float | None:  # type: ignore[no-untyped-def]
    """Median seconds of the method's weight rule alone on the last timed round's inputs (None: no rule)."""
    import numpy as np

    from fedhv.algorithms.fedcmoo import find_weights
    from fedhv.algorithms.gramian import GramianInputs
    from fedhv.weighting import hv_weights

    state, log = LAST_ROUND[method]
    if hasattr(alg, "rule"):  # loss-only: the map from the averaged report
        report = np.asarray(log["report"])
        call = lambda: alg.rule.next(report, state.memory, state.rounds)
    elif hasattr(alg.config if hasattr(alg, "config") else None, "weights") and "gram" in log:  # Gramian rule
        inputs = GramianInputs(np.asarray(log["gram"]), state.weights, state.round, 0,
                               None if "losses" not in log else np.asarray(log["losses"]))
        call = lambda: alg.config.weights(inputs)
    elif "gram" in log:  # FedCMOO's FindWeights
        gram = np.asarray(log["gram"])
        call = lambda: find_weights(gram, state.weights)
    elif hasattr(alg, "reference") and "report" in log:  # FedHV's inverse slacks
        report = np.asarray(log["report"])
        call = lambda: hv_weights(report, alg.reference, alg.rho_clip, alg.slack_scale)
    else:
        return None
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def load_config_like(cfg):  # type: ignore[no-untyped-def]
    """Re-resolve method-dependent learning rates after changing ``method``."""
    from fedhv.config.loader import resolve

    train = dataclasses.replace(cfg.train, lr_global=None, lr_local=None)
    return resolve(dataclasses.replace(cfg, train=train))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("setting", nargs="?", default="multimnist")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--methods", default="all", help="comma-separated, or all (every registered method)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--no-sequential", action="store_true", help="time only the batched engine in Part 1")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print the top N operators of one batched FedHV round")
    parser.add_argument("--profile-only", action="store_true", help="with --profile N: only the profile")
    args = parser.parse_args()
    tuned = tune_allocator()
    cfg = load_config(args.setting, args.overrides)
    data = federated_data(cfg)
    if args.profile_only:
        if not args.profile:
            parser.error("--profile-only needs --profile N (N > 0): the number of operators to print")
        profile_round(cfg, data, args.profile)
        return
    print(
        f"{cfg.setting}: {cfg.train.clients_per_round} clients x {cfg.train.local_steps} steps x batch "
        f"{cfg.train.batch_size}, reports over {cfg.partition.samples_per_client} samples/client; "
        f"{torch.get_num_threads()} threads, dtype {cfg.dtype}, precision {cfg.precision}, "
        f"engine_chunk {cfg.engine_chunk}, allocator tuned: {tuned}; {memory_note(cfg.device)} after loading; "
        f"load {os.getloadavg()[0]:.2f}"
    )
    # Part 1: engines.
    flop_cfg = load_config_like(dataclasses.replace(cfg, method="fedhv", engine="sequential"))
    model = new_model(flop_cfg, data, 0)
    engine = make_engine(flop_cfg, model, data, 0, "bench")
    clients = sample_clients(0, "bench", 0, data.num_clients, cfg.train.clients_per_round)
    theta = get_flat(model).clone()
    w = np.full((1, data.num_tasks), 1.0 / data.num_tasks)
    counter, rep_counter = FlopCounterMode(display=False), FlopCounterMode(display=False)
    # The counter sees aten.convolution, not the fast path's oneDNN calls or the compiled kernel.
    with plain_forward(), native.disabled():
        with rep_counter:
            engine.reports(theta, clients, 0, "all")
        with counter:
            engine.train(theta, clients, w, 0)
    rep_flops = rep_counter.get_total_flops()
    flops = counter.get_total_flops() + rep_flops
    peak = fp32_peak(measure(torch.device(cfg.device), (torch.float32,), (2048,)))
    print(f"\nFedHV round: {flops / 1e9:.2f} GFLOP (report pass {rep_flops / 1e9:.2f}); measured fp32 peak "
          f"{peak:.1f} GFLOP/s (perf/peak.py: 2048-matmul and 64-channel 3x3 convolution)")
    print(f"{'engine':<11} {'s/round':>8} {'reports':>8} {'training':>9} {'GFLOP/s':>8} {'rep GF/s':>8} "
          f"{'trn GF/s':>8} {'CPU s':>7} {'% peak':>6}")
    results: dict[str, float] = {}
    reports: dict[str, float] = {}
    engines = {}
    rows = [("batched", True)] if args.no_sequential else [("sequential", True), ("batched", True)]
    calls = sum(native.CALLS.values())
    for name, compiled in rows:
        with contextlib.nullcontext() if compiled else native.disabled():
            (total, _, _, cpu), eng, _ = time_rounds(cfg, data, "fedhv", name, args.rounds)
            rep = statistics.median(_timed(lambda e=eng: e.reports(theta, clients, 0, "all")) for _ in range(3))
        if name == "batched" and compiled and sum(native.CALLS.values()) > calls:
            rows.append(("batched", False))  # the same round on PyTorch's layers: before/after
        label = name if compiled else "batched-pt"
        if compiled:
            results[name], engines[name], reports[name] = total, eng, rep
        chunk = getattr(eng, "chunk_choice", None)
        print(f"{label:<11} {total:8.3f} {rep:8.3f} {total - rep:9.3f} {flops / total / 1e9:8.1f} "
              f"{rep_flops / rep / 1e9:8.1f} {(flops - rep_flops) / max(total - rep, 1e-9) / 1e9:8.1f} {cpu:7.2f} "
              f"{100 * flops / total / 1e9 / peak:6.1f}   "
              f"{memory_note(cfg.device)}" + (f"; {chunk.describe()}" if chunk else ""))
    evaluation = inference_passes(cfg, data, engines["batched"], theta, clients, rep_flops)
    if len(rows) > len(results):
        print("batched-pt: the batched engine with the compiled kernels (fedhv.models.native) off: "
              "PyTorch's own convolution, pooling, bias and ReLU")
    if "sequential" in results:
        print(f"batched / sequential: {results['sequential'] / results['batched']:.2f}x faster "
              f"(FLOP utilisation {results['sequential'] / results['batched']:.2f}x)")
    if cfg.precision != "fp32":
        fp32 = dataclasses.replace(cfg, precision="fp32")
        (total, _, _, cpu32), _, _ = time_rounds(fp32, data, "fedhv", "batched", args.rounds)
        print(f"{'batched fp32':<11} {total:8.3f} {'':8} {'':9} {flops / total / 1e9:8.1f} {cpu32:7.2f}   "
              f"{memory_note(cfg.device)}")
        print(f"{cfg.precision} / fp32 round time (batched FedHV): {results['batched'] / total:.2f} wall, "
              f"{cpu / cpu32:.2f} CPU")
    if args.profile:
        profile_round(cfg, data, args.profile)
    # Part 2: methods.
    from fedhv.registry import METHODS

    methods = ["uniform"] + [m for m in METHODS.names() if m != "uniform"] if args.methods == "all" \
        else args.methods.split(",")
    print(f"\n{'method':<20} {'s/round':>8} {'client':>8} {'server':>8} {'vs uniform':>10} {'CPU s':>7} "
          f"{'rule ms':>9} {'rule %':>7}")
    base = None
    per_round: dict[str, float] = {}
    for method in methods:
        (total, client, server, cpu), _, alg = time_rounds(cfg, data, method, "batched", args.rounds)
        base = base or total
        per_round[method] = total
        rule = rule_seconds(method, alg)
        rule_text = f"{1e3 * rule:9.3f} {100 * rule / total:6.3f}%" if rule is not None else f"{'-':>9} {'-':>7}"
        print(f"{method:<20} {total:8.3f} {client:8.3f} {server:8.3f} {total / base:10.2f} {cpu:7.2f} {rule_text}   "
              f"{memory_note(cfg.device)}")
    if "uniform" in per_round:
        print_end_to_end(cfg, per_round, reports["batched"], evaluation)
    print(f"\nload (1 min) at the end: {os.getloadavg()[0]:.2f}")


def evaluations_per_run(cfg) -> int:  # type: ignore[no-untyped-def]
    """Test evaluations of a run: the rounds the runner evaluates after (:func:`~fedhv.experiment.runner.eval_due`)."""
    return sum(eval_due(r, cfg) for r in range(1, cfg.rounds + 1))


def end_to_end(cfg, per_round: dict[str, float], report_s: float, eval_s: float) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Projected seconds of a whole run of each method (the paper's Table 13 accounting).

    ``R`` adaptive rounds of the method, plus ``E`` test evaluations
    (:func:`evaluations_per_run`) of ``eval_s`` each; FedHV with ``reference = "calibrate"``
    adds its calibration, ``R_cal * |seeds|`` uniform-weight rounds with reports
    (``per_round["uniform"] + report_s`` each: a Uniform round plus the report pass)::

        T_method = R * t_method + E * t_eval  [+ R_cal * |seeds| * (t_uniform + t_report)]
    """
    evals = evaluations_per_run(cfg) * eval_s
    out = {m: cfg.rounds * t + evals for m, t in per_round.items()}
    if "fedhv" in out and cfg.fedhv.reference == "calibrate":
        out["fedhv"] += cfg.calibration.rounds * len(cfg.calibration.seeds) * (per_round["uniform"] + report_s)
    return out


def print_end_to_end(cfg, per_round: dict[str, float], report_s: float, eval_s: float) -> None:  # type: ignore[no-untyped-def]
    """Print :func:`end_to_end` and each method's ratio to FedHV."""
    total = end_to_end(cfg, per_round, report_s, eval_s)
    cal = (f"FedHV with its {cfg.calibration.rounds * len(cfg.calibration.seeds)}-round calibration"
           if cfg.fedhv.reference == "calibrate" else "no calibration (fixed reference)")
    print(f"\nprojected run of {cfg.rounds} rounds + {evaluations_per_run(cfg)} test evaluations of {eval_s:.3f} s "
          f"({cal}):")
    for method, t in total.items():
        ratio = f"{t / total['fedhv']:8.2f}" if "fedhv" in total else ""
        print(f"{method:<20} {t:10.1f} s {ratio}")


def inference_passes(cfg, data, engine, theta, clients, rep_flops: int, reps: int = 5) -> float:  # type: ignore[no-untyped-def]
    """Batched report pass and test evaluation: plain ``model(x)`` vs the fast path.

    The two paths alternate ``reps`` times in this process (median wall and CPU seconds
    of each), so a change of the machine's load hits both. Evaluations per run: every
    ``eval.test_period`` rounds plus the final one (``eval.final``). Returns the fast
    path's median seconds of one test evaluation.
    """
    x, y = data.eval_sets["test"]
    evaluator = new_model(cfg, data, 0)
    set_flat(evaluator, theta)
    calls, rounds = evaluations_per_run(cfg), cfg.rounds
    eval_s = 0.0
    passes = {
        f"reports, batched ({int(sum(len(engine.report_indices(int(c), 0, 'all')) for c in clients)):,} samples)":
            (lambda: engine.reports(theta, clients, 0, "all"), rep_flops),
        f"test evaluation ({len(x):,} samples)":
            (lambda: evaluate_tasks(evaluator, x, y, cfg.eval.batch_size, data.objective),
             rep_flops * len(x) / max(1, sum(len(engine.report_indices(int(c), 0, "all")) for c in clients))),
    }
    print(f"\n{'pass (plain model(x) vs fast)':<38} {'plain s':>8} {'fast s':>8} {'plain CPU':>9} {'fast CPU':>9} "
          f"{'speed-up':>8} {'GF/s fast':>9}")
    for label, (fn, flop) in passes.items():
        fn()
        plain, fast = [], []
        for _ in range(reps):
            with plain_forward(), native.disabled():
                plain.append(_timed_cpu(fn))
            fast.append(_timed_cpu(fn))
        pw, pc = (statistics.median(t[i] for t in plain) for i in range(2))
        fw, fc = (statistics.median(t[i] for t in fast) for i in range(2))
        print(f"{label:<38} {pw:8.3f} {fw:8.3f} {pc:9.3f} {fc:9.3f} {pw / fw:8.2f} {flop / fw / 1e9:9.1f}")
        if label.startswith("test"):
            eval_s = fw
            print(f"{f'  per run ({calls} evaluations of {rounds} rounds)':<38} {pw * calls:8.2f} {fw * calls:8.2f} "
                  f"{pc * calls:9.2f} {fc * calls:9.2f}")
    return eval_s


def profile_round(cfg, data, top: int) -> None:  # type: ignore[no-untyped-def]
    """Top ``top`` operators by self CPU time of one batched FedHV round (after a warm-up round)."""
    from torch.profiler import ProfilerActivity, profile

    run_cfg = load_config_like(dataclasses.replace(cfg, method="fedhv", engine="batched").with_section(
        "fedhv", dataclasses.replace(cfg.section("fedhv"), reference="paper")))
    alg = build_method(run_cfg, data).algorithm
    model = new_model(run_cfg, data, 0)
    engine = make_engine(run_cfg, model, data, 0, "bench")
    theta, state = get_flat(model).clone(), alg.init_state(data.num_tasks)
    clients = sample_clients(0, "bench", 0, data.num_clients, cfg.train.clients_per_round)
    alg.round(state, theta, SimFederation(engine, clients, 0))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cfg.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        alg.round(state, theta, SimFederation(engine, clients, 1))
    print(f"\nprofile of one batched FedHV round (top {top} by self CPU time):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=40))


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _timed_cpu(fn) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(wall, process CPU) seconds of ``fn()``."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


if __name__ == "__main__":
    main()
