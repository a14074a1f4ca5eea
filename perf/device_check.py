"""Device check: CPU/GPU equivalence, cross-device resume and GPU round timings -> one JSON.

Usage (on a GPU machine; fedhv on ``PYTHONPATH=src`` is enough)::

    PYTHONPATH=src python perf/device_check.py --data-dir DATA --out device_check.json
    PYTHONPATH=src python perf/device_check.py --device cpu --quick --data-dir DATA --out smoke.json

``DATA`` must hold the MNIST IDX files (``mnist/`` or ``MNIST/raw/``); nothing is downloaded.

Parts (each time-boxed; a failure is recorded in the JSON and the script goes on; the
JSON is rewritten after every part):

1. ``equivalence``: 3 rounds of each method (batched engine; FedHV also sequential) on
   MultiMNIST in float64, once on the CPU and once on the device, from the same seed:
   max |theta_cpu - theta_dev|, whether the sampled clients agree, max difference of
   the task weights (and reports); passes when theta agrees within 1e-8.
2. ``resume``: FedHV with its calibration, interrupted in its last round on one device,
   resumed from the checkpoint on the other (both directions), compared with an
   uninterrupted CPU run (final model, evaluations, calibration reference).
3. ``timing``: seconds per round on the device (median of ``--rounds`` rounds after one
   warm-up, ``torch.cuda.synchronize`` around each), client/server split, one test
   evaluation, peak device memory (``torch.cuda.max_memory_allocated``), for MultiMNIST
   (real data), CIFAR10-MNIST and CelebA5 (synthetic uint8 images and labels of the
   full-size shapes through the real data-to-device path, models and engines:
   ``"data": "synthetic"``), float32, the presets' full sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhv import safe_io
from fedhv.config import load_config
from fedhv.config.schema import RunConfig
from fedhv.data.benchmarks import BUILDERS, Benchmark
from fedhv.data.federated import FederatedData
from fedhv.data.partition import dirichlet_partition
from fedhv.devices import check_device, synchronize
from fedhv.errors import FedHVError
from fedhv.experiment.loop import RoundRecord, run_rounds
from fedhv.experiment.method_setup import build_method
from fedhv.experiment.setup import DTYPES, federated_data, make_engine, new_model, sample_clients
from fedhv.metrics.evaluate import evaluate_tasks
from fedhv.models import get_flat, set_flat
from fedhv.objectives import MultiLabel
from fedhv.sim.federation import SimFederation

METHODS = ("uniform", "fedhv", "fsmgda", "fedcmoo")
#: Shrinks MultiMNIST to a seconds-long CPU smoke test (``--quick``).
QUICK = ["partition.clients=6", "partition.samples_per_client=64", "train.clients_per_round=4",
         "train.batch_size=16", "train.local_steps=3", "calibration.rounds=2", "data.max_test_samples=300"]
#: Full-size split sizes (train after the 20 % validation split, val, test) and image shape.
SYNTHETIC = {
    "cifar10-mnist": {"preset": "cifar10-mnist-a", "splits": (40000, 10000, 10000), "shape": (32, 32, 3)},
    "celeba5": {"preset": "celeba5-a", "splits": (162770, 19867, 19962), "shape": (32, 32, 3)},
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class PartTimeout(Exception):
    """A part ran past its time box."""


@contextmanager
def time_box(seconds: float) -> Iterator[None]:
    """Raise :class:`PartTimeout` in the main thread after ``seconds`` (SIGALRM)."""
    def handler(signum: int, frame: Any) -> None:
        raise PartTimeout(f"time box of {seconds:.0f} s exceeded")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1.0))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Report:
    """The JSON document, rewritten (atomically) after every part."""

    def __init__(self, path: Path, budget_s: float, box_scale: float = 1.0) -> None:
        self.path = path
        self.box_scale = box_scale
        self.start = time.perf_counter()
        self.budget_s = budget_s
        self.doc: dict[str, Any] = {"complete": False}

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def write(self) -> None:
        self.doc["elapsed_s"] = round(time.perf_counter() - self.start, 2)
        safe_io.write_json(self.path, self.doc, default=str)  # atomic: a killed check leaves the last complete doc

    def run(self, section: str, name: str, seconds: float, fn: Callable[[], dict[str, Any]]) -> None:
        """Run one time-boxed item into ``doc[section][name]``; never raises."""
        box = min(seconds * self.box_scale, self.left())
        entry: dict[str, Any]
        if box < 5:
            entry = {"ok": False, "skipped": f"time budget left {self.left():.0f} s"}
        else:
            log(f"{section}/{name}: start (time box {box:.0f} s)")
            t0 = time.perf_counter()
            try:
                with time_box(box):
                    entry = fn()
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                entry = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc()[-2500:]}
            entry["seconds"] = round(time.perf_counter() - t0, 2)
        self.doc.setdefault(section, {})[name] = entry
        log(f"{section}/{name}: {json.dumps({k: v for k, v in entry.items() if k != 'traceback'}, default=str)[:600]}")
        self.write()


def environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__, "numpy": np.__version__, "python": sys.version.split()[0],
        "platform": platform.platform(), "cpu_threads": torch.get_num_threads(), "device": device,
        "cuda_available": torch.cuda.is_available(), "cuda_build": torch.version.cuda,
    }
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(torch.device(device))
        env.update(device_name=props.name, device_memory_gib=round(props.total_memory / 2**30, 1),
                   cudnn=torch.backends.cudnn.version(), tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                   tf32_cudnn=torch.backends.cudnn.allow_tf32)
    try:  # the device validation message for a GPU index that does not exist
        check_device("cuda:99")
        env["cuda_99_check"] = "accepted"
    except FedHVError as exc:
        env["cuda_99_check"] = str(exc)
    return env


# --------------------------------------------------------------------------- part 1


def _rounds(cfg: RunConfig, rounds: int) -> tuple[torch.Tensor, list[RoundRecord]]:
    data = federated_data(cfg)
    model = new_model(cfg, data, cfg.seed)
    engine = make_engine(cfg, model, data, cfg.seed, "train")
    alg = build_method(cfg, data).algorithm
    records: list[RoundRecord] = []
    theta, _ = run_rounds(alg, engine, data, get_flat(model).clone(), rounds, cfg.train.clients_per_round,
                          cfg.seed, "train", lambda rec, th, st: records.append(rec))
    return theta.detach().cpu(), records


def _max_diff(a: list[Any], b: list[Any]) -> float | None:
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    if not pairs:
        return None
    return float(max(np.max(np.abs(np.asarray(x, dtype=float) - np.asarray(y, dtype=float))) for x, y in pairs))


def equivalence(base: list[str], device: str, method: str, engine: str, rounds: int) -> dict[str, Any]:
    over = [*base, f'method="{method}"', f'engine="{engine}"', 'dtype="float64"', 'fedhv.reference="paper"']
    out: dict[str, Any] = {}
    results = {}
    for label, dev in (("cpu", "cpu"), ("device", device)):
        cfg = load_config("multimnist", [*over, f'device="{dev}"'])
        t0 = time.perf_counter()
        results[label] = _rounds(cfg, rounds)
        out[f"seconds_{label}"] = round(time.perf_counter() - t0, 2)
    (tc, rc), (td, rd) = results["cpu"], results["device"]
    diff = float((tc - td).abs().max())
    out.update(
        rounds=rounds, theta_max_abs_diff=diff, theta_max_abs=float(tc.abs().max()),
        clients_agree=[r.clients for r in rc] == [r.clients for r in rd],
        weights_max_abs_diff=_max_diff([r.log.get("weights") for r in rc], [r.log.get("weights") for r in rd]),
        reports_max_abs_diff=_max_diff([r.log.get("report") for r in rc], [r.log.get("report") for r in rd]),
    )
    out["ok"] = bool(diff <= 1e-8 and out["clients_agree"])
    return out


# --------------------------------------------------------------------------- part 2


class _Stop(Exception):
    """Interrupts a run inside a given training round."""


@contextmanager
def interrupt_in_round(round_idx: int) -> Iterator[None]:
    original = SimFederation.exchange

    def exchange(self: SimFederation, theta: torch.Tensor, request: Any) -> Any:
        if self.engine.stream == "train" and self.round_idx == round_idx:
            raise _Stop()
        return original(self, theta, request)

    SimFederation.exchange = exchange  # type: ignore[method-assign]
    try:
        yield
    finally:
        SimFederation.exchange = original  # type: ignore[method-assign]


def _run_outputs(run: Path) -> dict[str, Any]:
    state = torch.load(run / "model.pt", map_location="cpu")["state_dict"]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    cal = json.loads((run / "calibration.json").read_text())
    return {"theta": torch.cat([v.reshape(-1) for v in state.values()]),
            "losses": [m["task_loss"] for m in metrics], "reference": cal["reference"]}


def resume_check(base: list[str], device: str, rounds: int, root: Path) -> dict[str, Any]:
    from fedhv.experiment import resume_experiment, run_experiment

    over = [*base, 'method="fedhv"', 'dtype="float64"', f"rounds={rounds}", "eval.test_period=2",
            "calibration.rounds=2"]
    run_experiment(load_config("multimnist", [*over, 'device="cpu"']), root / "cpu", progress=False)
    ref = _run_outputs(root / "cpu")
    out: dict[str, Any] = {"rounds": rounds, "interrupted_in_round": rounds}
    ok = True
    for i, (first, second) in enumerate(((device, "cpu"), ("cpu", device))):
        name = f"{torch.device(first).type}_to_{torch.device(second).type}"
        run = root / f"{i}-{name}"
        try:
            with interrupt_in_round(rounds - 1):
                run_experiment(load_config("multimnist", [*over, f'device="{first}"']), run, progress=False)
            raise RuntimeError("the run was not interrupted")
        except _Stop:
            pass
        resume_experiment(run, progress=False, device=second)
        got = _run_outputs(run)
        item = {
            "theta_max_abs_diff": float((got["theta"] - ref["theta"]).abs().max()),
            "eval_loss_max_abs_diff": _max_diff(got["losses"], ref["losses"]),
            "reference_max_abs_diff": _max_diff([got["reference"]], [ref["reference"]]),
            "evaluations": len(got["losses"]),
            "resumes": [json.loads(x) for x in (run / "resumes.jsonl").read_text().splitlines() if x.strip()],
        }
        item["ok"] = bool(item["theta_max_abs_diff"] <= 1e-8 and len(got["losses"]) == len(ref["losses"]))
        ok = ok and item["ok"]
        out[name] = item
    out["ok"] = ok
    return out


# --------------------------------------------------------------------------- part 3


def synthetic_data(name: str, cfg: RunConfig, scale: float) -> FederatedData:
    """Random uint8 images / labels of the benchmark's full-size shapes, through the real
    partition and data-to-device path."""
    spec, info = BUILDERS[name], SYNTHETIC[name]
    rng = np.random.default_rng(0)
    n_train, n_val, n_test = (max(64, int(n * scale)) for n in info["splits"])

    def images(n: int) -> np.ndarray:
        return rng.integers(0, 256, size=(n, *info["shape"]), dtype=np.uint8)

    def labels(n: int) -> np.ndarray:
        if isinstance(spec.objective, MultiLabel):
            return (rng.random((n, 40)) < 0.4).astype(np.int64)
        return rng.integers(0, 10, size=(n, len(spec.num_classes)), dtype=np.int64)

    bench = Benchmark(name, spec.task_names, spec.num_classes, images(n_train), labels(n_train), images(n_val),
                      labels(n_val), images(n_test), labels(n_test), spec.mean, spec.std, spec.augment,
                      spec.objective)
    p = cfg.partition
    parts = dirichlet_partition(bench.strata(p.strata), p.clients, p.samples_per_client, p.alpha, p.seed)
    return FederatedData.from_benchmark(bench, parts, dtype=DTYPES[cfg.dtype], device=cfg.device,
                                        augment=cfg.data.augment)


def time_method(cfg: RunConfig, data: FederatedData, rounds: int) -> dict[str, Any]:
    dev = torch.device(cfg.device)
    cuda = dev.type == "cuda"
    if cuda:
        synchronize(dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        base_mem = torch.cuda.memory_allocated(dev)
    alg = build_method(cfg, data).algorithm
    model = new_model(cfg, data, cfg.seed)
    engine = make_engine(cfg, model, data, cfg.seed, "bench")
    theta, state = get_flat(model).clone(), alg.init_state(data.num_tasks)
    samples = []
    for r in range(rounds + 1):
        fed = SimFederation(engine, sample_clients(cfg.seed, "bench", r, data.num_clients,
                                                   cfg.train.clients_per_round), r)
        synchronize(dev)
        t0 = time.perf_counter()
        res = alg.round(state, theta, fed)
        synchronize(dev)
        total = time.perf_counter() - t0
        theta, state = res.theta, res.state
        if r:  # round 0 is the warm-up (CUDA context, cuDNN plans, allocator)
            samples.append((total, fed.client_seconds))
    evaluator = new_model(cfg, data, cfg.seed)
    set_flat(evaluator, theta)
    synchronize(dev)
    t0 = time.perf_counter()
    acc, _ = evaluate_tasks(evaluator, *data.eval_sets["test"], cfg.eval.batch_size, data.objective)
    synchronize(dev)
    out: dict[str, Any] = {
        "ok": True, "rounds_timed": rounds, "warmup_rounds": 1,
        "seconds_per_round": statistics.median(s[0] for s in samples),
        "client_seconds": statistics.median(s[1] for s in samples),
        "server_seconds": statistics.median(s[0] - s[1] for s in samples),
        "all_rounds_s": [round(s[0], 4) for s in samples],
        "eval_seconds": time.perf_counter() - t0, "eval_samples": len(data.eval_sets["test"][0]),
        "params": int(theta.numel()), "mean_test_acc": float(np.mean(acc)),
        "clients_per_round": cfg.train.clients_per_round, "local_steps": cfg.train.local_steps,
        "batch_size": cfg.train.batch_size, "dtype": cfg.dtype,
    }
    if cuda:
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
        out["memory_before_gib"] = base_mem / 2**30
    return out


def timing_setting(report: Report, setting: str, device: str, base: list[str], methods: tuple[str, ...],
                   rounds: int, scale: float, box: float) -> None:
    if setting == "multimnist":
        preset, m = "multimnist", 2
    else:
        preset, m = SYNTHETIC[setting]["preset"], len(BUILDERS[setting].task_names)
    over = [*base, f'device="{device}"', f"fedhv.reference=[{', '.join(['10.0'] * m)}]"]
    holder: dict[str, FederatedData] = {}

    def build() -> dict[str, Any]:
        cfg = load_config(preset, over)
        t0 = time.perf_counter()
        holder["data"] = federated_data(cfg) if setting == "multimnist" else synthetic_data(setting, cfg, scale)
        d = holder["data"]
        return {"ok": True, "data": "real" if setting == "multimnist" else "synthetic", "preset": preset,
                "train_shape": list(d.train_x.shape), "test_samples": len(d.eval_sets["test"][0]),
                "clients": d.num_clients, "samples_per_client": int(d.parts.shape[1]),
                "build_seconds": time.perf_counter() - t0}

    report.run("timing", f"{setting}/data", box, build)
    if "data" not in holder:
        return
    for method in methods:
        cfg = load_config(preset, [*over, f'method="{method}"'])
        report.run("timing", f"{setting}/{method}", box, lambda cfg=cfg: time_method(cfg, holder["data"], rounds))
    holder.clear()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="device to check against the CPU (default cuda)")
    parser.add_argument("--data-dir", required=True, help="folder with the MNIST IDX files")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a CPU smoke test of the script")
    parser.add_argument("--budget-s", type=float, default=330.0, help="total time budget (default 330 s)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per setting and method (default 3)")
    parser.add_argument("--parts", default="equivalence,resume,timing", help="comma-separated parts to run")
    parser.add_argument("--box-scale", type=float, default=1.0, help="multiply every part's time box (slow machines)")
    parser.add_argument("--equiv-set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra config overrides of the equivalence runs (default: the full preset)")
    args = parser.parse_args()
    os.environ.setdefault("FEDHV_CACHE", tempfile.mkdtemp(prefix="fedhv-cache-"))
    report = Report(Path(args.out), args.budget_s, args.box_scale)
    parts = set(args.parts.split(","))
    base = [f'data.root="{Path(args.data_dir).resolve()}"', "data.download=false"]
    mm_base = [*base, *QUICK] if args.quick else [*base, "data.max_test_samples=2000"]
    syn_base = [*base, *QUICK[:5]] if args.quick else base
    equiv_base = [*mm_base, *args.equiv_set]
    resume_base = [*base, *QUICK]  # portability, not speed: small sizes
    try:
        check_device(args.device)
        report.doc["environment"] = environment(args.device)
    except Exception as exc:  # noqa: BLE001
        report.doc["environment"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        report.write()
        log(f"device {args.device!r} unusable: {exc}")
        return 1
    report.doc.update(quick=args.quick, budget_s=args.budget_s, tolerance=1e-8)
    report.write()
    log(f"environment: {json.dumps(report.doc['environment'])}")
    equiv_rounds = 2 if args.quick else 3
    if "equivalence" in parts:  # the batched engine, all four methods
        for method in METHODS:
            report.run("equivalence", f"{method}/batched", 40,
                       lambda m=method: equivalence(equiv_base, args.device, m, "batched", equiv_rounds))
    if "resume" in parts:
        with tempfile.TemporaryDirectory(prefix="fedhv-resume-") as tmp:
            report.run("resume", "fedhv", 45, lambda: resume_check(resume_base, args.device, 4, Path(tmp)))
    if "timing" in parts:
        rounds = 1 if args.quick else args.rounds
        scale = 0.01 if args.quick else 1.0
        synthetic_methods = ("fedhv",) if args.quick else METHODS
        timing_setting(report, "multimnist", args.device, mm_base, METHODS, rounds, scale, 30)
        timing_setting(report, "cifar10-mnist", args.device, syn_base, synthetic_methods, rounds, scale, 30)
        timing_setting(report, "celeba5", args.device, syn_base, synthetic_methods, max(1, rounds - 1), scale, 40)
    if "equivalence" in parts:  # the sequential reference engine last: the slowest item
        report.run("equivalence", "fedhv/sequential", 60,
                   lambda: equivalence(equiv_base, args.device, "fedhv", "sequential", equiv_rounds))
    items = [e for sec in ("equivalence", "resume", "timing") for e in report.doc.get(sec, {}).values()]
    report.doc["all_ok"] = all(e.get("ok") for e in items)
    report.doc["complete"] = True
    report.write()
    log(f"done in {report.doc['elapsed_s']} s; all ok: {report.doc['all_ok']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
