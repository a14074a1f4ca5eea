"""Table 12 (complexity and measured communication) and the diagnostics tables.

- ``12``: per setting and method, the paper's Table 12 complexity (client procedure,
  per-client communication order, extra server procedure) next to what the runs measured:
  MB per client per round down / up, MB per round over the ``M`` clients (down + up, the
  quantity the paper's "Empirical" column gives for CIFAR10–MNIST), synchronisation stages,
  and client / server seconds per round.
- ``fairness``: per task, the per-client score at the reported evaluation (paper B.5's rule,
  :attr:`~fedhv.results.collect.Run.reported`, or the last evaluation with diagnostics before
  it): worst client, 10th percentile, standard deviation over clients and Jain's index.
- ``theory``: the running mean of ``||grad Phi||^2`` over the evaluated models, the final
  Pareto residual ``P(theta)``, the mean report error and stale-weight error over the rounds
  that started from an evaluated model, and the final worst-task slack with its §4.3 bound.

Values are mean ± sample std over seeds (:class:`~fedhv.results.collect.Stat`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fedhv.results.collect import Run, Stat, group, method_label, ordered_methods, ordered_settings, setting_label
from fedhv.results.paper_data import paper_value
from fedhv.results.table_model import Cell, Record, Table

#: Paper Table 12's complexity entries (client procedure, per-client communication, extra server work).
COMPLEXITY: dict[str, tuple[str, str, str]] = {
    "fsmgda": ("separate objective-specific local updates", "Θ(md)", "task-update geometry, multi-gradient solver"),
    "uniform": ("one uniformly weighted local trajectory", "Θ(d)", "none beyond model aggregation"),
    "fedcmoo": ("task-gradient estimation, weighted local training", "Θ(d)",
                "approximate Gram matrix, iterative weight updates"),
    "fedhv": ("objective estimation, one weighted local trajectory", "Θ(d + m)",
              "O(Mm) report aggregation, closed-form inverse-slack weights"),
}


def _mb(value: Any) -> float | None:
    return None if value is None else float(value) / 1e6


def _per_round(run: Run, key: str) -> float | None:
    rounds = run.summary.get("rounds") or 0
    value = run.summary.get(key)
    return None if value is None or not rounds else float(value) / rounds


def table12(runs: Sequence[Run], paper: bool = False) -> list[Table]:
    """Table 12 per setting: complexity (paper) and measured payloads, stages and time per round."""
    groups = group(runs)
    out = []
    for setting in ordered_settings({s for s, _, _ in groups}):
        table = Table("12", f"Table 12: per-round complexity and measured cost, {setting_label(setting)}", ["Method"], [
            "client-side procedure", "per-client comm.", "MB / client / round (down / up)",
            "MB / round, M clients (down + up)", "sync stages", "client s / round", "server s / round",
            "additional server-side procedure",
        ], slug=setting)
        for m in ordered_methods({m for s, _, m in groups if s == setting}):
            rs = groups[(setting, None, m)]
            s0 = rs[0].summary
            down, up = _mb(s0.get("bytes_down_per_client_round")), _mb(s0.get("bytes_up_per_client_round"))
            clients = int(rs[0].config_value("train.clients_per_round", 0) or 0)
            both = None if down is None or up is None else (down + up) * clients
            client_s = Stat.of(_per_round(r, "time_client_s") for r in rs)
            server_s = Stat.of(_per_round(r, "time_server_s") for r in rs)
            declared = s0.get("complexity")  # the method's own (Method.complexity), else the paper's entry
            ok = isinstance(declared, list) and len(declared) == 3 and all(isinstance(v, str) for v in declared)
            proc, comm, server = declared if ok else COMPLEXITY.get(m, ("–", "–", "–"))
            cells = [Cell(text=proc), Cell(text=comm),
                     Cell(text="–" if down is None or up is None else f"{down:.3f} / {up:.3f}"),
                     Cell(text="–" if both is None else f"{both:.1f}"), Cell(text=str(s0.get("sync_stages") or "–")),
                     Cell(client_s, digits=3), Cell(server_s, digits=4), Cell(text=server)]
            table.add([method_label(m)], cells)
            theirs = paper_value("table12", m, "per_client_communication_empirical_mb_approx") \
                if setting.startswith("cifar10-mnist") else None
            table.records += [
                Record(setting, m, "mb_per_round_all_clients", None if both is None else Stat(both, None, len(rs)),
                       None if theirs is None else Stat(float(theirs), None, 3)),
                Record(setting, m, "sync_stages", Stat.of([s0.get("sync_stages")])),
                Record(setting, m, "client_per_round_s", client_s),
                Record(setting, m, "server_per_round_s", server_s),
            ]
            if paper and theirs is not None:
                table.add(["paper"], [Cell(text=""), Cell(text=""), Cell(text=""), Cell(text=f"~{theirs}"),
                                      Cell(text=""), Cell(text=""), Cell(text=""), Cell(text="")])
        table.notes.append("Complexity columns: paper Table 12 (d model dimension, m objectives, M clients per round). "
                           "The paper's 'Empirical' MB for CIFAR10–MNIST is one round over the M = 10 clients, "
                           "down + up: compare it with the 'M clients' column.")
        out.append(table)
    return out


def _diag_entry(run: Run) -> dict[str, Any] | None:
    """The diagnostics of the reported evaluation, or of the last evaluation with them before it."""
    target = run.reported.get("round")
    best = None
    for e in run.metrics:
        if isinstance(e.get("diagnostics"), dict) and (target is None or e["round"] <= target):
            best = e["diagnostics"]
    return best


def _runs_with_diagnostics(runs: Sequence[Run]) -> dict[tuple[str, Any, str], list[Run]]:
    return {k: [r for r in v if _diag_entry(r) is not None] for k, v in group(runs).items()
            if any(_diag_entry(r) is not None for r in v)}


def _client_value(run: Run, i: int, key: str) -> float | None:
    """``key`` of task ``i``'s per-client score summary at the run's reported evaluation."""
    scores = ((_diag_entry(run) or {}).get("clients") or {}).get("score") or []
    return scores[i].get(key) if i < len(scores) else None


def table_fairness(runs: Sequence[Run], paper: bool = False) -> list[Table]:
    """Per-client fairness per setting: rows methods, columns per task (worst, p10, std, Jain)."""
    groups = _runs_with_diagnostics(runs)
    out = []
    for setting in ordered_settings({s for s, _, _ in groups}):
        methods = ordered_methods({m for s, _, m in groups if s == setting})
        tasks = groups[(setting, None, methods[0])][0].summary.get("tasks") or []
        cols = [(i, key, label) for i in range(len(tasks))
                for key, label in (("worst", "worst"), ("p10", "p10"), ("std", "std"), ("jain", "Jain"))]
        table = Table("fairness", f"Per-client fairness at the reported evaluation, {setting_label(setting)}",
                      ["Method"], [f"{tasks[i]} {label}" for i, _, label in cols], slug=setting)
        for m in methods:
            rs = groups[(setting, None, m)]
            cells = []
            for i, key, _ in cols:
                stat = Stat.of(_client_value(r, i, key) for r in rs)
                cells.append(Cell(stat, digits=4 if key == "jain" else 2))
                table.records.append(Record(setting, m, f"client_{key}[{tasks[i]}]", stat))
            table.add([method_label(m)], cells)
        table.notes.append("Each client's score on its own training samples (eval mode) at the reported evaluation; "
                           "worst / p10 from the bad side; std over clients (ddof 0); Jain = (Σa)² / (N Σa²). "
                           "Runs with diagnostics.enabled = true only.")
        out.append(table)
    return out


def _rounds_mean(run: Run, key: str) -> float | None:
    vals = [r["diagnostics"].get(key) for r in run.rounds if isinstance(r.get("diagnostics"), dict)]
    vals = [float(v) for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def table_theory(runs: Sequence[Run], paper: bool = False) -> Table:
    """The theory quantities per setting and method (runs with diagnostics)."""
    groups = _runs_with_diagnostics(runs)
    table = Table("theory", "Theory diagnostics (paper §4, A.4, A.7, A.8)", ["Setting", "Method"], [
        "mean ‖∇Φ‖² (evals)", "final P(θ)", "mean report error", "mean stale-weight error", "final min slack",
        "§4.3 bound (run)",
    ])
    columns: list[tuple[str, Callable[[Run], float | None], int]] = [
        ("grad_phi_sq_avg", lambda r: (_diag_entry(r) or {}).get("grad_phi_sq_avg"), 3),
        ("pareto_residual", lambda r: (_diag_entry(r) or {}).get("pareto_residual"), 4),
        ("report_error", lambda r: _rounds_mean(r, "report_error"), 4),
        ("stale_weight_error", lambda r: _rounds_mean(r, "stale_weight_error"), 4),
        ("min_slack", lambda r: (_diag_entry(r) or {}).get("min_slack"), 4),
        ("slack_bound_run", lambda r: (_diag_entry(r) or {}).get("slack_bound_run"), 4),
    ]
    for setting in ordered_settings({s for s, _, _ in groups}):
        for m in ordered_methods({m for s, _, m in groups if s == setting}):
            rs = groups[(setting, None, m)]
            cells = []
            for key, get, digits in columns:
                stat = Stat.of(get(r) for r in rs)
                cells.append(Cell(stat, digits=digits))
                table.records.append(Record(setting, m, key, stat))
            table.add([setting_label(setting), method_label(m)], cells)
    table.notes.append("‖∇Φ‖²: the mean over the evaluated models (the sampled form of Theorem 4.1's average); "
                       "report / stale-weight errors: means over the rounds that started from an evaluated model "
                       "(‖F^t − f(θ^t)‖_∞, ‖w^t − W(f(θ^t); r)‖₁); bound: e^{−B}/R_max(r) with B the largest Φ seen. "
                       "All slacks against the FedHV reference of the setting. docs/diagnostics.md.")
    return table
