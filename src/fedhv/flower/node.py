"""A SuperNode's own computation: one client of a setting (no ``flwr`` import).

A node holds one partition ``K`` of a built-in setting (``partition-id = K``), or its own
samples from a file (``data-path``, :mod:`fedhv.data.node_file`), and serves
the three client primitives of :mod:`fedhv.algorithms.base` with the simulator's
reference code: a :class:`~fedhv.sim.engine.SequentialEngine` over *only the node's
samples*. Every random draw is keyed by ``(seed, stream, round, client)``
(:mod:`fedhv.sim.plan`) and only gathers from the client's index list, so re-indexing
the node's samples as ``0 .. S-1`` changes no value: the node computes exactly what
the simulator computes for client ``K``.

A node trusts its operator, not the server (:class:`NodeTrust`, from the SuperNode's
``--node-config``): the run's configuration comes from the server, but

- a ``data.benchmark = "module:attr"`` (code the node would import and call) is refused unless the
  operator allowed exactly that reference (``allow-benchmarks='mod:attr,...'`` in the node config,
  or ``FEDHV_ALLOW_BENCHMARKS`` in the node's environment);
- the data root is the node's own (``data-root`` in the node config, else ``FEDHV_DATA``, else the
  default), never ``data.root`` from the server, and it downloads missing files only when its
  operator says so (``data-download=true``), whatever ``data.download`` the server sends;
- the torch thread count stays the node's (``OMP_NUM_THREADS``); the server's ``threads`` is ignored.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import tomllib
import torch

from fedhv.algorithms.base import StepDraw
from fedhv.algorithms.validation import ClientReply
from fedhv.code_digest import reference_module
from fedhv.config import dumps, to_dict
from fedhv.config.loader import config_from_toml_text
from fedhv.config.schema import RunConfig
from fedhv.data.federated import FederatedData
from fedhv.data.node_file import NodeDataError, load_node_file
from fedhv.errors import FedHVError
from fedhv.experiment.checkpoint import config_digest
from fedhv.experiment.setup import federated_data, local_training, new_model
from fedhv.sim.engine import SequentialEngine
from fedhv.sim.faults import FaultInjector, no_faults


class NodeError(FedHVError):
    """A node cannot serve a request (wrong partition, unknown configuration, bad request)."""


#: The older name of :func:`fedhv.experiment.checkpoint.config_digest`, fedhv's one config digest (the
#: SHA-256 of a run's resolved ``config.toml`` text: it names the run on the nodes and in its checkpoint).
config_sha = config_digest


#: The node's environment variable allowing ``module:attr`` benchmarks (comma-separated), as ``allow-benchmarks``.
ALLOW_ENV = "FEDHV_ALLOW_BENCHMARKS"


@dataclass(frozen=True)
class NodeTrust:
    """What a node's operator allows the server's configuration to make the node do.

    Attributes
    ----------
    allow_benchmarks : frozenset of str
        ``module:attr`` benchmarks the node may import and call (exact references).
    data_root : str or None
        The node's data folder (``None``: ``$FEDHV_DATA`` or the default); ``data.root`` from the
        server is never used.
    download : bool
        Download missing benchmark files into the node's data root (default no).
    """

    allow_benchmarks: frozenset[str] = field(default_factory=frozenset)
    data_root: str | None = None
    download: bool = False

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, object],
                         environ: Mapping[str, str] | None = None) -> NodeTrust:
        """From the SuperNode's ``--node-config`` (``allow-benchmarks``, ``data-root``, ``data-download``)
        and its environment (:data:`ALLOW_ENV`)."""
        env = os.environ if environ is None else environ
        allow = [str(node_config.get("allow-benchmarks", "") or ""), env.get(ALLOW_ENV, "")]
        names = frozenset(x.strip() for text in allow for x in text.split(",") if x.strip())
        download = node_config.get("data-download", False)
        if not isinstance(download, bool):
            raise NodeError(f"node-config data-download = {download!r}: give true or false")
        root = node_config.get("data-root")
        return cls(names, str(root) if root else None, download)

    def run_config(self, config_text: str) -> RunConfig:
        """The server's configuration as this node runs it: its benchmark checked against
        :attr:`allow_benchmarks` before anything is imported, the node's own data root and download
        choice in place of the server's, the server's ``threads`` dropped."""
        try:
            raw = tomllib.loads(config_text)
        except tomllib.TOMLDecodeError as exc:
            raise NodeError(f"the server's configuration is not TOML ({exc})") from None
        data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
        benchmark = data.get("benchmark", "multimnist")
        if isinstance(benchmark, str) and reference_module(benchmark) is not None \
                and benchmark not in self.allow_benchmarks:
            raise NodeError(
                f"the server's configuration names data.benchmark = {benchmark!r}, code this node would import and "
                "run; its operator has not allowed it: start the SuperNode with --node-config "
                f"\"allow-benchmarks='{benchmark}'\" (or set {ALLOW_ENV}={benchmark}) to allow it")
        data = {k: v for k, v in data.items() if k != "root"}
        if self.data_root is not None:
            data["root"] = self.data_root
        data["download"] = self.download
        mine = {k: v for k, v in raw.items() if k != "threads"}
        mine["data"] = data
        return config_from_toml_text(dumps(mine))


class OneClientParts:
    """The ``parts`` of a node's data (a :class:`fedhv.data.parts.ClientParts`): indexes like the
    ``[N, S]`` partition, but holds only row ``client`` (``0 .. S-1``, its samples re-indexed); any
    other row is an error.

    A full ``[N, S]`` copy per client cost 5 MB at N = 10,000 (S = 64), times every client a
    Simulation Engine actor serves: 14 GB in one actor before this class.
    """

    def __init__(self, client: int, num_clients: int, size: int, device: torch.device) -> None:
        self.client, self.num_clients = client, num_clients
        self.row = torch.arange(size, device=device)

    def __getitem__(self, c: int) -> torch.Tensor:
        if int(c) != self.client:
            raise NodeError(f"this node holds client {self.client}'s samples only, not client {int(c)}'s")
        return self.row

    def __len__(self) -> int:
        return self.num_clients

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_clients, len(self.row))

    def reshape(self, *shape: int) -> torch.Tensor:
        """The node's sample indices (only ``reshape(-1)`` is meaningful)."""
        return self.row

    def to(self, device: torch.device | str) -> OneClientParts:
        return OneClientParts(self.client, self.num_clients, len(self.row), torch.device(device))


def node_data(data: FederatedData, client: int) -> FederatedData:
    """Only ``client``'s training samples, re-indexed ``0 .. S-1`` (no evaluation sets).

    ``parts`` (:class:`OneClientParts`) indexes like the ``[N, S]`` partition, so client ids
    stay valid, but holds only ``client``'s row.
    """
    own = data.parts[client]
    parts = OneClientParts(client, data.num_clients, len(own), own.device)
    return dataclasses.replace(data, train_x=data.train_x[own].clone(), train_y=data.train_y[own].clone(),
                               parts=parts, eval_sets={})


#: ``key`` (the data / partition configuration), ``full`` (the benchmark) and ``clients`` (client ->
#: its samples): one process may serve several clients, as a Simulation Engine actor serves many
#: virtual SuperNodes; they share the benchmark and each keeps its samples.
_DATA: dict[str, object] = {}


def partition_data(cfg: RunConfig, client: int) -> FederatedData:
    """:func:`node_data` of the built-in setting, kept for the next run of the same data.

    A long-lived ClientApp process serves run after run (a grid, a resumed run, the tests);
    the node's samples depend only on ``[data]``, ``[partition]``, ``dtype``, ``device`` and
    the data / cache folders, so a run that changes anything else (seed, method, rounds,
    learning rates) reuses them instead of loading the benchmark again. A process that serves
    several clients (a Simulation Engine actor) keeps the benchmark and each client's samples;
    one that serves one client (a SuperNode) keeps only its samples.
    The tensors are never written to (engines only gather from them).
    """
    d = to_dict(cfg)
    key = json.dumps([d["data"], d["partition"], cfg.dtype, cfg.device, os.environ.get("FEDHV_DATA"),
                      os.environ.get("FEDHV_CACHE")], sort_keys=True, default=str)
    if _DATA.get("key") != key:  # another benchmark or partition: forget the previous one's clients
        _DATA.clear()
        _DATA["key"] = key
    clients: OrderedDict[int, FederatedData] = _DATA.setdefault("clients", OrderedDict())  # type: ignore[assignment]
    if client in clients:
        clients.move_to_end(client)
    else:
        full = _DATA.get("full")
        if full is None:
            full = _DATA["full"] = federated_data(cfg)  # type: ignore[assignment]
        clients[client] = node_data(full, client)  # type: ignore[arg-type]
        if len(clients) == 1 and _DATA.get("many") is None:  # one client (a real SuperNode): its samples only
            del _DATA["full"]
        else:
            _DATA["many"] = True
        while len(clients) > MAX_CLIENTS:  # an actor of many virtual SuperNodes: the least recently served go
            clients.popitem(last=False)
    return clients[client]


@dataclass
class StageOrder:
    """What the server asks of this node in one stage (decoded from the message).

    ``report``: ``None``, ``"all"`` or a batch count; ``gradients`` / ``train``: task
    weight rows ``[T, m]`` (float64) or ``None``; ``first_step_held``: the first local
    step uses ``train @ G`` with ``G`` the gradients this node computed in the round's
    last gradient stage (kept by the node, never sent back down); ``train_draw``: the node draws
    the weights of every local step itself (:class:`~fedhv.algorithms.base.StepDraw`).
    """

    round: int
    seed: int
    stream: str
    report: int | str | None = None
    gradients: np.ndarray | None = None
    train: np.ndarray | None = None
    first_step_held: bool = False
    stage: int = 0
    train_draw: StepDraw | None = None


@dataclass
class StageResult:
    """A node's reply: report ``[m]``, gradients / deltas ``[T, d]`` (``None`` = not asked)."""

    report: np.ndarray | None = None
    gradients: np.ndarray | None = None
    deltas: np.ndarray | None = None
    buffers: list[np.ndarray] | None = None  # the model's buffers after training (models with buffers)


class NodeWorker:
    """Client ``partition`` of the run described by ``config_text``.

    Parameters
    ----------
    config_text : str
        The run's resolved configuration (``config.toml``), sent by the server in the
        handshake.
    partition, num_partitions : int
        This node's ``--node-config`` (``partition-id``, ``num-partitions``);
        ``num_partitions`` must equal the setting's ``partition.clients``.
    data_path : str, optional
        ``--node-config data-path=FILE``: serve the node's own samples from ``FILE``
        (:mod:`fedhv.data.node_file`) instead of partition ``partition`` of the built-in
        setting; the node then never reads the benchmark. ``partition`` still names
        the client the node is (sampling and the server's records use it).
    trust : NodeTrust, optional
        What the node's operator allows (default: no ``module:attr`` benchmark, the node's
        ``FEDHV_DATA``, no download).
    """

    def __init__(self, config_text: str, partition: int, num_partitions: int, data_path: str | None = None,
                 trust: NodeTrust | None = None) -> None:
        cfg = (trust or NodeTrust()).run_config(config_text)
        n = cfg.partition.clients
        if num_partitions != n or not 0 <= partition < n:
            raise NodeError(
                f"node-config partition-id={partition} num-partitions={num_partitions} does not fit the run's "
                f"partition.clients = {n}; start the SuperNodes with partition-id in 0..{n - 1} and "
                f"num-partitions={n}"
            )
        self.cfg: RunConfig = cfg
        self.sha = config_digest(config_text)
        self.client = partition  # the node's thread count is its operator's (OMP_NUM_THREADS), not cfg.threads
        if data_path:
            self.data = load_node_file(data_path, cfg, partition, n)
            self.model = new_model(cfg, self.data, cfg.seed)
            self._check_fits(data_path)
        else:
            self.data = partition_data(cfg, partition)
            self.model = new_model(cfg, self.data, cfg.seed)

    @property
    def provenance(self) -> dict[str, object]:
        """What this node serves: its own file (path, SHA-256, samples) or the built-in partition."""
        if "node_file" in self.data.provenance:
            return dict(self.data.provenance)
        return {"samples": int(self.data.parts.shape[1])}

    def _check_fits(self, data_path: str) -> None:
        """One forward pass and loss on the file's first samples: images of another size or
        channel count fail here, with the file named, not in the first round."""
        x, y = self.data.train_x[:2], self.data.train_y[:2]
        try:
            with torch.no_grad():
                losses, _ = self.data.objective.per_sample(self.model(x), y)
        except (RuntimeError, IndexError, ValueError) as e:
            raise NodeDataError(
                f"node data file {data_path!r}: images {list(self.data.train_x.shape[1:])} (C, H, W) do not fit the "
                f"{self.cfg.data.benchmark} model ({str(e).splitlines()[0]}); serve images of the benchmark's size"
            ) from None
        if not bool(torch.isfinite(losses).all()):
            raise NodeDataError(f"node data file {data_path!r}: the model's losses on its first samples are not finite")

    @property
    def num_tasks(self) -> int:
        return self.data.num_tasks

    def engine(self, seed: int, stream: str) -> SequentialEngine:
        """The reference engine keyed like the simulator's for ``(seed, stream)``."""
        c = self.cfg
        return SequentialEngine(self.model, self.data, local_steps=c.train.local_steps,
                                batch_size=c.train.batch_size, lr_local=c.lr_local, momentum=c.train.momentum,
                                seed=seed, stream=stream, precision=c.precision, local=local_training(c))

    def serve(self, theta: torch.Tensor, order: StageOrder, held: torch.Tensor | None,
              buffers: list[np.ndarray] | None = None) -> StageResult:
        """Run one stage at ``theta``; ``held`` = this node's gradients ``[T', d]`` of the round's last
        gradient stage (needed when ``order.first_step_held``); ``buffers``: the global model buffers
        (loaded first; after training the node's own are returned)."""
        e = self.engine(order.seed, order.stream)
        theta = theta.to(device=e.device, dtype=e.dtype)
        if buffers is not None and e.buffers:
            # (sizes, not shapes: a 0-d buffer such as num_batches_tracked may arrive as [1])
            if [np.size(b) for b in buffers] != [b.numel() for b in e.buffers]:
                raise NodeError(f"round {order.round + 1}: the server sent {len(buffers)} model buffers that do not "
                                f"fit this node's model ({len(e.buffers)}); the node and server models differ")
            e.load_buffers([torch.from_numpy(np.asarray(b)).reshape(d.shape).to(device=d.device, dtype=d.dtype)
                            for b, d in zip(buffers, e.buffers)])
        clients, t = np.array([self.client]), order.round
        out = StageResult()
        if order.report is not None:
            out.report = e.reports(theta, clients, t, order.report)[0].detach().cpu().numpy()
        if order.gradients is not None:
            out.gradients = e.gradients(theta, clients, order.gradients, t)[0].detach().cpu().numpy()
        if order.train is not None:
            first = None
            if order.first_step_held:
                if held is None:
                    raise NodeError(f"round {t + 1}: the server asked for a first step from held gradients, "
                                    "but this node holds none; run the round's gradient stage first")
                w = e.as_tensor(order.train)
                first = torch.einsum("ti,id->td", w, held.to(device=e.device, dtype=e.dtype)).unsqueeze(0)
            out.deltas = e.train(theta, clients, order.train, t, first, order.train_draw)[0].detach().cpu().numpy()
            if e.buffers:
                out.buffers = [b.cpu().numpy() for b in e.buffer_snapshot()]
        return self.corrupted(out, order)

    def faults(self, seed: int, stream: str) -> FaultInjector:
        """The run's ``faults.*`` garbage injection, as the simulator applies it: training rounds only."""
        if stream != "train":
            return no_faults()
        f = self.cfg.faults
        return FaultInjector(corrupt_reports=f.corrupt_reports, corrupt_updates=f.corrupt_updates,
                             poison_updates=f.poison_updates, seed=seed, stream=stream)

    def corrupted(self, out: StageResult, order: StageOrder) -> StageResult:
        """``out`` with the garbage ``faults.corrupt_*`` / ``poison_updates`` put in the simulator's
        client replies (same keyed draws): a node configured to misbehave really sends it."""
        injector = self.faults(order.seed, order.stream)
        if not injector.active:
            return out
        reply = ClientReply(self.client, report=None if out.report is None else torch.from_numpy(out.report),
                            deltas=None if out.deltas is None else torch.from_numpy(out.deltas),
                            gradients=None if out.gradients is None else torch.from_numpy(out.gradients))
        bad = injector.corrupt(reply, order.round, order.stage)
        if bad is reply:
            return out

        def arr(x: object) -> np.ndarray | None:
            return None if x is None else torch.as_tensor(x).detach().cpu().numpy()

        return StageResult(report=arr(bad.report), gradients=arr(bad.gradients), deltas=arr(bad.deltas),
                           buffers=out.buffers)


_WORKERS: OrderedDict[tuple[str, int, int, str, NodeTrust], NodeWorker] = OrderedDict()
#: Workers (model, engine) and clients' samples one process keeps: a Simulation Engine actor serves
#: thousands of virtual SuperNodes; the least recently served are rebuilt when served again.
MAX_WORKERS, MAX_CLIENTS = 64, 1024


def worker_for(config_text: str, partition: int, num_partitions: int, data_path: str | None = None,
               trust: NodeTrust | None = None) -> NodeWorker:
    """The (cached) worker of this process for a run: a long-lived ClientApp process loads
    the data once per run, not once per message. ``trust``: what the node's operator allows."""
    trust = trust or NodeTrust()
    key = (config_digest(config_text), partition, num_partitions, data_path or "", trust)
    if key not in _WORKERS:
        for old in [k for k in _WORKERS if k[0] != key[0]]:  # one run at a time: drop the previous run's workers
            del _WORKERS[old]
        _WORKERS[key] = NodeWorker(config_text, partition, num_partitions, data_path, trust)
        while len(_WORKERS) > MAX_WORKERS:
            _WORKERS.popitem(last=False)
    _WORKERS.move_to_end(key)
    return _WORKERS[key]
