"""Simulated client faults: clients that do not answer and garbage replies.

Every decision is drawn from a keyed stream ``(seed, stream, "faults", purpose, round,
client, ...)``, so a faulty run is as reproducible as a clean one and the batched and
sequential engines see the same faults.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from fedhv.algorithms.validation import ClientReply
from fedhv.rng import numpy_rng

#: Kinds of garbage a corrupted report is replaced by.
REPORT_GARBAGE: tuple[str, ...] = ("nan", "inf", "negative", "short", "long")
#: Kinds of garbage a corrupted update / gradient upload is replaced by.
UPDATE_GARBAGE: tuple[str, ...] = ("nan", "inf", "truncated")
#: Factor a poisoned update / gradient upload is multiplied by: finite, so it passes the
#: finiteness and shape checks; only ``validation.max_update_norm(_ratio)`` rejects it.
POISON_SCALE = 1e30


def garbage_report(report: torch.Tensor, kind: str) -> torch.Tensor:
    """``report [m]`` replaced by one kind of garbage."""
    out = report.clone()
    if kind == "nan":
        out[0] = float("nan")
    elif kind == "inf":
        out[-1] = float("inf")
    elif kind == "negative":
        out[0] = -abs(float(out[0])) - 1.0
    elif kind == "short":
        out = out[:-1]
    elif kind == "long":
        out = torch.cat([out, out[:1]])
    else:
        raise ValueError(f"unknown report garbage {kind!r}")
    return out


def garbage_update(update: torch.Tensor, kind: str) -> torch.Tensor:
    """``update [T, d]`` replaced by one kind of garbage."""
    out = update.clone()
    if kind == "nan":
        out[..., out.shape[-1] // 2] = float("nan")
    elif kind == "inf":
        out[..., 0] = float("-inf")
    elif kind == "truncated":
        out = out[..., :-1]
    else:
        raise ValueError(f"unknown update garbage {kind!r}")
    return out


@dataclass(frozen=True)
class FaultInjector:
    """Decides, per round and client, whether a client drops out or sends garbage.

    Parameters
    ----------
    client_dropout, corrupt_reports, corrupt_updates, poison_updates : float
        Probabilities (see :class:`fedhv.config.schema.FaultsConfig`).
    seed : int
        Run seed.
    stream : str
        Separates training from calibration randomness.
    """

    client_dropout: float = 0.0
    corrupt_reports: float = 0.0
    corrupt_updates: float = 0.0
    poison_updates: float = 0.0
    seed: int = 0
    stream: str = "train"

    @property
    def active(self) -> bool:
        return bool(self.client_dropout or self.corrupt_reports or self.corrupt_updates or self.poison_updates)

    def drops(self, round_idx: int, client: int) -> bool:
        """Whether ``client`` does not answer in round ``round_idx`` (any stage)."""
        if not self.client_dropout:
            return False
        return bool(numpy_rng(self.seed, self.stream, "faults", "dropout", round_idx, client).random()
                    < self.client_dropout)

    def corrupt(self, reply: ClientReply, round_idx: int, stage: int) -> ClientReply:
        """``reply`` with its report and / or uploads possibly replaced by garbage."""
        rng = numpy_rng(self.seed, self.stream, "faults", "corrupt", round_idx, reply.client, stage)
        draw_report, draw_update = rng.random(2)
        out = reply
        if reply.report is not None and draw_report < self.corrupt_reports:
            kind = REPORT_GARBAGE[int(rng.integers(len(REPORT_GARBAGE)))]
            out = replace(out, report=garbage_report(torch.as_tensor(reply.report), kind))
        if draw_update < self.corrupt_updates:
            kind = UPDATE_GARBAGE[int(rng.integers(len(UPDATE_GARBAGE)))]
            if out.deltas is not None:
                out = replace(out, deltas=garbage_update(torch.as_tensor(out.deltas), kind))
            if out.gradients is not None:
                out = replace(out, gradients=garbage_update(torch.as_tensor(out.gradients), kind))
        # A stream of its own, so turning poisoning on leaves every other fault decision unchanged.
        if self.poison_updates and (numpy_rng(self.seed, self.stream, "faults", "poison", round_idx, reply.client,
                                              stage).random() < self.poison_updates):
            if out.deltas is not None:
                out = replace(out, deltas=torch.as_tensor(out.deltas) * POISON_SCALE)
            if out.gradients is not None:
                out = replace(out, gradients=torch.as_tensor(out.gradients) * POISON_SCALE)
        return out


def no_faults() -> FaultInjector:
    """An injector that never fires."""
    return FaultInjector()


def dropped_mask(injector: FaultInjector, round_idx: int, clients: np.ndarray) -> np.ndarray:
    """Boolean mask of the clients that do not answer in ``round_idx``."""
    return np.array([injector.drops(round_idx, int(c)) for c in clients], dtype=bool)
