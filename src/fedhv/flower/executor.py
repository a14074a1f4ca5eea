"""A long-lived ClientApp process for a SuperNode started with ``--isolation process``.

With Flower's default ``--isolation subprocess`` a SuperNode starts a fresh
``flwr-clientapp`` process for every message, which imports torch and loads the node's
data each time (seconds per message). With ``--isolation process`` the SuperNode leaves
the ClientApp to an outside process; this module is that process:

    python -m fedhv.flower.executor --runtime-api-address 127.0.0.1:PORT [--parent-pid PID]

It imports torch and fedhv once, then loops like Flower's SuperExec: acquire a
ClientApp task from the SuperNode's Runtime API, and run it *in this process* the way
``flwr-clientapp`` does (pull the message and ``Context``, call
``fedhv.flower.client:app``, push the reply and the updated ``Context``), without
exiting. The node's data stay loaded between messages
(:func:`fedhv.flower.node.worker_for`). It uses flwr 1.42's runtime client helpers
(``flwr.supernode.runtime.run_clientapp``), the version pinned by ``fedhv[flower]``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from typing import Any

from flwr.app import Message
from flwr.app.error import Error
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
    AcquireTaskRequest,  # pylint: disable=E0611
    PullAppMessagesRequest,
    PullTaskInputRequest,
)
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

from fedhv.flower.client import app
from fedhv.flower.lifetime import alive

log = logging.getLogger("fedhv")


def _client(address: str, token: str | None = None) -> RuntimeHttpClient:
    interceptors: list[Any] = [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp" if token else "SuperExec")]
    if token:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    return RuntimeHttpClient.from_server_address(server_address=address, insecure=True, root_certificates=None,
                                                 interceptors=interceptors,
                                                 retry_invoker=make_simple_http_retry_invoker())


def pull_task_input(client: RuntimeHttpClient, backoff_s: float = 0.02, cap_s: float = 0.2) -> tuple[Message, Any]:
    """flwr 1.42's ``pull_task_input`` with a short retry backoff.

    A task is handed out as soon as the SuperNode has its message header, before the
    message's objects (the model) arrived; Flower's own pull retries after 1 s, 2 s, ...
    (up to 10 s), which alone cost 1-3 s per message here. Retrying after ``backoff_s``
    growing to ``cap_s`` removes that wait.
    """
    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id = res.task_id
    TaskIdentity.run_id = res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context = context_from_proto(res.context)
    run_from_proto(res.run), fab_from_proto(res.fab)  # validated like flwr-clientapp does
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    node, tree = Node(node_id=context.node_id), pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
        return_type=Message, initial_backoff=backoff_s, backoff_cap=cap_s,
    )
    message.metadata.__dict__["_message_id"] = tree.object_id  # as flwr-clientapp sets it
    return message, context


def run_task(address: str, token: str) -> None:
    """Serve one ClientApp task in this process (what ``flwr-clientapp`` does, minus the exit)."""
    client = _client(address, token)
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    heartbeat.start()
    context, reply, status, details = None, None, SubStatus.FAILED, "fedhv ClientApp task failed"
    t0 = time.perf_counter()
    try:
        message, context = pull_task_input(client)
        t1 = time.perf_counter()
        try:
            reply = app(message=message, context=context)
            status, details = SubStatus.COMPLETED, ""
        except Exception as exc:
            log.exception("ClientApp raised")
            reason = f"{type(exc)}:<'{exc}'>"
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message)
            details = reason
        t2 = time.perf_counter()
        push_message(client, reply, context)
        log.info("%s message: pulled in %.3f s, computed in %.3f s, pushed in %.3f s",
                 message.metadata.message_type, t1 - t0, t2 - t1, time.perf_counter() - t2)
    finally:
        push_task_output(client, context, status, details)
        if heartbeat.is_running:
            heartbeat.stop()
        client.close()


def serve_forever(address: str, parent_pid: int | None, poll_s: float = 0.05, idle_poll_s: float = 0.5,
                  hot_s: float = 2.0) -> None:
    """Acquire and run ClientApp tasks until the parent SuperNode is gone (or a signal arrives).

    The poll backs off while no task comes: ``poll_s`` until ``hot_s`` seconds after the last
    task, then growing 1.5x per empty poll up to ``idle_poll_s`` (an idle ClientApp asks its
    SuperNode twice a second; the SuperNode itself backs off the same way,
    :mod:`fedhv.flower.supernode`). 0.05 s adds 25 ms to a stage on average and, beside
    0.02 s, takes ~15 % off the deployment's CPU time in a short run (each poll is an HTTP
    request the SuperNode serves in Python).
    """
    client = _client(address)
    wait, last = poll_s, -float("inf")
    while True:
        if parent_pid is not None and not alive(parent_pid):
            return
        try:
            res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
        except Exception as exc:  # noqa: BLE001 - the SuperNode may still be starting
            log.debug("AcquireTask failed: %s", exc)
            time.sleep(0.5)
            continue
        if res.HasField("task") and res.token:
            try:
                run_task(address, res.token)
            except Exception:  # one task failed, not the node: serve the next one
                # Flower's own isolation starts a fresh process per message, so a message whose
                # objects cannot be pulled (e.g. one of a run whose SuperLink was killed while the
                # ServerApp pushed it) fails that message only; this process does the same.
                log.exception("ClientApp task failed (reported to the SuperNode); serving the next task")
            wait, last = poll_s, time.monotonic()
        else:
            time.sleep(wait)
            if time.monotonic() - last > hot_s:
                wait = min(wait * 1.5, max(idle_poll_s, poll_s))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="long-lived fedhv ClientApp process for one SuperNode")
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API (host:port)")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process (the SuperNode) ends")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fedhv-clientapp %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    from fedhv._malloc import tune_allocator

    tune_allocator()  # as fedhv run: local training re-faults its activations otherwise
    if args.parent_pid is not None:  # Flower's HTTP client retries a gone SuperNode without end: watch from a thread
        from fedhv.flower.lifetime import watch_parent

        watch_parent(args.parent_pid)
    try:
        serve_forever(args.runtime_api_address, args.parent_pid)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
