"""The values SecAgg+ would mask, per round, against ``flower.clipping_range`` (issue 15, item 2).

Usage::

    FEDHV_DATA=../shared/data python perf/secure_clip_range.py SETTING [SETTING ...]
        [--methods fedhv,uniform,fsmgda] [--rounds R] [--set k=v ...] [--clip C] [--out FILE]
        [--synthetic-celeba DIR [--synthetic-images N]]

In secure mode (``flower.secure_aggregation = true``) every client's reply is packed into one
vector (:func:`fedhv.flower.secure_client.pack`) and flwr's ``secaggplus_mod`` clips each of its
values to ``[-c, c]`` before quantizing it with step ``delta = 2c / 2**22``:

- the client's update ``Delta theta_k = theta_k^K - theta^t`` as sent, ``[T, d]`` (the
  difference after all ``K`` local steps, not per-step values): ``T = 1`` for FedHV and
  Uniform, ``T = m`` per-task trajectories for FSMGDA;
- its report ``F_k`` (its ``m`` task losses at ``theta^t``), for FedHV and the Uniform
  calibration.

The simulator's engines compute exactly these tensors (the Flower nodes run the same engine
code, ``tests/e2e/flower/test_flower.py``), so no Flower deployment is needed: the script runs the
configured method through :func:`fedhv.experiment.loop.run_rounds` with a
:class:`RecordingFederation` (a :class:`~fedhv.sim.federation.SimFederation` that notes, for
every stage, what its clients return) and reports per round

    max_update = max_{k, t, j} |Delta theta_{k, t, j}|,     max_report = max_{k, i} |F_{k, i}|,
    clipped = #{values with |x| > c},                       rms_update = sqrt(mean_{k, t, j} Delta^2),

the margins ``c - max`` and the headroom ratios ``c / max``. ``rms_update`` against ``delta``
tells how coarse the quantization is for a typical coordinate. FedHV with
``fedhv.reference = "calibrate"`` also measures its calibration rounds (stream
``"calibration"``: Uniform with reports) when the calibration uses the training partition;
otherwise set ``fedhv.reference`` (e.g. ``paper``). ``--synthetic-celeba DIR`` writes a
synthetic CelebA folder (random 178x218 JPEGs and attributes in the real layout,
``tests/support/celeba_fixture.py``) under ``DIR`` unless there is one, and points ``data.root`` at it.
``--out`` is rewritten after every round (the method in progress marked ``"partial": true``), so a
measurement stopped early keeps its rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhv.algorithms.base import Replies, Request
from fedhv.config import load_config
from fedhv.config.flower import QUANTIZATION_RANGE
from fedhv.config.schema import RunConfig
from fedhv.data.federated import FederatedData
from fedhv.experiment.loop import run_rounds
from fedhv.experiment.method_setup import build_method
from fedhv.experiment.setup import federated_data, make_engine, new_model
from fedhv.models import get_flat
from fedhv.sim.engine import Engine
from fedhv.sim.federation import SimFederation

REPO = Path(__file__).resolve().parents[1]


@dataclass
class StageValues:
    """What the clients of one stage returned, reduced to the numbers clipping depends on.

    Attributes
    ----------
    max_update, max_report : float
        ``max |x|`` over all clients' update coordinates / report values (``nan``: none sent).
    clipped : int
        Values with ``|x| > c`` (what ``secure_clipped`` in ``rounds.jsonl`` would count).
    sum_sq, count : float, int
        ``sum x^2`` and the number of update coordinates (for the RMS).
    mean_report : list of float or None
        ``mean_k F_k`` (what the server averages).
    clients, rows : int
        Clients that replied and trajectories ``T`` per client.
    """

    max_update: float = math.nan
    max_report: float = math.nan
    clipped: int = 0
    sum_sq: float = 0.0
    count: int = 0
    clients: int = 0
    rows: int = 0
    mean_report: list[float] | None = None


def stage_values(replies: Replies, clipping_range: float) -> StageValues:
    """Reduce one stage's stacked replies (``deltas [k, T, d]``, ``reports [k, m]``).

    Client by client, so a large model needs one client's ``[T, d]`` of temporary memory.
    """
    out = StageValues(clients=len(replies.clients))
    if replies.deltas is not None:
        out.rows = int(replies.deltas.shape[1])
        top = 0.0
        for row in replies.deltas.detach():
            a = row.abs()
            top = max(top, float(a.max()))
            out.clipped += int((a > clipping_range).sum())
            out.sum_sq += float(torch.linalg.vector_norm(row, dtype=torch.float64) ** 2)
            out.count += row.numel()
        out.max_update = top
    if replies.reports is not None:
        r = replies.reports.detach().abs()
        out.max_report = float(r.max())
        out.mean_report = replies.reports.detach().double().mean(0).cpu().tolist()
        out.clipped += int((r > clipping_range).sum())
    return out


class RecordingFederation(SimFederation):
    """A :class:`SimFederation` that appends :func:`stage_values` of every stage to ``sink``."""

    def __init__(self, engine: Engine, clients: np.ndarray, round_idx: int, clipping_range: float,
                 sink: list[StageValues], max_update_norm: float = 0.0) -> None:
        super().__init__(engine, clients, round_idx, None, max_update_norm)
        self.clipping_range = clipping_range
        self.sink = sink

    def exchange(self, theta: torch.Tensor, request: Request) -> Replies:
        replies = super().exchange(theta, request)
        self.sink.append(stage_values(replies, self.clipping_range))
        return replies


class RecordingFactory:
    """``federation_factory`` for :func:`run_rounds` (training and FedHV's calibration alike).

    Builds one engine per ``(seed, stream)`` as the run builds it (:func:`make_engine` on a
    fresh model) and a :class:`RecordingFederation` per round; when the next round starts
    (and at :meth:`finish`) the finished round becomes one :func:`round_entry` in ``rounds``.
    """

    def __init__(self, cfg: RunConfig, data: FederatedData, clipping_range: float, echo: bool = False,
                 on_entry: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        self.cfg, self.data, self.clipping_range, self.echo = cfg, data, clipping_range, echo
        self.on_entry = on_entry
        self.engines: dict[tuple[int, str], Engine] = {}
        self.rounds: list[dict[str, Any]] = []
        self._open: tuple[str, int, int, list[StageValues], float] | None = None

    def engine(self, seed: int, stream: str) -> Engine:
        key = (seed, stream)
        if key not in self.engines:
            self.engines[key] = make_engine(self.cfg, new_model(self.cfg, self.data, seed), self.data, seed, stream)
        return self.engines[key]

    def __call__(self, clients: np.ndarray, round_idx: int, seed: int, stream: str) -> RecordingFederation:
        self.finish()
        stages: list[StageValues] = []
        self._open = (stream, seed, round_idx, stages, time.perf_counter())
        return RecordingFederation(self.engine(seed, stream), clients, round_idx, self.clipping_range,
                                   stages, self.cfg.validation.max_update_norm)

    def finish(self) -> None:
        """Turn the round in progress (if any) into an entry of ``rounds``."""
        if self._open is None:
            return
        stream, seed, round_idx, stages, start = self._open
        self._open = None
        entry = round_entry(stream, seed, round_idx + 1, stages, self.clipping_range, time.perf_counter() - start)
        self.rounds.append(entry)
        if self.echo:
            print(f"  {self.cfg.setting} {self.cfg.method} {stream} s{seed} round {entry['round']:3d}: max|update| "
                  f"{_fmt(entry['max_update'])} rms {_fmt(entry['rms_update'])} max|report| "
                  f"{_fmt(entry['max_report'])} clipped {entry['clipped']} ({entry['seconds']:.1f} s)", flush=True)
        if self.on_entry is not None:
            self.on_entry(self.rounds)


def _finite_or_none(x: float) -> float | None:
    return None if math.isnan(x) else x


def round_entry(stream: str, seed: int, round_no: int, stages: list[StageValues], c: float,
                seconds: float) -> dict[str, Any]:
    """One measured round (1-based ``round_no``): maxima over its stages, margins ``c - max`` and
    headroom ratios ``c / max``."""
    ups = [s.max_update for s in stages if not math.isnan(s.max_update)]
    reps = [s.max_report for s in stages if not math.isnan(s.max_report)]
    count = sum(s.count for s in stages)
    max_update = max(ups) if ups else math.nan
    max_report = max(reps) if reps else math.nan
    return {
        "stream": stream, "seed": seed, "round": round_no, "stages": len(stages),
        "clients": max((s.clients for s in stages), default=0), "rows": max((s.rows for s in stages), default=0),
        "max_update": _finite_or_none(max_update),
        "rms_update": math.sqrt(sum(s.sum_sq for s in stages) / count) if count else None,
        "max_report": _finite_or_none(max_report),
        "mean_report": next((s.mean_report for s in stages if s.mean_report is not None), None),
        "clipped": sum(s.clipped for s in stages),
        "update_margin": _finite_or_none(c - max_update), "report_margin": _finite_or_none(c - max_report),
        "update_headroom": c / max_update if ups and max_update > 0 else None,
        "report_headroom": c / max_report if reps and max_report > 0 else None,
        "seconds": seconds,
    }


def summarize(rounds: list[dict[str, Any]], c: float) -> dict[str, Any]:
    """Maxima over all measured rounds, with the round they occurred in."""
    out: dict[str, Any] = {"rounds_measured": len(rounds), "clipped": sum(r["clipped"] for r in rounds)}
    for key in ("update", "report"):
        vals = [(r[f"max_{key}"], r["stream"], r["round"]) for r in rounds if r[f"max_{key}"] is not None]
        if vals:
            top = max(vals)
            out[f"max_{key}"] = top[0]
            out[f"max_{key}_at"] = f"{top[1]} round {top[2]}"
            out[f"{key}_headroom"] = c / top[0] if top[0] > 0 else None
    rms = [r["rms_update"] for r in rounds if r["rms_update"] is not None]
    if rms:
        out["min_rms_update"] = min(rms)
        out["median_rms_update"] = float(np.median(rms))
    return out


def measure(cfg: RunConfig, clipping_range: float | None = None, echo: bool = False,
            on_entry: Callable[[list[dict[str, Any]]], None] | None = None) -> dict[str, Any]:
    """Run ``cfg`` (its method for ``cfg.rounds`` rounds, after FedHV's calibration when it
    calibrates on the training partition) and return the values SecAgg+ would clip.

    Parameters
    ----------
    cfg : RunConfig
        A resolved configuration; no run directory is written and no test evaluation is done.
    clipping_range : float, optional
        ``c`` (default: ``cfg.flower.clipping_range``).
    echo : bool
        Print one line per round as it finishes.
    on_entry : callable, optional
        Called with the rounds measured so far after each round (e.g. to save partial results).

    Returns
    -------
    dict
        ``rounds``: one :func:`round_entry` per round (calibration rounds first, stream
        ``"calibration"``), ``summary``: :func:`summarize` of them, and ``clipping_range``,
        ``quantization_step`` (``2c / 2**22``), ``reference`` / ``reference_source`` (FedHV).
    """
    c = float(cfg.flower.clipping_range if clipping_range is None else clipping_range)
    data = federated_data(cfg)
    factory = RecordingFactory(cfg, data, c, echo, on_entry)
    calibrates = cfg.method == "fedhv" and cfg.fedhv.reference == "calibrate"
    setup = build_method(cfg, data, federation_factory=factory if calibrates else None)
    theta = get_flat(new_model(cfg, data, cfg.seed)).clone()
    run_rounds(setup.algorithm, factory.engine(cfg.seed, "train"), data, theta, cfg.rounds,
               cfg.train.clients_per_round, cfg.seed, "train", validation=cfg.validation,
               federation_factory=factory)
    factory.finish()
    return {"setting": cfg.setting, "method": cfg.method, "clipping_range": c,
            "quantization_step": 2.0 * c / QUANTIZATION_RANGE, "reference": setup.reference,
            "reference_source": setup.reference_source, "rounds": factory.rounds,
            "summary": summarize(factory.rounds, c)}


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def synthetic_celeba(root: Path, images: int) -> Path:
    """``root`` with a synthetic ``celeba/`` folder (built by ``tests/support/celeba_fixture.py`` if absent)."""
    if not (root / "celeba" / "img_align_celeba").is_dir():
        spec = importlib.util.spec_from_file_location("celeba_fixture", REPO / "tests" / "support" / "celeba_fixture.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.make_celeba(root / "celeba", n=images)
    return root


def _write(path: Path, command: str, results: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"command": command, "torch_threads": torch.get_num_threads(), "results": results},
                               indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("settings", nargs="+", help="presets or TOML files")
    parser.add_argument("--methods", default="fedhv", help="comma-separated: fedhv, uniform, fsmgda")
    parser.add_argument("--rounds", type=int, default=None, help="training rounds (default: the setting's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--clip", type=float, default=None, help="clipping range c (default: flower.clipping_range)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    parser.add_argument("--synthetic-celeba", type=Path, default=None, metavar="DIR",
                        help="use (and build if absent) a synthetic CelebA folder under DIR")
    parser.add_argument("--synthetic-images", type=int, default=4000, help="images of the synthetic CelebA")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.synthetic_celeba is not None:
        overrides.append(f"data.root='{synthetic_celeba(args.synthetic_celeba, args.synthetic_images)}'")
    if args.rounds is not None:
        overrides.append(f"rounds={args.rounds}")
    results: list[dict[str, Any]] = []
    command = " ".join(["python perf/secure_clip_range.py", *(sys.argv[1:] if argv is None else argv)])
    for setting in args.settings:
        for method in args.methods.split(","):
            cfg = load_config(setting, [f"method={method}", *overrides])
            print(f"{cfg.setting} {method}: {cfg.rounds} rounds, {cfg.train.clients_per_round} clients/round, "
                  f"lr {cfg.lr_global}/{cfg.lr_local}, {torch.get_num_threads()} threads", flush=True)
            partial = {"setting": cfg.setting, "method": method, "partial": True, "overrides": overrides}

            def save(rounds: list[dict[str, Any]], done: list[dict[str, Any]] = results,
                     current: dict[str, Any] = partial) -> None:
                if args.out is not None:  # after every round, so a stopped measurement keeps what it has
                    current["rounds"] = rounds
                    _write(args.out, command, [*done, current])

            res = measure(cfg, args.clip, echo=True, on_entry=save)
            res["overrides"] = overrides
            res["synthetic_data"] = args.synthetic_celeba is not None
            results.append(res)
            s = res["summary"]
            print(f"{cfg.setting} {method}: max|update| {_fmt(s.get('max_update'))} ({s.get('max_update_at')}), "
                  f"max|report| {_fmt(s.get('max_report'))} ({s.get('max_report_at')}), clipped {s['clipped']}; "
                  f"headroom c/max: update {_fmt(s.get('update_headroom'))}, report "
                  f"{_fmt(s.get('report_headroom'))}", flush=True)
            if args.out is not None:
                _write(args.out, command, results)
    print(f"\n{'setting':<18} {'method':<8} {'rounds':>6} {'max|Δθ|':>9} {'c/max':>7} {'max|F|':>8} {'c/max':>7} "
          f"{'clipped':>7} {'min rms Δθ':>10}")
    for res in results:
        s = res["summary"]
        print(f"{res['setting']:<18} {res['method']:<8} {s['rounds_measured']:6d} {_fmt(s.get('max_update')):>9} "
              f"{_fmt(s.get('update_headroom')):>7} {_fmt(s.get('max_report')):>8} "
              f"{_fmt(s.get('report_headroom')):>7} {s['clipped']:7d} {_fmt(s.get('min_rms_update')):>10}")
    if args.out is not None:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
