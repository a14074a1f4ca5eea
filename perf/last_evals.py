"""Mean ± sample std of a run's last scheduled test evaluations, up to a round (issue 31's JPEG proxy).

    python perf/last_evals.py RUN_DIR [RUN_DIR ...] [--until 150] [--last 10]

For every run directory, the evaluations in ``metrics.jsonl`` whose round is a multiple of the
run's test period (the scheduled ones, B.5; an extra final evaluation is left out) and at most
``--until`` are taken (``fedhv.results.collect.Run.last_scheduled``, as Table 11 takes them), the last ``--last`` of them averaged: MeanAcc and each task's score.
Comparing a 150-round run with the first 150 rounds of a longer one is fair where the setting has
no learning-rate schedule (the paper's presets have none): both then train identically up to there.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from fedhv.results.collect import find_runs


def last_evaluations(run: Path, until: int, last: int) -> list[dict]:
    """The last ``last`` scheduled evaluations of the finished run ``run`` at rounds ≤ ``until``
    (:meth:`fedhv.results.collect.Run.last_scheduled`, as Table 11 takes them)."""
    runs, _ = find_runs(run)
    found = [r for r in runs if r.path.resolve() == run.resolve()]
    if not found:
        raise SystemExit(f"{run}: not a finished run directory (config.toml, metrics.jsonl, summary.json)")
    records = found[0].last_scheduled(last, until=until)
    period = int(found[0].config_value("eval.test_period", 0) or 0)
    if len(records) < last or not period or any(r["round"] % period for r in records):
        raise SystemExit(f"{run}: fewer than --last {last} scheduled evaluations up to round {until}")
    return records


def summary(records: list[dict]) -> dict[str, tuple[float, float]]:
    """``{column: (mean, sample std)}`` for MeanAcc and each task's score (accuracy, or a regression task's metric)."""
    columns = {"MeanAcc": [r["mean_acc"] for r in records]}
    key = "task_score" if "task_score" in records[0] else "task_acc"  # task_score: a regression task's own metric
    for i in range(len(records[0][key])):
        columns[f"task {i}"] = [r[key][i] for r in records]
    return {k: (statistics.fmean(v), statistics.stdev(v)) for k, v in columns.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (config.toml + metrics.jsonl)")
    parser.add_argument("--until", type=int, default=150, help="last round considered (default 150)")
    parser.add_argument("--last", type=int, default=10, help="how many evaluations to average (default 10)")
    args = parser.parse_args()
    for run in args.runs:
        records = last_evaluations(run, args.until, args.last)
        cells = "  ".join(f"{k} {m:.2f} ± {s:.2f}" for k, (m, s) in summary(records).items())
        print(f"{run}: rounds {records[0]['round']}–{records[-1]['round']}: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
