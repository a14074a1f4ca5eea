"""Kill ``fedhv flower local`` at three moments with three signals; check that no process is left
and that ``--resume`` ends bit-identical to an uninterrupted run.

    python scripts/flower_kills.py [--out DIR] [--signals KILL,TERM,INT] [--moments start,calibration,rounds]

Each case starts ``fedhv flower local multimnist`` (2 SuperNodes, float64, small data, FedHV:
a calibration and then the rounds), sends the signal to the launcher only (by PID) at the
moment named, and then checks, by PID, that every process seen in the deployment (found by
walking ``/proc`` parent links while it ran) and every process carrying its
``FEDHV_DEPLOYMENT`` mark is gone within 15 s. It then runs ``fedhv flower local --resume``
(or the first command again when the kill came before the ServerApp made the run directory)
and compares ``rounds.jsonl`` (clients, reports, weights, losses), ``metrics.jsonl`` and the
final model with a reference run, bit for bit. Prints one line per case and a summary; exits
1 when a case fails. Linux only (``/proc``). About 1-2 minutes per case on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from fedhv.flower.lifetime import descendants, mark_of

SETS = ["partition.clients=2", "partition.samples_per_client=64", "train.clients_per_round=2", "train.batch_size=16",
        "train.local_steps=3", "calibration.rounds=3", "data.max_test_samples=300", "eval.test_period=2",
        'dtype="float64"']
ROUNDS = 8
CLI = [sys.executable, "-m", "fedhv.cli"]


def survivors(seen: set[int], token: str | None, wait_s: float = 15.0) -> list[int]:
    from fedhv.flower.lifetime import alive, marked

    deadline = time.monotonic() + wait_s
    while True:
        left = sorted({p for p in seen if alive(p)} | set(marked(token) if token else []))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def lines(path: Path) -> int:
    try:
        return sum(1 for line in path.read_bytes().splitlines() if line.strip())
    except OSError:
        return 0


def moment_reached(moment: str, seen: set[int], run: Path) -> bool:
    if moment == "start":  # SuperLink and both SuperNodes up, no run yet
        return len(seen) >= 4 and not (run / "config.toml").exists()
    if moment == "calibration":  # the ServerApp has claimed the run directory, no round yet
        return (run / "config.toml").exists() and lines(run / "rounds.jsonl") == 0
    return lines(run / "rounds.jsonl") >= ROUNDS // 2


def launch(run: Path, resume: bool) -> subprocess.Popen[str]:
    cmd = [*CLI, "flower", "local", "--nodes", "2", "--quiet"]
    if resume:
        cmd += ["--resume", str(run)]
    else:
        cmd += ["multimnist", "--rounds", str(ROUNDS), *[x for s in SETS for x in ("--set", s)], "--out", str(run)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def records(run: Path, name: str) -> list[dict]:
    keep = []
    for line in (run / name).read_text().splitlines():
        rec = json.loads(line)
        keep.append({k: v for k, v in rec.items() if "time" not in k and "second" not in k and k != "wall_clock_s"})
    return keep


def same_run(a: Path, b: Path) -> str:
    """``""`` when ``a`` and ``b`` hold the same rounds, metrics and final model bit for bit."""
    for name in ("rounds.jsonl", "metrics.jsonl"):
        if records(a, name) != records(b, name):
            return f"{name} differs"
    ta = torch.load(a / "model.pt", weights_only=True)["state_dict"]
    tb = torch.load(b / "model.pt", weights_only=True)["state_dict"]
    if ta.keys() != tb.keys() or not all(torch.equal(ta[k], tb[k]) for k in ta):
        return "model.pt differs"
    return ""


def case(base: Path, reference: Path, sig: signal.Signals, moment: str) -> tuple[bool, str]:
    run = base / f"{sig.name}-{moment}"
    proc = launch(run, resume=False)
    seen: set[int] = set()
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= descendants(proc.pid)
        if moment_reached(moment, seen, run):
            break
        time.sleep(0.05)
    if proc.poll() is not None:
        return False, f"the run ended (status {proc.returncode}) before the moment {moment}"
    seen |= descendants(proc.pid)
    token = mark_of(seen)
    at = lines(run / "rounds.jsonl")
    proc.send_signal(sig)
    proc.communicate(timeout=120)
    left = survivors(seen, token)
    if left:
        return False, f"exit {proc.returncode}; processes left: {left}"
    again = launch(run, resume=(run / "config.toml").exists())
    out = again.communicate(timeout=900)[0]
    if again.returncode != 0:
        return False, f"exit {proc.returncode}; the second command failed ({again.returncode}): {out[-400:]}"
    diff = same_run(run, reference)
    if diff:
        return False, f"exit {proc.returncode} after {at} rounds, {len(seen)} processes; resumed but {diff}"
    return True, f"exit {proc.returncode} after {at} rounds, {len(seen)} processes gone; resume bit-identical"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for the runs (a temporary one, removed, by default)")
    parser.add_argument("--signals", default="KILL,TERM,INT")
    parser.add_argument("--moments", default="start,calibration,rounds")
    args = parser.parse_args()
    base = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="fedhv-kills-"))
    base.mkdir(parents=True, exist_ok=True)
    reference = base / "reference"
    if not (reference / "summary.json").exists():
        ref = launch(reference, resume=False)
        out = ref.communicate(timeout=900)[0]
        if ref.returncode != 0:
            print(out)
            return 1
    failed = 0
    for name in args.signals.split(","):
        for moment in args.moments.split(","):
            t0 = time.monotonic()
            ok, what = case(base, reference, signal.Signals[f"SIG{name}"], moment)
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} SIG{name:<4} at {moment:<11} {what} ({time.monotonic() - t0:.0f} s)",
                  flush=True)
    if args.out is None and not failed:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{failed} of {len(args.signals.split(',')) * len(args.moments.split(','))} cases failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
