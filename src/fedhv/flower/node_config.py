"""What a SuperNode's ``--node-config`` says: which client it is and what its operator allows.

Shared by the ClientApp's plain stages (:mod:`fedhv.flower.client`) and its SecAgg+ stages
(:mod:`fedhv.flower.secure_client`).
"""

from __future__ import annotations

from flwr.app import Context

from fedhv.flower.node import NodeError, NodeTrust
from fedhv.flower.protocol import as_int


def node_partition(context: Context) -> tuple[int, int, str | None]:
    """``(partition-id, num-partitions, data-path or None)`` from the SuperNode's ``--node-config``."""
    cfg = context.node_config
    try:
        pid, n = as_int(cfg["partition-id"], "partition-id"), as_int(cfg["num-partitions"], "num-partitions")
    except (KeyError, TypeError, ValueError):
        raise NodeError(
            f"node-config {dict(cfg)} lacks integer partition-id / num-partitions; start the SuperNode with "
            "--node-config \"partition-id=K num-partitions=N\" (and data-path=FILE for data of its own)") from None
    path = cfg.get("data-path")
    return pid, n, (str(path) if path else None)


def node_trust(context: Context) -> NodeTrust:
    """What this SuperNode's operator allows (``--node-config``: ``allow-benchmarks``, ``data-root``,
    ``data-download``; :class:`~fedhv.flower.node.NodeTrust`)."""
    return NodeTrust.from_node_config(dict(context.node_config))
