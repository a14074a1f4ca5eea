"""fedhv's Flower ``ClientApp``: the client primitives on a SuperNode (``fedhv.flower.client:app``).

Two handlers (Message API):

- ``query``: the handshake. Stores the run's configuration in ``Context.state``, loads
  the node's data (``--node-config "partition-id=K num-partitions=N"``: partition ``K``
  of the built-in setting; with ``data-path=FILE`` the node's own samples,
  :mod:`fedhv.data.node_file`; what else the node allows: ``allow-benchmarks``, ``data-root``,
  ``data-download``, :class:`~fedhv.flower.node.NodeTrust`) and answers with what it serves, so the server maps
  Flower node ids (random per run) to client ids.
- ``train``: one synchronization stage (:mod:`fedhv.flower.protocol`), computed by
  :class:`~fedhv.flower.node.NodeWorker` with the simulator's sequential engine.

State held across stages lives in ``Context.state``, which the SuperNode keeps per run
and hands to every ClientApp execution (a fresh process per message under subprocess
isolation, or the long-lived :mod:`fedhv.flower.executor`): the configuration, the last
model received (FedCMOO's training stage sends none) and the gradients of the round's
last gradient stage (FedCMOO's first local step).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedhv.flower.node import NodeError, config_sha, worker_for
from fedhv.flower.node_config import node_partition, node_trust  # re-exported: this module's names before
from fedhv.flower.protocol import (
    HELD,
    HELLO,
    INFO,
    MODEL,
    NODE,
    TIMING,
    as_int,
    content_buffers,
    model_sha,
    result_content,
    stage_order,
)
from fedhv.flower.secure_client import is_secure, requires_secure, secure_stage

app = ClientApp()

_HELD_META = "fedhv.held-meta"


@app.query()
def hello(msg: Message, context: Context) -> Message:
    """Handshake: remember the run's configuration, load the node's data, say which client it is
    and what it serves (samples; file path and SHA-256 for data of its own)."""
    import fedhv

    if INFO in msg.content.config_records:  # the app's discovery: which partition, of how many
        pid, n, path = node_partition(context)
        info = {"partition-id": pid, "num-partitions": n, "fedhv-version": fedhv.__version__}
        return Message(RecordDict({NODE: ConfigRecord(info)}), reply_to=msg)  # type: ignore[arg-type]
    hello_record = msg.content.config_records[HELLO]
    theirs = str(hello_record.get("fedhv-version", "unknown (older than 0.1.0)"))
    if theirs != fedhv.__version__:
        raise NodeError(f"this SuperNode runs fedhv {fedhv.__version__} but the server runs fedhv {theirs}; install "
                        "the same fedhv version on the server and every node host")
    text = str(hello_record["config"])
    pid, n, path = node_partition(context)
    worker = worker_for(text, pid, n, path, node_trust(context))  # loads the data now and checks it fits the run
    context.state[HELLO] = ConfigRecord({"config": text})
    info: dict[str, int | str] = {"partition-id": pid, "num-partitions": n}
    info.update({k: v if isinstance(v, int) else str(v) for k, v in worker.provenance.items()})
    return Message(RecordDict({NODE: ConfigRecord(dict(info))}), reply_to=msg)  # type: ignore[arg-type]


@app.train()
def stage(msg: Message, context: Context) -> Message:
    """One synchronization stage for this node's client (a SecAgg+ stage goes through
    :func:`fedhv.flower.secure_client.secure_stage`)."""
    if is_secure(msg):
        return secure_stage(msg, context)
    if requires_secure(context):
        raise NodeError("this SuperNode runs with --node-config secure-aggregation=true and answers only SecAgg+ "
                        "stages; run with flower.secure_aggregation = true (fedhv flower local --secure)")
    if HELLO not in context.state.config_records:
        raise NodeError("stage message before the handshake: the server must send the query handshake first")
    text = str(context.state.config_records[HELLO]["config"])
    pid, n, path = node_partition(context)
    order, fields = stage_order(msg.content)
    if fields["config-sha"] != config_sha(text) or as_int(fields["client"], "client") != pid:
        raise NodeError(f"stage for client {fields['client']} of config {str(fields['config-sha'])[:12]} reached "
                        f"partition {pid} of config {config_sha(text)[:12]}; the server's node map is stale")
    worker = worker_for(text, pid, n, path, node_trust(context))
    held = context.state.array_records.get(HELD)
    meta = context.state.config_records.get(_HELD_META)
    if MODEL in msg.content.array_records:
        theta = torch.from_numpy(msg.content.array_records[MODEL]["theta"].numpy())
    elif held is not None and "theta" in held:
        theta = torch.from_numpy(held["theta"].numpy())
    else:
        raise NodeError(f"round {order.round + 1}: no model sent and none held; send the model in the first stage")
    if model_sha(theta) != fields["model-sha"]:
        raise NodeError(f"round {order.round + 1}: the model this node holds is not the server's (its Context.state "
                        "was not updated after the last stage); the server must send the model")
    grads = None
    # held gradients only count for the same run, round, stream and model they were computed at
    if (held is not None and "gradients" in held and meta is not None and as_int(meta["round"], "round") == order.round
            and str(meta["stream"]) == order.stream and as_int(meta["seed"], "seed") == order.seed
            and meta.get("model-sha") == fields["model-sha"] and meta.get("config-sha") == fields["config-sha"]):
        grads = torch.from_numpy(held["gradients"].numpy())
    start = time.perf_counter()
    result = worker.serve(theta, order, grads, content_buffers(msg.content))
    seconds = time.perf_counter() - start
    keep = {"theta": Array(theta.numpy())}
    if result.gradients is not None:
        keep["gradients"] = Array(np.ascontiguousarray(result.gradients))
        context.state[_HELD_META] = ConfigRecord({"round": order.round, "stream": order.stream, "seed": order.seed,
                                                  "model-sha": str(fields["model-sha"]),
                                                  "config-sha": str(fields["config-sha"])})
    elif grads is not None:
        keep["gradients"] = Array(grads.numpy())
    context.state[HELD] = ArrayRecord(keep)
    content = result_content(result)
    content[TIMING] = MetricRecord({"seconds": seconds})
    return Message(content, reply_to=msg)
