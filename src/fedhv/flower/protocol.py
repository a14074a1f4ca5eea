"""fedhv's messages over Flower's Message API: what each record of a message holds.

Handshake (``query`` message): the server sends ``ConfigRecord "fedhv.hello"`` with the
run's resolved ``config.toml`` text; the node replies ``ConfigRecord "fedhv.node"``
with its ``partition-id`` and ``num-partitions`` (from ``--node-config``).

Stage (``train`` message), server to node:

- ``ArrayRecord "fedhv.model"``: ``theta`` (absent when the stage sends no model: the
  node reuses the model it received last, as the protocol's clients do);
- ``ConfigRecord "fedhv.stage"``: ``round``, ``seed``, ``stream``, ``config-sha``,
  ``client``, ``stage`` (the stage's index in the round: keys the fault injection), ``model-sha`` (the model's SHA-256: a node that did not receive it checks
  the one it holds), ``report`` (``""`` = none, ``"all"`` or a batch count), the task-weight
  rows ``gradient-rows`` / ``train-rows`` (flattened float64 lists, ``[]`` = none) with
  ``tasks`` = ``m``, ``first-step`` (``"held-gradients"`` or ``""``) and ``train-draw`` (``""``, or the
  JSON of a :class:`~fedhv.algorithms.base.StepDraw` -- ``law``, ``key``, ``scale`` -- from which the node
  draws the weights of every local step itself);
- ``ConfigRecord "fedhv.payload"``: the request's extra broadcast (e.g. FedHV's task
  weights), as float lists;
- ``ArrayRecord "fedhv.buffers"`` (with the model, for a model with buffers such as
  BatchNorm's statistics): the global buffers ``b0000, b0001, ...`` in ``named_buffers`` order.

Node to server: ``MetricRecord "fedhv.report"`` (``losses``: ``m`` floats),
``ArrayRecord "fedhv.update"`` (``deltas`` and / or ``gradients``, ``[T, d]``) and, after
training a model with buffers, ``ArrayRecord "fedhv.buffers"`` (the node's buffers after its
trajectories; the server averages them over the valid replies, :mod:`fedhv.sim.engine`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common.serde import recorddict_to_proto

from fedhv.algorithms.base import Request, StepDraw
from fedhv.algorithms.validation import ClientReply
from fedhv.flower.node import StageOrder, StageResult

HELLO, NODE = "fedhv.hello", "fedhv.node"
#: A query that asks a node only for its partition (``partition-id``, ``num-partitions``): no data is loaded.
INFO = "fedhv.info"
MODEL, STAGE, PAYLOAD = "fedhv.model", "fedhv.stage", "fedhv.payload"
REPORT, UPDATE = "fedhv.report", "fedhv.update"
BUFFERS = "fedhv.buffers"
#: A reply's timing (``seconds``: the node's own compute for the stage); read and removed by the
#: server before it counts the reply's bytes, so the communication accounting is unchanged.
TIMING = "fedhv.timing"
HELD = "fedhv.held"  # Context.state: the node's last model and gradients
HELD_GRADIENTS = "held-gradients"


def model_sha(theta: torch.Tensor) -> str:
    """SHA-256 of a model's bytes: names the model a stage without one runs at."""
    return hashlib.sha256(np.ascontiguousarray(theta.detach().cpu().numpy()).tobytes()).hexdigest()


def content_bytes(content: RecordDict) -> int:
    """Serialized size of a message's content (Flower's protobuf encoding)."""
    return int(recorddict_to_proto(content).ByteSize())


def as_int(value: object, name: str) -> int:
    """A record's integer field (``TypeError`` naming it when it is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"{name} = {value!r} is not an integer")
    return int(value)


def _rows(weights: np.ndarray | None) -> list[float]:
    return [] if weights is None else [float(v) for v in np.asarray(weights, dtype=np.float64).reshape(-1)]


def stage_content(theta: torch.Tensor, request: Request, round_idx: int, seed: int, stream: str, sha: str,
                  client: int, num_tasks: int, stage_idx: int = 0,
                  buffers: list[torch.Tensor] | None = None) -> RecordDict:
    """The content of one stage message to ``client`` (``stage_idx``: the stage's index in the round;
    ``buffers``: the global model buffers, sent with the model when the model has any)."""
    report = "" if request.report is None else str(request.report)
    stage = ConfigRecord({
        "round": int(round_idx), "seed": int(seed), "stream": stream, "config-sha": sha, "client": int(client),
        "stage": int(stage_idx),
        "report": report, "tasks": int(num_tasks),
        "gradient-rows": _rows(request.gradients), "train-rows": _rows(request.train),
        "first-step": HELD_GRADIENTS if request.first_step is not None else "",
        "train-draw": _draw_text(request.train_draw),
        "model-sha": model_sha(theta),
    })
    records: dict[str, Any] = {STAGE: stage}
    if request.payload:
        records[PAYLOAD] = ConfigRecord({k: _rows(np.asarray(torch.as_tensor(v).cpu())) for k, v in
                                         request.payload.items()})
    if request.send_model:
        records[MODEL] = ArrayRecord({"theta": Array(theta.detach().cpu().numpy())})
        if buffers:
            records[BUFFERS] = _buffer_record(buffers)
    return RecordDict(records)


def _buffer_record(buffers: list[Any]) -> ArrayRecord:
    return ArrayRecord({f"b{i:04d}": Array(np.ascontiguousarray(torch.as_tensor(b).detach().cpu().numpy()))
                        for i, b in enumerate(buffers)})


def content_buffers(content: RecordDict) -> list[np.ndarray] | None:
    """The model buffers a message carries (in order), or ``None``."""
    if BUFFERS not in content.array_records:
        return None
    rec = content.array_records[BUFFERS]
    try:
        return [rec[k].numpy() for k in sorted(rec.keys())]
    except Exception:  # noqa: BLE001 - malformed arrays: treated as absent (the server then ignores them)
        return None


def _draw_text(draw: StepDraw | None) -> str:
    return "" if draw is None else json.dumps({"law": draw.law, "key": draw.key, "scale": float(draw.scale)})


def _draw(text: Any) -> StepDraw | None:
    """The :class:`StepDraw` a stage's ``train-draw`` names (``None`` for ``""``; ``ValueError`` when malformed)."""
    if not text:
        return None
    try:
        d = json.loads(str(text))
        return StepDraw(str(d["law"]), str(d["key"]), float(d["scale"]))
    except (TypeError, KeyError, json.JSONDecodeError) as exc:
        raise ValueError(f"train-draw {str(text)[:80]!r} is not a step draw ({exc})") from None


def _matrix(values: Any, m: int) -> np.ndarray | None:
    vals = list(values)
    if not vals:
        return None
    arr = np.asarray(vals, dtype=np.float64)
    if m <= 0 or arr.size % m:
        raise ValueError(f"{arr.size} task weights do not form rows of {m}")
    return arr.reshape(-1, m)


def stage_order(content: RecordDict) -> tuple[StageOrder, dict[str, Any]]:
    """Decode a stage message: the order and the ``fedhv.stage`` record as a dict."""
    stage = dict(content.config_records[STAGE])
    m = as_int(stage["tasks"], "tasks")
    report = str(stage["report"])
    order = StageOrder(
        round=as_int(stage["round"], "round"), seed=as_int(stage["seed"], "seed"), stream=str(stage["stream"]),
        report=None if report == "" else ("all" if report == "all" else as_int(report, "report")),
        gradients=_matrix(stage["gradient-rows"], m), train=_matrix(stage["train-rows"], m),
        first_step_held=stage["first-step"] == HELD_GRADIENTS, stage=as_int(stage.get("stage", 0), "stage"),
        train_draw=_draw(stage.get("train-draw", "")),
    )
    return order, stage


def result_content(result: StageResult) -> RecordDict:
    """A node's reply content."""
    records: dict[str, Any] = {}
    if result.report is not None:
        records[REPORT] = MetricRecord({"losses": [float(v) for v in result.report]})
    arrays = {name: Array(np.ascontiguousarray(value)) for name, value in
              (("deltas", result.deltas), ("gradients", result.gradients)) if value is not None}
    if arrays:
        records[UPDATE] = ArrayRecord(arrays)
    if result.buffers:
        records[BUFFERS] = _buffer_record(result.buffers)
    return RecordDict(records)


def client_reply(client: int, content: RecordDict) -> ClientReply:
    """A reply's content as a :class:`ClientReply` for the validator (``None`` where absent:
    the validator names what is missing or malformed)."""
    reply = ClientReply(client)
    if REPORT in content.metric_records:
        losses = content.metric_records[REPORT].get("losses")
        reply.report = losses if isinstance(losses, list) else None
        if reply.report is not None:
            try:  # float64: torch.as_tensor(list) in stack_replies would round to float32
                reply.report = np.asarray(losses, dtype=np.float64)
            except (TypeError, ValueError):
                pass  # left as sent: the validator rejects it
    if UPDATE in content.array_records:
        rec = content.array_records[UPDATE]
        for name in ("deltas", "gradients"):
            if name in rec:
                try:
                    setattr(reply, name, rec[name].numpy())
                except Exception:  # noqa: BLE001 - a malformed array is reported by the validator as missing
                    setattr(reply, name, None)
    reply.buffers = content_buffers(content)
    return reply
