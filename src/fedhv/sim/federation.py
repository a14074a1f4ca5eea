"""The simulator's :class:`~fedhv.algorithms.base.Federation`: runs stages on an engine
and accounts bytes, stages and client time."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from fedhv.algorithms.accounting import FederationAccounting
from fedhv.algorithms.base import Replies, Request, sample_weights
from fedhv.algorithms.validation import (
    NoValidReplies,
    ReplySpec,
    is_non_finite,
    norm_outliers,
    reply_problem,
    split_replies,
    stack_replies,
)
from fedhv.devices import synchronize
from fedhv.objectives import nonnegative_losses
from fedhv.sim.engine import Engine
from fedhv.sim.faults import FaultInjector, dropped_mask, no_faults

log = logging.getLogger("fedhv")


def nbytes(value: Any) -> int:
    """Bytes of a tensor or array as sent on the wire (its own dtype)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return int(np.asarray(value).nbytes)


class SimFederation(FederationAccounting):
    """One round's sampled clients, served by an engine.

    Clients that drop out (``faults.client_dropout``) do not answer from the round's
    first stage on; every reply is validated (:mod:`fedhv.algorithms.validation`) and a
    client with an invalid reply is excluded from the rest of the round. ``clients``
    is always the set still taking part, in the order of the last replies, so
    client-held tensors (``first_step``) line up with it. A stage in which no client
    is left raises :class:`NoValidReplies`.

    A stage returns exactly the replies that passed validation, as the clients sent them
    (after any simulated corruption): a reply altered by fault injection that still passes
    validation is aggregated whether or not another client was rejected in the stage.
    ``aggregation = "samples"`` weights the updates by the answering clients' sample counts
    (:attr:`Replies.weights`; FedAvg's default in Flower), ``"mean"`` is the paper's plain mean.

    ``max_update_norm`` / ``max_norm_ratio`` are the optional norm bounds of
    :class:`~fedhv.algorithms.validation.ReplySpec` (``validation.*``; 0 = off).

    Bytes, stages, client time (the clients' computation) and the dropped, rejected and
    diverged clients are kept by :class:`~fedhv.algorithms.accounting.FederationAccounting`.
    """

    def __init__(self, engine: Engine, clients: np.ndarray, round_idx: int, faults: FaultInjector | None = None,
                 max_update_norm: float = 0.0, max_norm_ratio: float = 0.0, aggregation: str = "mean") -> None:
        self.engine = engine
        self.aggregation = aggregation
        self.max_update_norm = max_update_norm
        self.max_norm_ratio = max_norm_ratio
        self.faults = faults or no_faults()
        sampled = np.asarray(clients)
        mask = dropped_mask(self.faults, round_idx, sampled)
        super().__init__(sampled[~mask], round_idx, dropped=sampled[mask].tolist())
        for c in self.dropped:
            log.info("round %d: client %d did not answer (dropped out)", round_idx + 1, c)

    def exchange(self, theta: torch.Tensor, request: Request) -> Replies:
        """Run one stage for the remaining clients, validate and count what crosses the network."""
        if len(self._clients) == 0:
            raise NoValidReplies(self.dropped, self.rejected)
        synchronize(self.engine.device)  # queued server work is not client time
        start = time.perf_counter()
        e, clients, t = self.engine, self._clients, self.round_idx
        replies = Replies(clients=clients)
        if request.report is not None:
            replies.reports = e.reports(theta, clients, t, request.report)
        if request.gradients is not None:
            replies.gradients = e.gradients(theta, clients, request.gradients, t)
        if request.train is not None:
            replies.deltas = e.train(theta, clients, request.train, t, request.first_step, request.train_draw)
        synchronize(e.device)  # GPU kernels run asynchronously: wait before reading the clock
        self.client_seconds += time.perf_counter() - start
        self.stages += 1
        self.bytes_down += (nbytes(theta) if request.send_model else 0) + sum(
            nbytes(v) for v in request.payload.values()
        )
        for name in ("reports", "deltas") + (("gradients",) if request.upload_gradients else ()):
            value = getattr(replies, name)
            if value is not None:
                self.bytes_up += nbytes(value[0])
        out = self._validated(replies, request, theta)
        if self.aggregation == "samples" and out.deltas is not None:
            out.weights = sample_weights([len(e.data.parts[int(c)]) for c in out.clients])
        return out

    def _validated(self, replies: Replies, request: Request, theta: torch.Tensor) -> Replies:
        spec = ReplySpec(
            num_tasks=self.engine.data.num_tasks,
            dim=theta.numel(),
            report=request.report is not None,
            gradient_rows=0 if request.gradients is None else len(request.gradients),
            train_rows=0 if request.train is None else len(request.train),
            max_update_norm=self.max_update_norm,
            max_norm_ratio=self.max_norm_ratio,
            nonnegative=nonnegative_losses(self.engine.data.objective, self.engine.data.num_tasks),
        )
        sent = split_replies(replies)
        per_client = [self.faults.corrupt(r, self.round_idx, self.stages) for r in sent] if self.faults.active else sent
        # corrupt() returns the reply itself when it injects nothing.
        injected = [r is not s for r, s in zip(per_client, sent)]
        valid, changed = [], any(injected)
        for reply, was_injected in zip(per_client, injected):
            problem = reply_problem(reply, spec)
            if problem is None:
                valid.append(reply)
                continue
            changed = True
            self._reject(reply.client, problem, own=not was_injected and is_non_finite(problem))
        outliers = norm_outliers(valid, spec)
        if any(outliers):
            changed = True
            for reply, problem in zip(valid, outliers):
                if problem is not None:
                    self._reject(reply.client, problem, own=False)
            valid = [r for r, problem in zip(valid, outliers) if problem is None]
        if not valid:
            self._clients = self._clients[:0]
            raise NoValidReplies(self.dropped, self.rejected)
        if not changed:
            return replies
        out = stack_replies(valid, spec, theta)
        if replies.reports is not None and out.reports is not None:
            out.reports = out.reports.to(replies.reports.dtype)
        self._clients = out.clients
        return out
