"""The messages of fedhv's Flower Strategies: the client's helpers and the evaluate replies' checks.

A ClientApp reads the task weights of a train message with :func:`task_weights`, answers it with
:func:`fedhv_reply` and answers an evaluate message with :func:`fedhv_evaluate_reply`. The
Strategies (:mod:`fedhv.flower.strategy`) validate every reply before it counts; the checks of an
evaluate reply (:func:`evaluate_reply_problem`) and of a train reply's records
(:func:`train_arrays_problem`, :func:`train_metrics_problem`) live here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from fedhv.algorithms.validation import ClientReply, ReplySpec, array_problem, count_problem, reply_problem
from fedhv.errors import ConfigError

WEIGHTS_KEY = "fedhv-weights"
REPORT_KEY = "fedhv-report"
UNIT_KEY = "fedhv-unit"  # 1 per reply (older servers weighted by it); the server now weights replies itself
EXAMPLES_KEY = "num-examples"
CALIBRATION_KEY = "fedhv-calibration"  # 1 in an aggregated train MetricRecord of a calibration round, else 0
MAX_EVALUATE_KEYS = 64

__all__ = ["fedhv_evaluate_reply", "fedhv_reply", "task_weights"]


def task_weights(msg: Message, num_tasks: int | None = None) -> list[float]:
    """The task weights ``wᵗ`` a FedHV / Uniform train message carries (client side).

    They are found in whichever ``ConfigRecord`` of the message holds ``"fedhv-weights"``:
    ``"config"`` unless the Strategy was built with another ``configrecord_key``.
    """
    holders = [rec for rec in msg.content.config_records.values() if WEIGHTS_KEY in rec]
    if len(holders) != 1:
        raise ConfigError(f"the train message has {len(holders)} ConfigRecords with {WEIGHTS_KEY!r} (expected 1): "
                          "send it with fedhv.flower.strategy.FedHVStrategy, UniformStrategy or fedhv_strategy")
    w = [float(v) for v in holders[0][WEIGHTS_KEY]]  # type: ignore[union-attr]
    if num_tasks is not None and len(w) != num_tasks:
        raise ConfigError(f"the server sent {len(w)} task weights but this client has {num_tasks} tasks")
    return w


def fedhv_reply(msg: Message, arrays: ArrayRecord, report: Sequence[float], num_examples: int,
                metrics: dict[str, float] | None = None) -> Message:
    """The client's reply to a train message: its arrays and, next to them, the report — its *m*
    task losses evaluated at the model it *received* (before training) — plus ``num-examples``.
    Further ``metrics`` (finite numbers) are accepted by the server only when its Strategy
    declares their keys (``metric_keys=[...]``); otherwise the reply is dropped."""
    values = [float(v) for v in report]
    if not values or not all(np.isfinite(values)):
        raise ConfigError(f"report = {values}: give the m finite task losses at the received model")
    record = {REPORT_KEY: values, UNIT_KEY: 1.0, EXAMPLES_KEY: int(num_examples), **(metrics or {})}
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(record)}), reply_to=msg)


def fedhv_evaluate_reply(msg: Message, metrics: Mapping[str, float | Sequence[float]], num_examples: int) -> Message:
    """The client's reply to an evaluate message: its metrics at the received model and the
    number of examples they were computed on (the server's aggregate is weighted by it, as
    FedAvg's). A metric is a finite number or a list of ``m`` finite numbers (one per task)."""
    if count_problem(num_examples, EXAMPLES_KEY, 1, 2**62) is not None:
        raise ConfigError(f"num_examples = {num_examples!r}: give the number (>= 1) of examples evaluated")
    record: dict[str, float | list[float]] = {}
    for key, value in metrics.items():
        if key == EXAMPLES_KEY:
            raise ConfigError(f"metrics has {EXAMPLES_KEY!r}: give it as num_examples=")
        row = [float(v) for v in value] if isinstance(value, (list, tuple, np.ndarray)) else [float(value)]
        if not row or not all(np.isfinite(row)):
            raise ConfigError(f"metric {key!r} = {value!r}: give a finite number or a list of finite numbers")
        record[key] = row if isinstance(value, (list, tuple, np.ndarray)) else row[0]
    record[EXAMPLES_KEY] = int(num_examples)
    return Message(RecordDict({"metrics": MetricRecord(record)}), reply_to=msg)


def evaluate_reply_problem(reply: Message, num_tasks: int, max_num_examples: int) -> str | None:
    """Why an evaluate reply must be dropped, or ``None``: no Flower error; one MetricRecord (and
    no ArrayRecord or ConfigRecord); ``num-examples`` an integer in ``[1, max_num_examples]``;
    at most 64 keys, each a finite number or a list of ``num_tasks`` finite numbers."""
    if reply.has_error():
        return f"Flower error {reply.error.code}: {reply.error.reason}"
    content = reply.content
    if len(content.metric_records) != 1 or content.array_records or content.config_records:
        return (f"{len(content.array_records)} ArrayRecords, {len(content.metric_records)} MetricRecords and "
                f"{len(content.config_records)} ConfigRecords; expected one MetricRecord "
                "(build the reply with fedhv.flower.strategy.fedhv_evaluate_reply)")
    metrics = next(iter(content.metric_records.values()))
    if EXAMPLES_KEY not in metrics:
        return f"metric key {EXAMPLES_KEY!r} missing (build the reply with fedhv.flower.strategy.fedhv_evaluate_reply)"
    problem = count_problem(metrics[EXAMPLES_KEY], EXAMPLES_KEY, 1, max_num_examples)
    if problem is not None:
        return problem
    if len(metrics) > MAX_EVALUATE_KEYS:
        return f"{len(metrics)} metric keys (at most {MAX_EVALUATE_KEYS})"
    for key, value in metrics.items():
        row = value if isinstance(value, list) else [value]
        if isinstance(value, list) and len(value) != num_tasks:
            return f"metric {key!r} is a list of {len(value)} values; a list metric has one value per task ({num_tasks})"
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) for v in row):
            return f"metric {key!r} = {value!r} is not a finite number (or a list of finite numbers)"
    return None


def train_arrays_problem(arrays: ArrayRecord, sent: Mapping[str, tuple[int, ...]],
                         dtypes: Mapping[str, np.dtype[Any]] | None = None) -> str | None:
    """Why a train reply's arrays must be dropped, or ``None``: exactly the broadcast arrays' names
    (``sent``: name -> shape) and shapes, real numbers, all finite, and (``dtypes``: name -> the broadcast
    dtype) each of a dtype that casts safely to the broadcast's: a float64 array of 1e300 is finite, and
    infinite in the clients' float32 model."""
    names = list(arrays.keys())
    if set(names) != set(sent) or len(names) != len(sent):
        missing, extra = sorted(set(sent) - set(names)), sorted(set(names) - set(sent))
        return f"array names differ from the broadcast ones (missing {missing[:5]}, unexpected {extra[:5]})"
    for name in names:
        value = arrays[name].numpy()
        problem = array_problem(f"array {name!r}", value, sent[name])
        if problem is not None:
            return problem
        want = None if dtypes is None else dtypes.get(name)
        if want is not None and not np.can_cast(value.dtype, want, "safe"):
            return (f"array {name!r} has dtype {value.dtype}, which does not fit the broadcast's {want} (its values "
                    "may not exist in the clients' model); reply in the dtype received")
    return None


def train_metrics_problem(metrics: MetricRecord, num_tasks: int, nonnegative: Sequence[bool],
                          metric_keys: Sequence[str], max_num_examples: int, need_examples: bool) -> str | None:
    """Why a train reply's MetricRecord must be dropped, or ``None``: a report of ``num_tasks``
    finite values (``>= 0`` where ``nonnegative``), ``fedhv-unit`` absent or 1, ``num-examples`` an
    integer in ``[1, max_num_examples]`` (required when ``need_examples``), the declared
    ``metric_keys`` as finite numbers, and no other key."""
    allowed = {REPORT_KEY, UNIT_KEY, EXAMPLES_KEY, *metric_keys}
    extra = sorted(set(metrics.keys()) - allowed)
    if extra:
        return f"unexpected metric keys {extra[:5]} (declare them with metric_keys=[...])"
    missing = [k for k in (REPORT_KEY, *metric_keys) if k not in metrics]
    if need_examples and EXAMPLES_KEY not in metrics:
        missing.append(EXAMPLES_KEY)
    if missing:
        return f"metric keys {missing} missing (build the reply with fedhv.flower.strategy.fedhv_reply)"
    report = metrics[REPORT_KEY]
    if not isinstance(report, list):
        return f"{REPORT_KEY} = {report!r} is not a list of {num_tasks} losses"
    problem = reply_problem(ClientReply(0, report=report), ReplySpec(num_tasks=num_tasks, dim=0, report=True,
                                                                     nonnegative=tuple(nonnegative)))
    if problem is not None:
        return problem
    if UNIT_KEY in metrics and metrics[UNIT_KEY] != 1:
        return f"{UNIT_KEY} = {metrics[UNIT_KEY]!r}, expected 1 (the server weights the replies, not the client)"
    if EXAMPLES_KEY in metrics:
        problem = count_problem(metrics[EXAMPLES_KEY], EXAMPLES_KEY, 1, max_num_examples)
        if problem is not None:
            return problem
    for key in metric_keys:
        value = metrics[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            return f"metric {key!r} = {value!r} is not a finite number"
    return None


def mean_metrics(records: Sequence[MetricRecord], share: Sequence[float], skip: Sequence[str] = ()) -> MetricRecord:
    """Per key, the ``share``-weighted mean over the records carrying it (shares renormalised
    among them); lists element-wise. Records in a fixed order give a bit-identical result."""
    out = MetricRecord()
    keys = sorted({k for rec in records for k in rec} - set(skip))
    for key in keys:
        rows = [(np.asarray(rec[key], dtype=np.float64), s) for rec, s in zip(records, share) if key in rec]
        total = sum(s for _, s in rows)
        mean = sum(((s / total) * row for row, s in rows), np.zeros_like(rows[0][0]))
        out[key] = mean.tolist() if mean.ndim else float(mean)
    return out


def node_id(reply: Message) -> int:
    """The node a reply comes from (``-1`` when it carries no readable metadata)."""
    try:
        return int(reply.metadata.src_node_id)
    except Exception:  # noqa: BLE001 - a reply without metadata is still dropped with a reason
        return -1


def records(reply: Message) -> tuple[ArrayRecord, MetricRecord]:
    """The one ArrayRecord and one MetricRecord of a (validated) train reply."""
    content = reply.content
    return next(iter(content.array_records.values())), next(iter(content.metric_records.values()))
