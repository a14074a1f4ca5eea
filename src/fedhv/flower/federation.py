"""A :class:`~fedhv.algorithms.base.Federation` over Flower's ``Grid``: one Message-API round
trip per synchronization stage.

The algorithms (FedHV, Uniform, FSMGDA, FedCMOO) run unchanged on it. Each stage sends
one ``train`` message per remaining client (:mod:`fedhv.flower.protocol`) to the
SuperNode that holds the client's partition (learned in :func:`handshake`), waits for
the replies (``timeout`` seconds; ``None`` = until all arrived) and validates every
reply with :mod:`fedhv.algorithms.validation`, as the simulator does. A client that did
not answer in time is *dropped*, one whose reply is a Flower error or fails validation
is *rejected*; either way it is out of the rest of the round. Bytes are the serialized
sizes of the message contents actually sent and received (per client, the mean over
the clients of the stage). A SuperNode that died is answered by the SuperLink itself
(``NODE_UNAVAILABLE``, sent from the SuperLink's node id, after its heartbeat patience): that
is no reply of the client's, so it is dropped too.

Faults: with ``faults.corrupt_reports`` / ``corrupt_updates`` / ``poison_updates`` set, the
nodes put the simulator's garbage in their replies in training rounds
(:meth:`fedhv.flower.node.NodeWorker.corrupted`, keyed by the stage index sent in the
message); the federation's copy of the injector only tells that garbage from a client's
own divergence, as :class:`~fedhv.sim.federation.SimFederation` does.

Client-held tensors: a request's ``first_step`` (FedCMOO's first local step
``W @ G_k``) is not sent; the nodes keep the gradients ``G_k`` of the round's last
gradient stage and form it themselves. The federation checks that ``first_step``
really is ``train @ G_k`` for the gradients it received, and refuses any other
client-held tensor, which it could not reproduce on the nodes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedhv.algorithms.accounting import FederationAccounting
from fedhv.algorithms.base import Replies, Request, sample_weights
from fedhv.algorithms.validation import (
    REPORT_OUTLIER_RATIO,
    ClientReply,
    NoValidReplies,
    ReplySpec,
    count_problem,
    is_non_finite,
    norm_outliers,
    reply_problem,
    report_outliers,
    stack_replies,
)
from fedhv.errors import FedHVError
from fedhv.flower.protocol import HELLO, NODE, TIMING, as_int, client_reply, content_bytes, stage_content
from fedhv.sim.faults import FaultInjector, no_faults

log = logging.getLogger("fedhv")


def _numpy_dtype(dtype: torch.dtype) -> np.dtype[Any]:
    """The numpy dtype of a torch dtype (``torch.float32`` -> ``float32``)."""
    return np.dtype(str(dtype).removeprefix("torch."))


def _dtype_problem(reply: ClientReply, dtype: torch.dtype) -> str | None:
    """Why a reply's update or gradients do not fit the broadcast model's ``dtype``, or ``None``: a float64
    update of 1e300 is finite where :func:`reply_problem` looks and infinite in a float32 model (issue 52)."""
    want = _numpy_dtype(dtype)
    for name in ("deltas", "gradients"):
        value = getattr(reply, name, None)
        if isinstance(value, np.ndarray) and not np.can_cast(value.dtype, want, "safe"):
            return f"{name} have dtype {value.dtype}, which does not fit the model's {want}; reply in the model's dtype"
    return None


def round_trip(grid: Grid, messages: list[Message], timeout: float | None, poll_s: float = 0.02) -> list[Message]:
    """Push ``messages`` and pull their replies until all arrived or ``timeout`` s passed.

    ``Grid.send_and_receive`` of flwr 1.42 sleeps 3 s between pulls; polling every
    ``poll_s`` (growing to 0.2 s) cuts that latency from every stage.
    """
    ids = set(grid.push_messages(messages))
    deadline = None if timeout is None else time.monotonic() + timeout
    replies: list[Message] = []
    wait = poll_s
    while ids:
        got = list(grid.pull_messages(ids))
        replies.extend(got)
        ids.difference_update(m.metadata.reply_to_message_id for m in got)
        if not ids or (deadline is not None and time.monotonic() >= deadline):
            break
        time.sleep(wait)
        wait = min(wait * 1.5, 0.2)
    return replies


class FlowerSetupError(FedHVError):
    """The federation cannot start or continue (missing SuperNodes, bad node configs, protocol misuse)."""


@dataclass(frozen=True)
class NodeMap:
    """Which SuperNode holds which client (partition id = client id)."""

    nodes: dict[int, int]
    #: per client: what its node serves (``samples``; ``node_file`` and ``sha256`` for data of its own)
    served: dict[int, dict[str, object]] = dataclasses.field(default_factory=dict)

    def node(self, client: int) -> int | None:
        return self.nodes.get(int(client))


def handshake(grid: Grid, config_text: str, num_clients: int, wait_s: float = 120.0) -> NodeMap:
    """Wait for SuperNodes, send them the run's configuration, learn their partitions.

    Every partition ``0 .. num_clients-1`` must be served by exactly one SuperNode.
    """
    deadline = time.monotonic() + wait_s
    ids: list[int] = []
    while True:
        ids = sorted(grid.get_node_ids())
        if len(ids) >= num_clients or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if len(ids) < num_clients:
        raise FlowerSetupError(
            f"{len(ids)} SuperNodes connected within {wait_s:.0f} s but partition.clients = {num_clients}; start "
            f"one SuperNode per partition (--node-config \"partition-id=K num-partitions={num_clients}\")")
    import fedhv

    # the nodes refuse a server of another fedhv version (fedhv.flower.client.hello)
    content = RecordDict({HELLO: ConfigRecord({"config": config_text, "fedhv-version": fedhv.__version__})})
    replies = ask_nodes(grid, content, ids, deadline, "handshake")
    nodes: dict[int, int] = {}
    served: dict[int, dict[str, object]] = {}
    for reply in replies:
        src = reply.metadata.src_node_id
        if reply.has_error():
            raise FlowerSetupError(f"SuperNode {src} failed the handshake: {reply.error.reason}")
        rec = reply.content.config_records.get(NODE)
        problem = node_facts_problem(rec, num_clients)
        if problem is not None:
            raise FlowerSetupError(f"SuperNode {src} answered the handshake with {problem}; start it with fedhv's "
                                   f"ClientApp of this version and --node-config \"partition-id=K "
                                   f"num-partitions={num_clients}\"")
        assert rec is not None
        pid, n = as_int(rec["partition-id"], "partition-id"), as_int(rec["num-partitions"], "num-partitions")
        if pid in nodes:
            raise FlowerSetupError(f"SuperNodes {nodes[pid]} and {src} both claim partition-id={pid}; give each "
                                   "SuperNode its own partition-id")
        nodes[pid] = src
        served[pid] = {k: rec[k] for k in rec if k not in ("partition-id", "num-partitions")}
        if "node_file" in rec:
            log.info("SuperNode %d is client %d of %d with its own data: %s (%s samples, sha256 %s)", src, pid, n,
                     rec["node_file"], rec.get("samples"), str(rec.get("sha256", ""))[:16])
        else:
            log.info("SuperNode %d holds partition %d of %d", src, pid, n)
    missing = sorted(set(range(num_clients)) - set(nodes))
    if missing:
        raise FlowerSetupError(f"no SuperNode answered the handshake for partitions {missing}; start them with "
                               f"--node-config \"partition-id=K num-partitions={num_clients}\"")
    return NodeMap(nodes, served)


#: Largest sample count a SuperNode may report for its client (``samples``, the weight of its updates
#: with ``train.aggregation = "samples"``): more than any dataset fedhv reads holds.
MAX_NODE_SAMPLES = 2**31 - 1


def node_facts_problem(rec: Any, num_clients: int) -> str | None:
    """Why a SuperNode's handshake record (its self-reported facts) is unusable, or ``None``.

    ``partition-id`` must be an integer in ``[0, num_clients)``, ``num-partitions`` an integer,
    ``samples`` (when sent) an integer in ``[0, MAX_NODE_SAMPLES]``.
    """
    if not isinstance(rec, ConfigRecord):
        return f"no {NODE!r} record"
    for key, low, high in (("partition-id", 0, num_clients - 1), ("num-partitions", 1, MAX_NODE_SAMPLES),
                           ("samples", 0, MAX_NODE_SAMPLES)):
        if key not in rec:
            if key == "samples":
                continue
            return f"no {key!r}"
        problem = count_problem(rec[key], key, low, high)
        if problem is not None:
            return problem
    return None


def ask_nodes(grid: Grid, content: RecordDict, ids: list[int], deadline: float, group_id: str) -> list[Message]:
    """The replies of ``ids`` to a QUERY of ``content``. A node the SuperLink reports unavailable
    (not reconnected yet, e.g. after a SuperLink restart) is asked again until ``deadline``."""
    from flwr.common.constant import ErrorCode

    pending, replies = list(ids), []
    while True:
        messages = [Message(content, dst_node_id=i, message_type=MessageType.QUERY, group_id=group_id)
                    for i in pending]
        got = round_trip(grid, messages, max(deadline - time.monotonic(), 30.0))
        sent = dict(zip((m.metadata.message_id for m in messages), pending))  # ids set by the push
        retry = [sent.get(r.metadata.reply_to_message_id) for r in got
                 if r.has_error() and r.error.code == ErrorCode.NODE_UNAVAILABLE]
        replies += [r for r in got if not (r.has_error() and r.error.code == ErrorCode.NODE_UNAVAILABLE)]
        pending = [i for i in retry if i is not None]
        if not pending or time.monotonic() > deadline:
            return replies + [r for r in got if r.has_error() and r.error.code == ErrorCode.NODE_UNAVAILABLE]
        log.info("%s: SuperNodes %s not available yet; asking again", group_id, pending)
        time.sleep(1.0)


class FlowerFederation(FederationAccounting):
    """One round's sampled clients, served by SuperNodes through a ``Grid``.

    Same accounting as :class:`~fedhv.sim.federation.SimFederation`
    (:class:`~fedhv.algorithms.accounting.FederationAccounting`: ``bytes_down``,
    ``bytes_up``, ``stages``, ``client_seconds``, ``dropped``, ``rejected``,
    ``diverged``), so :func:`~fedhv.experiment.loop.run_rounds` records its rounds
    identically. ``client_seconds`` is the wall-clock time of the stages' round trips.
    """

    def __init__(self, grid: Grid, nodes: NodeMap, clients: np.ndarray, round_idx: int, seed: int, stream: str,
                 config_sha: str, num_tasks: int, timeout: float | None = None, max_update_norm: float = 0.0,
                 max_norm_ratio: float = 0.0, faults: FaultInjector | None = None, aggregation: str = "mean",
                 nonnegative: tuple[bool, ...] | None = None) -> None:
        super().__init__(np.asarray(clients), round_idx)
        #: Per task: whether its loss is >= 0 (``ReplySpec.nonnegative``; ``None``: every task, the built-in ones).
        self.nonnegative = nonnegative
        self.aggregation = aggregation
        self.grid, self.nodes = grid, nodes
        self.seed, self.stream, self.sha = seed, stream, config_sha
        self.num_tasks, self.timeout = num_tasks, timeout
        self.max_update_norm, self.max_norm_ratio = max_update_norm, max_norm_ratio
        self.faults = faults or no_faults()
        #: The engine holding the global model buffers (set by run_rounds for a model with buffers): sent
        #: with the model, replaced by the mean of the valid replies' buffers after a training stage.
        self.global_buffers: Any = None
        self._gradients: torch.Tensor | None = None  # [k, T, d] of the last gradient stage, in _clients order
        self._held_clients: list[int] = []
        #: Back-end facts for the round's record: ``node_seconds``, the nodes' own compute summed
        #: over the round's replies (the rest of ``client_seconds`` is messaging and waiting).
        self.extras: dict[str, float] = {}

    def _check_first_step(self, request: Request) -> None:
        first, train, held = request.first_step, request.train, self._gradients
        if first is None:
            return
        if train is None or held is None or held.shape[0] != first.shape[0]:
            raise FlowerSetupError("request.first_step needs the round's gradient stage and train rows: the Flower "
                                   "back-end only supports first steps the nodes form from their held gradients")
        w = torch.as_tensor(np.asarray(train), dtype=held.dtype, device=held.device)
        expected = torch.einsum("ti,kid->ktd", w, held)
        scale = float(expected.abs().max()) if expected.numel() else 0.0
        if not torch.allclose(first.to(expected), expected, rtol=1e-4, atol=1e-6 * max(scale, 1e-30)):
            raise FlowerSetupError("request.first_step is not train rows x the clients' held gradients; the Flower "
                                   "back-end cannot send other client-held tensors")

    def exchange(self, theta: torch.Tensor, request: Request) -> Replies:
        """Send one stage to the remaining clients, collect, validate and count the replies."""
        if len(self._clients) == 0:
            raise NoValidReplies(self.dropped, self.rejected)
        self._check_first_step(request)
        messages, sent_to, down = [], {}, []
        for c, node, content in self._stage_contents(theta, request):
            down.append(content_bytes(content))
            messages.append(Message(content, dst_node_id=node, message_type=MessageType.TRAIN,
                                    group_id=f"{self.stream}-{self.seed}-{self.round_idx + 1}"))
            sent_to[node] = c
        start = time.perf_counter()
        replies = round_trip(self.grid, messages, self.timeout) if messages else []
        self.client_seconds += time.perf_counter() - start
        self.stages += 1
        self.bytes_down += round(float(np.mean(down))) if down else 0
        got = self._collect(replies, sent_to)
        out = self._validated(got, request, theta)
        if self.aggregation == "samples" and out.deltas is not None:  # sizes from the nodes' handshake
            out.weights = sample_weights([self._samples(int(c)) for c in out.clients])
        return out

    def _samples(self, client: int) -> int:
        """The sample count ``client``'s node reported at the handshake (validated there; 1 when not sent)."""
        return int(self.nodes.served.get(client, {}).get("samples", 1))  # type: ignore[call-overload]

    def _stage_contents(self, theta: torch.Tensor, request: Request) -> Iterator[tuple[int, int, RecordDict]]:
        """``(client, node, content)`` of this stage for every remaining client; a client whose
        partition no SuperNode holds is dropped."""
        g = self.global_buffers
        buffers = g.buffer_snapshot() if g is not None and g.buffers and request.send_model else None
        for c in self._clients.tolist():
            node = self.nodes.node(c)
            if node is None:
                self._drop(c, "no SuperNode holds its partition")
                continue
            yield c, node, stage_content(theta, request, self.round_idx, self.seed, self.stream, self.sha, c,
                                         self.num_tasks, self.stages + 1, buffers)  # the simulator's stage key

    def _buffers_problem(self, reply: ClientReply) -> str | None:
        """Why a training reply's model buffers (BatchNorm statistics) cannot be merged, or ``None``."""
        g = self.global_buffers
        if reply.buffers is None or g is None or not g.buffers:
            return None
        sizes = [b.numel() for b in g.buffers]
        got = [int(np.size(b)) for b in reply.buffers]
        if got != sizes:
            return f"buffers have sizes {got}, expected {sizes}"
        for b, held in zip(reply.buffers, g.buffers):
            arr = np.asarray(b)
            if arr.dtype.kind not in "fiu" or not np.isfinite(arr.astype(np.float64)).all():
                return f"buffers have non-finite or non-numeric values (dtype {arr.dtype})"
            if not np.can_cast(arr.dtype, _numpy_dtype(held.dtype), "safe"):
                return f"buffers have dtype {arr.dtype}, which does not fit the model's {_numpy_dtype(held.dtype)}"
        return None

    def _merge_buffers(self, valid: list[ClientReply]) -> None:
        """Global buffers <- mean of the valid training replies' buffers (those that fit the model)."""
        g = self.global_buffers
        if g is None or not g.buffers:
            return
        sizes = [b.numel() for b in g.buffers]  # (a 0-d buffer may arrive as [1])
        sent = [r.buffers for r in valid if r.buffers is not None and [np.size(b) for b in r.buffers] == sizes]
        if not sent:
            return
        g.merge_buffers([torch.stack([torch.as_tensor(np.asarray(b[j])).reshape(g.buffers[j].shape) for b in sent])
                         .to(g.buffers[j].device) for j in range(len(sizes))])

    def _collect(self, replies: Iterable[Message], sent_to: dict[int, int]) -> dict[int, ClientReply]:
        got: dict[int, ClientReply] = {}
        up = []
        for reply in replies:
            client = sent_to.get(reply.metadata.src_node_id)
            if client is None or client in got:
                continue
            if reply.has_error():
                self._reject(client, f"Flower error {reply.error.code}: {reply.error.reason}")
                continue
            timing = reply.content.metric_records.get(TIMING)
            if timing is not None:  # the node's compute: a fact for rounds.jsonl, not counted as payload
                del reply.content[TIMING]
                seconds = timing.get("seconds")
                if isinstance(seconds, float) and np.isfinite(seconds) and seconds >= 0:
                    self.extras["node_seconds"] = self.extras.get("node_seconds", 0.0) + seconds
            up.append(content_bytes(reply.content))
            got[client] = client_reply(client, reply.content)
        self.bytes_up += round(float(np.mean(up))) if up else 0
        rejected = {c for c, _ in self.rejected}
        for c in sent_to.values():
            if c not in got and c not in rejected:
                self._drop(c, f"no reply within {self.timeout} s" if self.timeout else "no reply")
        return got

    def _validated(self, got: dict[int, ClientReply], request: Request, theta: torch.Tensor) -> Replies:
        spec = ReplySpec(
            num_tasks=self.num_tasks, dim=theta.numel(), report=request.report is not None,
            gradient_rows=0 if request.gradients is None else len(request.gradients),
            train_rows=0 if request.train is None else len(request.train),
            max_update_norm=self.max_update_norm, max_norm_ratio=self.max_norm_ratio,
            max_report_ratio=REPORT_OUTLIER_RATIO, nonnegative=self.nonnegative,
        )
        weighted = self.aggregation == "samples" and spec.train_rows > 0
        valid = []
        for c in self._clients.tolist():  # keep the sampled (sorted) order
            reply = got.get(c)
            if reply is None:
                continue
            problem = reply_problem(reply, spec) or _dtype_problem(reply, theta.dtype)
            if problem is None and spec.train_rows:
                problem = self._buffers_problem(reply)
            if problem is None and weighted and self._samples(c) < 1:
                problem = "its node reported 0 samples at the handshake (no weight with train.aggregation = samples)"
            if problem is None:
                valid.append(reply)
            else:  # garbage the node was configured to send (faults.*) is no sign of divergence
                injected = self.faults.active and self.faults.corrupt(reply, self.round_idx, self.stages) is not reply
                self._reject(c, problem, own=not injected and is_non_finite(problem))
        outliers = [n or r for n, r in zip(norm_outliers(valid, spec), report_outliers(valid, spec))]
        for reply, problem in zip(valid, outliers):
            if problem is not None:
                self._reject(reply.client, problem)
        valid = [r for r, problem in zip(valid, outliers) if problem is None]
        if not valid:
            self._clients = self._clients[:0]
            raise NoValidReplies(self.dropped, self.rejected)
        out = stack_replies(valid, spec, theta)
        if out.deltas is not None:
            self._merge_buffers(valid)
        self._clients = out.clients
        if out.gradients is not None:
            self._gradients = out.gradients
        elif self._gradients is not None:
            keep = [i for i, c in enumerate(self._held_clients) if c in set(out.clients.tolist())]
            self._gradients = self._gradients[keep]
        self._held_clients = out.clients.tolist()
        return out

    def _drop(self, client: int, why: str) -> None:
        self.dropped.append(client)
        self._clients = self._clients[self._clients != client]
        log.warning("round %d: client %d dropped: %s", self.round_idx + 1, client, why)

    def _reject(self, client: int, problem: str, own: bool = False) -> None:
        """Record and log the rejection (naming the client's SuperNode), and take ``client`` out of the
        rest of the round."""
        self._clients = self._clients[self._clients != client]
        self.rejected.append((client, problem))
        if own:
            self.diverged.append((client, problem))
        log.warning("round %d: client %d (SuperNode %s) rejected: %s", self.round_idx + 1, client,
                    self.nodes.node(client), problem)
