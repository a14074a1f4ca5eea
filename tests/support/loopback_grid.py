"""An in-process Flower ``Grid`` for reply-validation tests: real ``flwr.app.Message`` objects, no network.

Each node is a function ``train message -> reply message`` (what its ClientApp returns); the grid
gives the messages it pushes a message id, as the SuperLink does, and hands each node's reply
back on the next pull. Only the transport is replaced: the Strategy / federation under test and
the messages are flwr's own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator

import pytest

flwr_grid = pytest.importorskip("flwr.serverapp")

from flwr.app import Message
from flwr.serverapp import Grid

Node = Callable[[Message], Message]


class LoopbackGrid(Grid):
    """``nodes``: node id -> its ClientApp's handler."""

    def __init__(self, nodes: dict[int, Node]) -> None:
        self.nodes = nodes
        self.pending: dict[str, Message] = {}
        self.pushed: list[Message] = []

    def set_run(self, run: object) -> None:  # pragma: no cover - not used by the code under test
        raise NotImplementedError

    @property
    def run(self) -> object:  # pragma: no cover
        raise NotImplementedError

    def create_message(self, *args: object, **kwargs: object) -> Message:  # pragma: no cover
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return sorted(self.nodes)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            self.pushed.append(msg)
            self.pending[msg.metadata.message_id] = self.nodes[msg.metadata.dst_node_id](msg)
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self.pending.pop(i) for i in list(message_ids) if i in self.pending]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(list(self.push_messages(messages)))


def task_identity(run_id: int = 1, node_id: int = 1, task_id: int = 1) -> Iterator[object]:
    """Set the run / node identity flwr's ``Message`` needs outside a SuperNode (fixture body;
    a SuperNode sets it before it runs a ClientApp handler)."""
    from flwr.supercore.task_identity import TaskIdentity

    names = ("_run_id", "_node_id", "_task_id")
    saved = [getattr(TaskIdentity, n) for n in names]
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, node_id, task_id
    yield TaskIdentity
    for name, value in zip(names, saved):
        setattr(TaskIdentity, name, value)
