"""Secure aggregation on Flower: each stage through flwr 1.42's SecAgg+, the server learns only means.

``flower.secure_aggregation = true`` (``fedhv flower local --secure``) replaces the
:class:`~fedhv.flower.federation.FlowerFederation` of every round by a
:class:`SecureFlowerFederation`. Its :meth:`~SecureFlowerFederation.exchange` runs one
``SecAggPlusWorkflow`` (flwr's legacy workflow: a ``LegacyContext`` whose strategy,
:class:`MeanStrategy`, hands out the ``FitIns`` and receives the aggregate) over four message
round trips: *setup* (public keys), *share keys* (encrypted key shares), *collect masked
vectors* (the nodes train and upload their masked vector, :mod:`fedhv.flower.secure_client`)
and *unmask* (shares to remove the masks). Every client weighs 1, so the workflow returns the
plain mean over the ``n`` clients whose masked vectors arrived, split into the mean update
``[T, d]``, the mean report ``[m]`` and the number of clipped values
(:func:`~fedhv.flower.secure_client.unpack`). The algorithm receives *aggregate-only*
:class:`~fedhv.algorithms.base.Replies`: one row holding the means (``mean(0)`` of one row is
the row), ``clients`` = the ``n`` aggregated clients. FedHV sets its next weights from the mean
report, as in the plain protocol. Methods: FedHV, Uniform and FSMGDA (their stages need only
means); FedCMOO is refused (:mod:`fedhv.config.flower`).

Numerics (flwr 1.42's ``quantize`` / ``dequantize``, ``max_weight = 1``): a value ``x`` is
clipped to ``[-c, c]`` and mapped to ``q = SR((x + c) Q / 2c)`` with ``Q = 2**22`` and ``SR``
stochastic rounding (``floor`` or ``ceil``, unbiased); the server gets
``(sum_k q_k) 2c/Q / n - c``. With step ``delta = 2c/Q``, each client's error is
``|x_hat_k - x_k| < delta`` (stochastic rounding moves by less than one step, not half), so
the mean's error is ``< delta`` per coordinate (worst case; its standard deviation is
``<= delta / (2 sqrt(n))``), plus float64 rounding of order ``n c 2**-52``. Clipped values
(``|x| > c``) are counted per round (``secure_clipped`` in ``rounds.jsonl``).

Dropouts: a client whose reply does not arrive within the stage timeout (or that answers
with an error) is out of the rest of the round. flwr 1.42 keeps a client lost *before* it
shared its keys in ``sampled_node_ids`` and in its neighbours' lists, so its unmask stage
asks the survivors for key shares they never received (a ``KeyError`` on every node: the
round fails). :class:`SecureWorkflow` therefore forgets such clients after the setup and
share-keys stages (as SecAgg+ prescribes: only clients that distributed shares are
reconstructed). A client lost after sharing keys is recovered from the survivors' shares;
when fewer than ``reconstruction_threshold`` shares or neighbours remain, the workflow halts:
the round is skipped (``NoValidReplies``) with the reason logged and stored in
``rounds.jsonl`` (``secure_halted``). A client lost in the *unmask* stage had its masked
vector summed already: it is in the mean, so it is listed in ``secure_unmask_lost``, not in
``dropped`` / ``rejected`` (unless the round halted). The server never holds a client's update or report:
it sees public keys, encrypted shares, masked integer vectors and key shares.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import FitIns, Parameters, Scalar, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.server.client_manager import SimpleClientManager
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState
from flwr.serverapp import Grid

from fedhv import safe_io
from fedhv.algorithms.base import Replies, Request
from fedhv.algorithms.validation import NoValidReplies, is_non_finite
from fedhv.config.flower import MODULUS_RANGE, QUANTIZATION_RANGE
from fedhv.config.schema import FlowerConfig
from fedhv.flower.federation import FlowerFederation, FlowerSetupError, NodeMap, round_trip
from fedhv.flower.protocol import PAYLOAD, STAGE, content_bytes
from fedhv.flower.secure_client import STAGE_JSON, unpack
from fedhv.sim.faults import FaultInjector

log = logging.getLogger("fedhv")

#: Test-only: a folder; every secure round writes ``<stream>-<round>.json`` (what reached the
#: server in each stage, and what the strategy received) and ``<stream>-<round>.npz`` (the
#: model, the aggregate, and the masked report slots) into it.
RECORD_ENV = "FEDHV_TEST_SECAGG_RECORD"


def quantization_step(clipping_range: float) -> float:
    """``delta = 2c / Q``: the SecAgg+ quantization step (``Q = 2**22``)."""
    return 2.0 * clipping_range / QUANTIZATION_RANGE


class MeanStrategy(Strategy):
    """The legacy strategy the SecAgg+ workflow talks to: hands out the round's ``FitIns`` and
    keeps the aggregate. ``received`` lists what ``aggregate_fit`` was given, per result."""

    def __init__(self) -> None:
        self.fitins: list[tuple[GridClientProxy, FitIns]] = []
        self.aggregate: list[np.ndarray] | None = None
        self.received: list[dict[str, Any]] = []

    def initialize_parameters(self, client_manager: Any) -> Parameters | None:
        return None

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: Any) -> list[Any]:
        return list(self.fitins)

    def aggregate_fit(self, server_round: int, results: list[Any], failures: list[Any]) -> tuple[None, dict]:
        """Keep the workflow's aggregate (every result carries the same aggregated parameters)."""
        first = results[0][1].parameters if results else None
        self.received = [{"node": int(proxy.node_id), "num_examples": int(res.num_examples),
                          "metrics": dict(res.metrics), "parameters_are_the_aggregate": res.parameters is first}
                         for proxy, res in results]
        self.aggregate = None if first is None else parameters_to_ndarrays(first)
        return None, {}

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: Any) -> list[Any]:
        return []

    def aggregate_evaluate(self, server_round: int, results: list[Any], failures: list[Any]) -> tuple[None, dict]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> None:
        return None


class SecureWorkflow(SecAggPlusWorkflow):
    """flwr's ``SecAggPlusWorkflow`` that notes each stage's outcome and forgets clients lost
    before they shared their keys (see the module docstring)."""

    def __init__(self, flower: FlowerConfig, timeout: float | None) -> None:
        super().__init__(flower.num_shares, flower.reconstruction_threshold, max_weight=1.0,
                         clipping_range=flower.clipping_range, quantization_range=QUANTIZATION_RANGE,
                         modulus_range=MODULUS_RANGE, timeout=timeout)
        self.halted: str | None = None
        self.masked: set[int] = set()  # nodes whose masked vectors were summed
        self.threshold = 0

    def _note(self, stage: str, ok: bool, state: WorkflowState, forget: bool = False) -> bool:
        self.threshold = state.threshold
        if ok and forget:
            alive = set(state.active_node_ids)
            state.sampled_node_ids = alive
            for nid in list(state.nid_to_neighbours):
                if nid in alive:
                    state.nid_to_neighbours[nid] &= alive
                else:
                    del state.nid_to_neighbours[nid]
        if not ok and self.halted is None:
            self.halted = (f"SecAgg+ halted in its {stage} stage: {len(state.active_node_ids)} clients left, fewer "
                           f"than flower.reconstruction_threshold = {state.threshold} live neighbours or shares")
        return ok

    def setup_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:  # type: ignore[override]
        return self._note("setup", super().setup_stage(grid, context, state), state, forget=True)

    def share_keys_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:  # type: ignore[override]
        return self._note("share-keys", super().share_keys_stage(grid, context, state), state, forget=True)

    def collect_masked_vectors_stage(self, grid: Grid, context: LegacyContext,  # type: ignore[override]
                                     state: WorkflowState) -> bool:
        ok = super().collect_masked_vectors_stage(grid, context, state)
        self.masked = set(state.active_node_ids)
        return self._note("collect-masked-vectors", ok, state)

    def unmask_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:  # type: ignore[override]
        return self._note("unmask", super().unmask_stage(grid, context, state), state)


class StageGrid:
    """The ``Grid`` the workflow talks to: fedhv's short polls (:func:`round_trip`) instead of
    ``send_and_receive``'s 3 s sleeps, with bytes, time and every reply noted per stage."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.seconds = 0.0
        self.stages: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        stage = str(messages[0].content.config_records[RECORD_KEY_CONFIGS][Key.STAGE]) if messages else ""
        down = [content_bytes(m.content) for m in messages]
        start = time.perf_counter()
        replies = round_trip(self.grid, messages, timeout) if messages else []
        self.seconds += time.perf_counter() - start
        self.stages.append({"stage": stage, "sent": [int(m.metadata.dst_node_id) for m in messages],
                            "down": down, "replies": replies})
        return replies


def _seen(reply: Message) -> dict[str, Any]:
    """What one reply brought to the server: its records, the arrays' dtypes and shapes, metrics."""
    if reply.has_error():
        return {"node": int(reply.metadata.src_node_id), "error": reply.error.reason}
    c = reply.content
    return {"node": int(reply.metadata.src_node_id),
            "arrays": {k: {n: [str(a.dtype), list(a.shape)] for n, a in r.items()} for k, r in c.array_records.items()},
            "metrics": {k: dict(r) for k, r in c.metric_records.items()},
            "configs": {k: sorted(r) for k, r in c.config_records.items()}}


class SecureFlowerFederation(FlowerFederation):
    """One round's clients through SecAgg+: every stage returns the means only.

    Same accounting as :class:`FlowerFederation`; one algorithm stage costs four message round
    trips (``stages += 4``), ``bytes_down`` / ``bytes_up`` are the mean serialized sizes of
    what each client received / sent in them, ``client_seconds`` the time of the round trips.
    ``extras`` (merged into the round's record) holds ``secure_clients`` (whose masked vectors
    were averaged), ``secure_clipped``, ``secure_unmask_lost`` (``[{client, reason}]``, only when
    some aggregated client was lost in the unmask stage: it is *not* in ``dropped`` /
    ``rejected``, which list clients left out of the mean) and, for a halted round,
    ``secure_halted`` (its lost clients stay dropped / rejected: nothing was aggregated).
    """

    def __init__(self, grid: Grid, nodes: NodeMap, clients: np.ndarray, round_idx: int, seed: int, stream: str,
                 config_sha: str, num_tasks: int, flower: FlowerConfig, timeout: float | None = None,
                 faults: FaultInjector | None = None) -> None:
        super().__init__(grid, nodes, clients, round_idx, seed, stream, config_sha, num_tasks, timeout, faults=faults)
        self.flower = flower
        run_id = int(getattr(getattr(grid, "run", None), "run_id", 0))
        self.context = Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config={})
        self.extras: dict[str, Any] = {}
        #: (client, reason) of clients lost in the unmask stage whose masked vector is in the aggregate
        self.unmask_lost: list[tuple[int, str]] = []

    def exchange(self, theta: torch.Tensor, request: Request) -> Replies:
        """One algorithm stage as one SecAgg+ round: the mean update (and report) of the clients."""
        if request.gradients is not None or request.first_step is not None or request.train is None:
            raise FlowerSetupError("secure aggregation masks local updates and reports only; this method's stage "
                                   "asks for gradients or client-held tensors (use fedhv, uniform or fsmgda)")
        strategy, by_node = MeanStrategy(), {}
        params = ndarrays_to_parameters([theta.detach().cpu().numpy()])
        for c, node, content in self._stage_contents(theta, request):
            config: dict[str, Scalar] = {STAGE_JSON: json.dumps(dict(content.config_records[STAGE]))}
            if PAYLOAD in content.config_records:
                config["fedhv.payload"] = json.dumps(dict(content.config_records[PAYLOAD]))
            strategy.fitins.append((GridClientProxy(node, self.grid, self.context.run_id), FitIns(params, config)))
            by_node[node] = c
        grid, workflow = StageGrid(self.grid), SecureWorkflow(self.flower, self.timeout)
        legacy = LegacyContext(self.context, strategy=strategy, client_manager=SimpleClientManager())
        legacy.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: self.round_idx + 1})
        legacy.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
        try:
            workflow(grid, legacy)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - a protocol failure skips the round, it does not end the run
            workflow.halted = workflow.halted or f"SecAgg+ failed: {type(exc).__name__}: {exc}"
        self._account(grid, by_node, workflow.masked if strategy.aggregate is not None else set())
        self.client_seconds += grid.seconds
        self.stages += len(grid.stages)
        if strategy.aggregate is None:
            self.extras = {"secure_halted": workflow.halted or "SecAgg+ returned no aggregate"}
            log.warning("round %d: %s; round skipped", self.round_idx + 1, self.extras["secure_halted"])
            self._record(grid, strategy, theta, None)
            self._clients = self._clients[:0]
            raise NoValidReplies(self.dropped, self.rejected)
        n = len(workflow.masked)
        deltas, report, clipped = unpack(strategy.aggregate, request.report is not None, n,
                                         self.flower.clipping_range)
        aggregated = np.asarray(sorted(by_node[nid] for nid in workflow.masked), dtype=np.int64)
        self._clients = aggregated
        self.extras = {"secure_clients": aggregated.tolist(), "secure_clipped": clipped}
        if self.unmask_lost:
            self.extras["secure_unmask_lost"] = [{"client": c, "reason": r} for c, r in self.unmask_lost]
        if clipped:
            log.warning("round %d: %d values clipped to +-flower.clipping_range = %g before masking",
                        self.round_idx + 1, clipped, self.flower.clipping_range)
        self._record(grid, strategy, theta, (deltas, report))
        out = Replies(clients=aggregated, deltas=torch.as_tensor(deltas).to(theta).unsqueeze(0))
        if report is not None:
            out.reports = torch.as_tensor(report, dtype=torch.float64).unsqueeze(0)
        return out

    def _account(self, grid: StageGrid, by_node: dict[int, int], aggregated: set[int]) -> None:
        """Bytes per client and stage; clients that never answered are dropped, errors rejected.

        A client lost in the *unmask* stage whose masked vector was summed (its node in
        ``aggregated``: the nodes of the round's aggregate, empty for a halted round) is neither:
        its input is in the mean. It goes to :attr:`unmask_lost` (``secure_unmask_lost`` in
        ``rounds.jsonl``) and is logged. In a halted round nothing was aggregated, so such a
        client stays dropped / rejected.
        """
        for st in grid.stages:
            self.bytes_down += round(float(np.mean(st["down"]))) if st["down"] else 0
            ok = [r for r in st["replies"] if not r.has_error()]
            self.bytes_up += round(float(np.mean([content_bytes(r.content) for r in ok]))) if ok else 0
            got = {int(r.metadata.src_node_id): r for r in st["replies"]}
            for node in st["sent"]:
                c = by_node.get(node)
                if c is None or c not in self._clients:
                    continue
                reply = got.get(node)
                if st["stage"] == "unmask" and node in aggregated and (reply is None or reply.has_error()):
                    why = ("no reply" + (f" within {self.timeout} s" if self.timeout else "") if reply is None
                           else f"Flower error {reply.error.code}: {reply.error.reason}")
                    self.unmask_lost.append((c, f"SecAgg+ unmask stage: {why}"))
                    log.warning("round %d: client %d lost in the SecAgg+ unmask stage (%s); its masked vector is "
                                "in the round's mean, its masks were removed with the others' shares",
                                self.round_idx + 1, c, why)
                elif reply is None:
                    self._drop(c, f"no reply in the SecAgg+ {st['stage']} stage"
                               + (f" within {self.timeout} s" if self.timeout else ""))
                elif reply.has_error():
                    reason = f"SecAgg+ {st['stage']} stage: Flower error {reply.error.code}: {reply.error.reason}"
                    self._reject(c, reason, own=is_non_finite(reason) and not self.faults.active)

    def _record(self, grid: StageGrid, strategy: MeanStrategy, theta: torch.Tensor,
                means: tuple[np.ndarray, np.ndarray | None] | None) -> None:
        """Test hook (:data:`RECORD_ENV`): what reached the server this round."""
        folder = os.environ.get(RECORD_ENV)
        if not folder:
            return
        name = Path(folder) / f"{self.stream}-{self.round_idx + 1}"
        stages = [{"stage": st["stage"], "sent": st["sent"], "replies": [_seen(r) for r in st["replies"]]}
                  for st in grid.stages]
        masked: dict[str, np.ndarray] = {}
        for st in grid.stages:
            for r in st["replies"]:
                if st["stage"] == "collect_masked_vectors" and not r.has_error():
                    vectors = r.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]
                    from flwr.common import bytes_to_ndarray

                    masked[f"masked-{r.metadata.src_node_id}"] = np.concatenate(
                        [bytes_to_ndarray(b).reshape(-1) for b in vectors[2:]])  # type: ignore[union-attr]
        info = {"stages": stages, "strategy_received": strategy.received, "extras": self.extras,
                "seed": self.seed, "stream": self.stream, "round": self.round_idx,
                "dropped": list(self.dropped), "rejected": [list(r) for r in self.rejected],
                "unmask_lost": [list(r) for r in self.unmask_lost],
                "node_map": {str(c): n for c, n in self.nodes.nodes.items()}}
        safe_io.write_json(name.with_suffix(".json"), info, default=str)
        arrays = {"theta": theta.detach().cpu().numpy(), **masked}
        if means is not None:
            arrays["deltas"] = means[0]
            if means[1] is not None:
                arrays["report"] = means[1]
        np.savez(name.with_suffix(".npz"), **arrays)  # type: ignore[arg-type]
