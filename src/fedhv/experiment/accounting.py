"""Cumulative cost and diagnostics of a run (time split, bytes, stages, FedHV slack)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedhv.experiment.loop import RoundRecord


@dataclass
class RunTotals:
    """Running totals over the adaptive rounds.

    Bytes are totals over all participating clients (downlink: every sampled client;
    uplink: the clients that answered); ``*_per_client_round`` values in the summary
    are the last round's per-client payloads.
    """

    rounds: int = 0
    time_client_s: float = 0.0
    time_server_s: float = 0.0
    time_eval_s: float = 0.0
    bytes_down: int = 0
    bytes_up: int = 0
    min_report_slack: float | None = None
    floor_activations: int = 0
    dropped_clients: int = 0
    rejected_clients: int = 0
    skipped_rounds: int = 0
    last: dict[str, Any] = field(default_factory=dict)

    def add_round(self, rec: RoundRecord) -> None:
        self.rounds += 1
        self.time_client_s += rec.time_client_s
        self.time_server_s += rec.time_server_s
        self.bytes_down += rec.bytes_down * len(rec.clients)
        self.bytes_up += rec.bytes_up * rec.answered
        self.dropped_clients += len(rec.dropped)
        self.rejected_clients += len(rec.rejected)
        self.skipped_rounds += int(rec.skipped)
        if "min_slack" in rec.log:
            ms = rec.log["min_slack"]
            self.min_report_slack = ms if self.min_report_slack is None else min(self.min_report_slack, ms)
            self.floor_activations += int(rec.log["floor_activations"])
        self.last = rec.as_dict()

    def cost(self) -> dict[str, Any]:
        """The accounting fields of ``summary.json``."""
        return {
            "sync_stages": self.last.get("sync_stages"),
            "bytes_down_per_client_round": self.last.get("bytes_down_per_client"),
            "bytes_up_per_client_round": self.last.get("bytes_up_per_client"),
            "bytes_down_total": self.bytes_down,
            "bytes_up_total": self.bytes_up,
            "time_client_s": self.time_client_s,
            "time_server_s": self.time_server_s,
            "time_eval_s": self.time_eval_s,
            "dropped_clients": self.dropped_clients,
            "rejected_clients": self.rejected_clients,
            "skipped_rounds": self.skipped_rounds,
        }
