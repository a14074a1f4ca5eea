"""``fedhv partition-stats``: per-client label statistics and heterogeneity of a setting's partition.

The report (:func:`partition_report`) holds, for the configured partition, per-client label
counts (classification) or positive-attribute rates (multi-label) and the strata present,
and for every strata rule of :data:`fedhv.config.schema.STRATA` (rules giving the same
strata on this benchmark are merged) the heterogeneity summary of
:mod:`fedhv.data.heterogeneity` -- the mean total-variation distance of the clients'
label marginals from the pool's -- next to a uniformly sampled (IID) partition of the
same size. It renders as text, CSV (one tidy table of the summaries) or JSON.

Only the keys the partition depends on are validated (``data.*`` needed to load the
benchmark and ``partition.*``): ``--set partition.clients=6`` works on a preset whose
``train.clients_per_round`` is 20. ``fedhv run`` keeps validating everything.
"""

from __future__ import annotations

import csv
import io
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np

from fedhv.config.loader import apply_overrides, build_run_config, load_setting
from fedhv.config.schema import STRATA, RunConfig
from fedhv.config.validation import _seed, choice, validate_partition_keys
from fedhv.data.heterogeneity import (  # participation_factor: re-exported (it moved)
    Heterogeneity,
    client_task_tv,
    iid_partition,
    participation_factor,
)
from fedhv.data.partition import dirichlet_partition
from fedhv.experiment.setup import partition_sizes
from fedhv.objectives import MultiLabel
from fedhv.registry import resolve_benchmark
from fedhv.safe_io import dumps_strict

#: Columns of the CSV output.
CSV_COLUMNS: tuple[str, ...] = (
    "setting", "strata", "same_as", "configured", "strata_present", "task", "mean_tv", "max_client_tv",
)


def validate_partition(cfg: RunConfig) -> None:
    """Check the keys a partition depends on (and nothing else).

    Raises
    ------
    ConfigError
        Naming the parameter, the value and the fix (the same messages as
        :func:`fedhv.config.validation.validate`).
    """
    resolve_benchmark(cfg.data.benchmark)
    choice("partition.strata", cfg.partition.strata, STRATA)
    for name, value in (("partition.seed", cfg.partition.seed), ("data.pair_seed", cfg.data.pair_seed),
                        ("data.val_seed", cfg.data.val_seed)):
        _seed(name, value)
    validate_partition_keys(cfg)


def load_partition_config(setting: str, overrides: Iterable[str] = ()) -> RunConfig:
    """Preset or TOML file + overrides, type-checked, with only the partition keys validated."""
    cfg = build_run_config(apply_overrides(load_setting(setting), overrides))
    validate_partition(cfg)
    return cfg


def _rule_partitions(cfg: RunConfig, bench: Any, parts: np.ndarray) -> list[dict[str, Any]]:
    """One entry per distinct strata array: rules, strata array and partition (configured first)."""
    p = cfg.partition
    entries: list[dict[str, Any]] = [{"rules": [p.strata], "strata": bench.strata(p.strata), "parts": parts}]
    for rule in sorted(STRATA, key=lambda r: r == "all-label"):  # the earlier name is listed after the explicit ones
        if rule == p.strata:
            continue
        with warnings.catch_warnings():  # the configured partition's warnings were shown by load_data
            warnings.simplefilter("ignore")
            strata = bench.strata(rule)
            same = next((e for e in entries if np.array_equal(e["strata"], strata)), None)
            if same is not None:
                same["rules"].append(rule)
                continue
            other = dirichlet_partition(strata, p.clients, partition_sizes(cfg, len(strata)), p.alpha, p.seed)
        entries.append({"rules": [rule], "strata": strata, "parts": other})
    return entries


def partition_report(cfg: RunConfig, gradients: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything ``fedhv partition-stats`` prints, as JSON-able data (``gradients``: the
    :func:`fedhv.stats_gradients.gradient_dissimilarity` report, when computed)."""
    from fedhv.experiment.setup import load_data

    bench, parts = load_data(cfg)
    p = cfg.partition
    labels = bench.train_y
    multilabel = isinstance(bench.objective, MultiLabel)
    summaries = []
    entries = _rule_partitions(cfg, bench, parts)
    hs = [Heterogeneity.of(client_task_tv(labels, e["parts"], bench.objective, bench.num_classes)) for e in entries]
    configured = hs[0]
    for k, (entry, h) in enumerate(zip(entries, hs)):
        summaries.append({
            "strata": entry["rules"][0], "same_as": entry["rules"][1:], "configured": k == 0,
            "strata_present": len(np.unique(entry["strata"])), "mean_tv": h.mean_tv,
            "max_client_tv": h.max_client_tv, "task_mean_tv": list(h.task_mean_tv),
        })
    sizes = [len(r) for r in parts] if p.sizes != "equal" else p.samples_per_client  # IID rows of the same sizes
    iid = Heterogeneity.of(client_task_tv(labels, iid_partition(len(labels), p.clients, sizes, p.seed),
                                          bench.objective, bench.num_classes))
    strata = entries[0]["strata"]
    keys, counts = np.unique(strata, return_counts=True)
    clients = []
    for k, row in enumerate(parts):
        rec: dict[str, Any] = {"client": k, "strata_present": len(np.unique(strata[row])),
                               "tv": configured.client_tv[k]}
        if isinstance(bench.objective, MultiLabel):
            rec["positive_rate"] = [float(labels[row][:, list(g)].mean()) for g in bench.objective.groups]
        else:
            rec["label_counts"] = [np.bincount(labels[row, i], minlength=c).tolist()
                                   for i, c in enumerate(bench.num_classes)]
        clients.append(rec)
    return {
        "setting": cfg.setting, "benchmark": cfg.data.benchmark, "tasks": list(bench.task_names),
        "num_classes": list(bench.num_classes), "multilabel": multilabel,
        "partition": {"clients": p.clients, "samples_per_client": p.samples_per_client, "alpha": p.alpha,
                      "strata": p.strata, "seed": p.seed, "sizes": p.sizes},
        "client_sizes": _size_summary([len(row) for row in parts]),
        "participation": {"clients_per_round": cfg.train.clients_per_round,
                          "chi": participation_factor(p.clients, cfg.train.clients_per_round)},
        "gradients": gradients,
        "train_samples": len(labels), "distinct_samples": len(np.unique(np.concatenate(list(parts)))),
        "strata_sizes": {str(int(k)): int(c) for k, c in zip(keys, counts)} if len(keys) <= 40 else None,
        "strata_present": len(keys),
        "heterogeneity": summaries,
        "iid": {"mean_tv": iid.mean_tv, "max_client_tv": iid.max_client_tv, "task_mean_tv": list(iid.task_mean_tv)},
        "clients": clients,
    }


def _size_summary(sizes: list[int]) -> dict[str, float]:
    s = np.asarray(sizes, dtype=np.float64)
    return {"min": float(s.min()), "median": float(np.median(s)), "mean": float(s.mean()), "max": float(s.max()),
            "p10": float(np.percentile(s, 10)), "p90": float(np.percentile(s, 90))}


#: Per-client rows the text output lists (``--format json`` has every client).
TEXT_CLIENTS = 60


def _participation_lines(r: dict[str, Any]) -> list[str]:
    """χ_N(M), the client sizes and (when computed) the gradient dissimilarity, as text."""
    p, part = r["partition"], r["participation"]
    s = r["client_sizes"]
    lines = ["", (f"participation: M = {part['clients_per_round']} of N = {p['clients']} per round, "
                  f"chi_N(M) = (N - M) / (M (N - 1)) = {part['chi']:.6g}")]
    if s["min"] != s["max"]:
        lines.append(f"client sizes ({p['sizes']}): min {s['min']:.0f}, 10th pct {s['p10']:.0f}, median "
                     f"{s['median']:.0f}, mean {s['mean']:.1f}, 90th pct {s['p90']:.0f}, max {s['max']:.0f}")
    g = r.get("gradients")
    if g:
        lines += ["", (f"gradient dissimilarity at {g['model']} over {g['clients_used']} of {g['clients']} clients "
                       f"(A.2: zeta_i^2 = (1/N) sum_k ||grad f_i^(k) - grad f_i||^2):"),
                  f"  {'task':<10}{'zeta^2':>12}{'||grad f||^2':>14}{'ratio':>9}{'chi zeta^2':>13}"]
        for t, z, n2, rel, cz in zip(r["tasks"], g["zeta_sq"], g["grad_sq"], g["relative"], g["chi_zeta_sq"]):
            ratio = f"{rel:9.3g}" if rel is not None else f"{'-':>9}"
            lines.append(f"  {t:<10}{z:12.4g}{n2:14.4g}{ratio}{cz:13.4g}")
        lines.append("  ratio = zeta^2 / ||grad f||^2; chi zeta^2 = the variance of the M sampled clients' mean "
                     "gradient (without replacement)")
    return lines


def render_text(r: dict[str, Any]) -> str:
    """The report as text: header, heterogeneity summary, per-client statistics."""
    p = r["partition"]
    lines = [(
        f"{r['setting']}: {p['clients']} clients x {p['samples_per_client']} samples"
    f"{'' if p.get('sizes', 'equal') == 'equal' else ' (mean, ' + p['sizes'] + ')'}, alpha = {p['alpha']}, "
        f"{p['strata']} strata ({r['strata_present']} present in the training pool), seed {p['seed']}; "
        f"{r['distinct_samples']} distinct samples of {r['train_samples']}"
    )]
    if r["strata_sizes"] is not None:
        lines.append("strata sizes: " + ", ".join(f"{k}:{c}" for k, c in r["strata_sizes"].items()))
    lines += ["", ("heterogeneity: mean total-variation distance of client label marginals from the pool's "
                   "(0 = the pool's labels, 1 = disjoint), per task and overall; * = configured rule")]
    names = [" = ".join([s["strata"], *s["same_as"]]) for s in r["heterogeneity"]]
    width = max(len("iid (uniform sample, for scale)"), *(len(n) for n in names)) + 2
    lines.append(f"  {'strata rule':<{width}}{'strata':>8}{'mean TV':>9}{'max TV':>9}"
                 + "".join(f"{t:>9}" for t in r["tasks"]))
    for name, s in zip(names, r["heterogeneity"]):
        lines.append(f"{'*' if s['configured'] else ' '} {name:<{width}}{s['strata_present']:>8}{s['mean_tv']:9.4f}"
                     f"{s['max_client_tv']:9.4f}" + "".join(f"{v:9.4f}" for v in s["task_mean_tv"]))
    iid = r["iid"]
    lines.append(f"  {'iid (uniform sample, for scale)':<{width}}{'-':>8}{iid['mean_tv']:9.4f}"
                 f"{iid['max_client_tv']:9.4f}" + "".join(f"{v:9.4f}" for v in iid["task_mean_tv"]))
    lines += _participation_lines(r)
    shown = r["clients"][:TEXT_CLIENTS]
    more = len(r["clients"]) - len(shown)
    if more:
        lines += ["", f"(the first {TEXT_CLIENTS} clients below; {more} more with --format json)"]
    if r["multilabel"]:
        lines += ["", "positive-attribute rate per task and client (TV: the client's mean over tasks)",
                  f"{'client':>6} " + "".join(f"{n:>7}" for n in r["tasks"]) + "   strata      TV"]
        for c in shown:
            lines.append(f"{c['client']:>6} " + "".join(f"{v:7.3f}" for v in c["positive_rate"])
                         + f"   {c['strata_present']:6d}  {c['tv']:6.4f}")
        return "\n".join(lines) + "\n"
    for i, name in enumerate(r["tasks"]):
        counts = [c["label_counts"][i] for c in shown]
        cell = max(4, len(str(max(max(row) for row in counts))) + 1)
        header = "".join(f"{v:>{cell}}" for v in range(r["num_classes"][i]))
        lines += ["", f"task {name!r}: label counts per client", f"{'client':>6} {header}   top-share  strata"]
        for c, row in zip(shown, counts):
            cells = "".join(f"{v:>{cell}}" for v in row)
            lines.append(f"{c['client']:>6} {cells}   {max(row) / sum(row):9.2f}  {c['strata_present']:6d}")
    return "\n".join(lines) + "\n"


def render_csv(r: dict[str, Any]) -> str:
    """The heterogeneity summaries as one tidy CSV table (columns :data:`CSV_COLUMNS`).

    One row per (strata rule, task) and one with ``task = "all"`` (the mean over tasks);
    the IID baseline has ``strata = "iid"``.
    """
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(CSV_COLUMNS)
    rows = [(s["strata"], " ".join(s["same_as"]), s["configured"], s["strata_present"], s) for s in r["heterogeneity"]]
    rows.append(("iid", "", False, "", r["iid"]))
    for rule, same, configured, present, s in rows:
        for task, mean in zip(r["tasks"], s["task_mean_tv"]):
            out.writerow([r["setting"], rule, same, configured, present, task, f"{mean:.6f}", ""])
        out.writerow([r["setting"], rule, same, configured, present, "all", f"{s['mean_tv']:.6f}",
                      f"{s['max_client_tv']:.6f}"])
    return buf.getvalue()


def render_json(r: dict[str, Any]) -> str:
    """The whole report as JSON."""
    return dumps_strict(r, indent=2) + "\n"  # strict JSON: a NaN (e.g. a diverged --model) is written null


RENDERERS = {"text": render_text, "csv": render_csv, "json": render_json}


def print_partition_stats(cfg: RunConfig, fmt: str = "text", gradients: bool = False, model: str | None = None,
                          grad_clients: int = 100) -> None:
    """Print the report of ``cfg``'s partition in ``fmt`` (``text``, ``csv`` or ``json``); with
    ``gradients`` also the gradient dissimilarity (:mod:`fedhv.stats_gradients`) at the initial
    model or the ``model.pt`` at ``model``, over at most ``grad_clients`` clients."""
    report = None
    if gradients:
        from fedhv.stats_gradients import gradient_dissimilarity

        report = gradient_dissimilarity(cfg, model, grad_clients)
    print(RENDERERS[fmt](partition_report(cfg, report)), end="")
