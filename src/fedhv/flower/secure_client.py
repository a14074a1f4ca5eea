"""A SuperNode's side of secure aggregation: one stage's reply through flwr's ``secaggplus_mod``.

In secure mode (``flower.secure_aggregation = true``, :mod:`fedhv.flower.secure`) every
``train`` message carries SecAgg+'s ``secaggplus_configs`` record. :func:`secure_stage`
passes it to flwr 1.42's ``secaggplus_mod`` unchanged; in its *collect masked vectors*
stage the mod calls :func:`fit`, which computes the stage like the plain protocol
(:class:`~fedhv.flower.node.NodeWorker`) and returns a legacy ``FitRes`` whose parameters are
the **masked vector** (:func:`pack`):

    [deltas [T, d], report [m] (when asked), clip counter [2]]   all float64, num_examples = 1

The mod clips every value to ``[-c, c]``, quantizes it stochastically to ``[0, 2**22]``, adds
its masks and uploads only the masked integers; ``num_examples = 1`` gives every client the
same weight (the plain mean of the paper). The clip counter carries the number of values
``|x| > c`` of this reply in base ``Q = 2**22`` digits, each encoded as ``digit * (2c/Q) - c``,
a value the quantizer maps to exactly ``digit``, so the server learns only the *sum* of the
counts (:func:`unpack`).

The node checks its own reply before masking (the server cannot): a non-finite or negative
report, a non-finite update or one above ``validation.max_update_norm`` raises, so the node
answers that stage with an error and SecAgg+ treats it as dropped; the error names only the
kind of problem, never a value. The stochastic rounding draws from numpy's global generator
(flwr's ``quantize``); it is seeded per (seed, stream, round, client) just before the mod
quantizes, so a secure run is reproducible and resumes exactly.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.compat.common import recorddict_compat as compat

from fedhv.algorithms.validation import ClientReply, ReplySpec, reply_problem
from fedhv.config.flower import QUANTIZATION_RANGE
from fedhv.flower.node import NodeError, StageResult, config_sha, worker_for
from fedhv.flower.node_config import node_partition, node_trust
from fedhv.flower.protocol import HELLO, STAGE, as_int, model_sha, stage_order
from fedhv.objectives import nonnegative_losses
from fedhv.rng import derive_seed

#: FitIns config key holding the plain protocol's ``fedhv.stage`` record as JSON.
STAGE_JSON = "fedhv.stage"
#: Test-only: a JSON file ``[{"client": K, "round": R, "stage": "unmask", "action": "exit"}, ...]``:
#: when client K receives that SecAgg+ stage of round R, its ClientApp process exits (``"exit"``:
#: the client is lost, the server waits for it until the stage timeout) or the stage raises
#: (``"fail"``: the node answers with an error at once). Either way the client is lost between stages.
EXIT_ENV = "FEDHV_TEST_SECAGG_EXIT_FILE"


def is_secure(msg: Message) -> bool:
    """Whether ``msg`` is a SecAgg+ message (it carries the ``secaggplus_configs`` record)."""
    return RECORD_KEY_CONFIGS in msg.content.config_records


def requires_secure(context: Context) -> bool:
    """``--node-config secure-aggregation=true``: this node refuses plain (unmasked) stages."""
    value = context.node_config.get("secure-aggregation", False)
    return value is True or str(value).lower() == "true"


def clip_digits(count: int, clipping_range: float) -> np.ndarray:
    """``count`` as two base-``Q`` digits, each encoded as ``digit * 2c/Q - c`` (quantized to ``digit``)."""
    q = QUANTIZATION_RANGE
    digits = np.array([count // q, count % q], dtype=np.float64)
    return digits * (2.0 * clipping_range / q) - clipping_range


def pack(result: StageResult, clipping_range: float) -> list[np.ndarray]:
    """The masked vector of one reply: ``[deltas, report?, clip counter]`` as float64 arrays."""
    arrays = [np.ascontiguousarray(result.deltas, dtype=np.float64)]
    if result.report is not None:
        arrays.append(np.ascontiguousarray(result.report, dtype=np.float64).reshape(-1))
    clipped = sum(int((np.abs(a) > clipping_range).sum()) for a in arrays)
    return [*arrays, clip_digits(clipped, clipping_range)]


def unpack(mean: list[np.ndarray], report: bool, n: int, clipping_range: float
           ) -> tuple[np.ndarray, np.ndarray | None, int]:
    """Split the securely averaged vector of ``n`` clients into the mean update ``[T, d]``, the
    mean report ``[m]`` (or ``None``) and the total number of clipped values.

    A digit sum ``s`` comes back as the mean ``s (2c/Q) / n - c`` (to quantization exactness),
    so ``s = round((mean + c) n Q / 2c)``.
    """
    deltas, rest = mean[0], list(mean[1:])
    rep = rest.pop(0) if report else None
    counter = np.asarray(rest[0], dtype=np.float64)
    q = QUANTIZATION_RANGE
    sums = np.rint((counter + clipping_range) * n * q / (2.0 * clipping_range)).astype(np.int64)
    return deltas, rep, int(sums[0]) * q + int(sums[1])


def _redacted(problem: str) -> str:
    """A :func:`reply_problem` reason without the values it quotes (they would reach the server)."""
    problem = re.sub(r"\s*\[.*\]", "", problem)
    return re.sub(r"norm [0-9.e+-]+ exceeds", "norm exceeds", problem)


def _exit_if_asked(msg: Message, client: int) -> None:
    """Test hook (:data:`EXIT_ENV`): end this ClientApp process, or fail, at the configured stage."""
    path = os.environ.get(EXIT_ENV)
    if not path or not Path(path).is_file():
        return
    stage = str(msg.content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE, ""))
    for rule in json.loads(Path(path).read_text()):
        if int(rule["client"]) == client and str(rule["round"]) == msg.metadata.group_id and rule["stage"] == stage:
            if rule.get("action", "exit") == "exit":
                os._exit(3)
            raise NodeError(f"client {client} fails the SecAgg+ {stage} stage (test hook {EXIT_ENV})")


def _config_text(context: Context) -> str:
    if HELLO not in context.state.config_records:
        raise NodeError("stage message before the handshake: the server must send the query handshake first")
    return str(context.state.config_records[HELLO]["config"])


def fit(msg: Message, context: Context) -> Message:
    """The collect stage's computation, called by ``secaggplus_mod``: a ``FitRes`` with the
    packed reply (:func:`pack`) and ``num_examples = 1``; raises when the reply is invalid."""
    text = _config_text(context)
    pid, n, path = node_partition(context)
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    order, fields = stage_order(RecordDict({STAGE: ConfigRecord(json.loads(str(fitins.config[STAGE_JSON])))}))
    if fields["config-sha"] != config_sha(text) or as_int(fields["client"], "client") != pid:
        raise NodeError(f"stage for client {fields['client']} of config {str(fields['config-sha'])[:12]} reached "
                        f"partition {pid} of config {config_sha(text)[:12]}; the server's node map is stale")
    if order.gradients is not None or order.first_step_held or order.train is None:
        raise NodeError("secure aggregation masks local updates (and reports) only; this stage asks for gradients")
    theta = torch.from_numpy(parameters_to_ndarrays(fitins.parameters)[0])
    if model_sha(theta) != fields["model-sha"]:
        raise NodeError(f"round {order.round + 1}: the model received is not the one the stage names")
    worker = worker_for(text, pid, n, path, node_trust(context))
    result = worker.serve(theta, order, None)
    cfg = worker.cfg
    spec = ReplySpec(num_tasks=worker.num_tasks, dim=theta.numel(), report=order.report is not None,
                     train_rows=len(order.train), max_update_norm=cfg.validation.max_update_norm,
                     nonnegative=nonnegative_losses(worker.data.objective, worker.num_tasks))
    problem = reply_problem(ClientReply(pid, report=result.report, deltas=result.deltas), spec)
    if problem is not None:
        raise NodeError(f"client {pid} withholds its reply: {_redacted(problem)}")
    arrays = pack(result, cfg.flower.clipping_range)
    np.random.seed(derive_seed(order.seed, order.stream, "secagg-rounding", order.round, pid) % 2**32)
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), num_examples=1, metrics={})
    return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)


def secure_stage(msg: Message, context: Context) -> Message:
    """One SecAgg+ stage of this node's client, through flwr's ``secaggplus_mod``."""
    _exit_if_asked(msg, node_partition(context)[0])
    return secaggplus_mod(msg, context, fit)
