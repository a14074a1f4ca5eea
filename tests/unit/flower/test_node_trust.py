"""A Flower node trusts its operator, not the server (:class:`fedhv.flower.node.NodeTrust`).

The server sends the run's configuration in the handshake. Before, a configuration naming
``data.benchmark = "module:attr"`` made every node import and call that module, ``data.root`` /
``data.download`` made nodes read (and create folders) at the server's path instead of their own
``FEDHV_DATA``, and ``threads = 64`` set the node's torch threads. Now a node imports only the
references its operator allowed (``--node-config allow-benchmarks='mod:attr'`` or
``FEDHV_ALLOW_BENCHMARKS``), reads its own data root and keeps its thread count. The last test runs
the refusal through a real SuperLink and SuperNode.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
import torch

from flower_support import needs_flwr

from conftest import SMALL, SUPPORT

BENCH = """setting = "trust"
method = "uniform"
rounds = 1
dtype = "float64"
engine = "sequential"
[data]
benchmark = "{ref}"
[partition]
clients = {clients}
samples_per_client = 60
[train]
clients_per_round = {clients}
batch_size = 8
local_steps = 2
[lr.uniform]
global = 1.0
local = 0.05
"""


@pytest.fixture()
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A ``module:attr`` benchmark on ``sys.path`` whose import writes ``IMPORTED`` next to it: ``(ref, folder)``."""
    name = f"node_bench_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "code"
    folder.mkdir()
    source = (SUPPORT / "bn_benchmark.py").read_text()
    mark = ('import os as _os\nopen(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "IMPORTED"), "w")'
            '.close()\n')
    (folder / f"{name}.py").write_text(source.replace("from __future__ import annotations\n",
                                                      "from __future__ import annotations\n\n" + mark, 1))
    monkeypatch.syspath_prepend(str(folder))
    try:
        yield f"{name}:make_benchmark", folder
    finally:
        sys.modules.pop(name, None)


def _server_config(*overrides: str) -> str:
    """A resolved configuration as the server sends it (``config.toml`` text), 3 clients."""
    from fedhv.config import dumps, load_config, to_dict

    return dumps(to_dict(load_config("multimnist", [*SMALL, "partition.clients=3", "train.clients_per_round=2",
                                                     *overrides])))


def test_a_node_imports_no_benchmark_its_operator_did_not_allow(planted: tuple[str, Path]) -> None:
    from fedhv.flower.node import NodeError, NodeWorker

    ref, folder = planted
    text = BENCH.format(ref=ref, clients=3)  # written by the server: never validated (imported) here
    with pytest.raises(NodeError, match=rf"names data.benchmark = '{ref}', code this node would import and run; "
                                        rf"its operator has not allowed it: .*allow-benchmarks='{ref}'"):
        NodeWorker(text, 0, 3)
    assert not (folder / "IMPORTED").exists() and ref.split(":")[0] not in sys.modules


def test_a_node_runs_a_benchmark_its_operator_allowed(planted: tuple[str, Path]) -> None:
    from fedhv.flower.node import NodeTrust, NodeWorker

    ref, folder = planted
    worker = NodeWorker(BENCH.format(ref=ref, clients=3), 1, 3, trust=NodeTrust(frozenset({ref})))
    assert (folder / "IMPORTED").exists() and worker.num_tasks == 2 and worker.data.parts.shape == (3, 60)
    env = NodeTrust.from_node_config({}, {"FEDHV_ALLOW_BENCHMARKS": f"other:x, {ref}"})
    assert ref in env.allow_benchmarks  # the operator's environment allows it too
    assert NodeTrust.from_node_config({"allow-benchmarks": f"{ref},a.b:c"}, {}).allow_benchmarks == {ref, "a.b:c"}


@pytest.mark.needs_data
def test_a_node_reads_its_own_data_root_not_the_servers(tmp_path: Path) -> None:
    """``data.root`` and ``data.download = true`` from the server: the node loads its data from its own
    ``FEDHV_DATA``, creates nothing at the server's path and downloads nothing."""
    from fedhv.flower.node import NodeWorker

    theirs = tmp_path / "server" / "data"
    worker = NodeWorker(_server_config(f"data.root={str(theirs)!r}", "data.download=true"), 0, 3)
    assert worker.cfg.data.root is None and worker.cfg.data.download is False
    assert worker.data.parts.shape[0] == 3
    assert not (tmp_path / "server").exists()
    from fedhv.flower.node import NodeTrust

    mine = NodeTrust.from_node_config({"data-root": "/node/own", "data-download": True}, {})
    assert (mine.data_root, mine.download) == ("/node/own", True)
    cfg = mine.run_config(_server_config(f"data.root={str(theirs)!r}"))
    assert (cfg.data.root, cfg.data.download) == ("/node/own", True)
    with pytest.raises(Exception, match=r"node-config data-download = 'yes': give true or false"):
        NodeTrust.from_node_config({"data-download": "yes"}, {})


@pytest.mark.needs_data
def test_a_node_keeps_its_own_thread_count() -> None:
    from fedhv.flower.node import NodeWorker

    before = torch.get_num_threads()
    try:
        worker = NodeWorker(_server_config("threads=64"), 2, 3)
        assert torch.get_num_threads() == before and worker.cfg.threads == 0
    finally:
        torch.set_num_threads(before)


@pytest.mark.deploy
@needs_flwr
def test_a_real_supernode_refuses_a_benchmark_the_server_names(tmp_path: Path) -> None:
    """A SuperLink and one SuperNode whose operator allowed nothing: a run naming a user benchmark
    fails at the handshake with the node's one-line reason (the fix: ``allow-benchmarks``)."""
    from fedhv.config import load_config
    from fedhv.flower.local import FlowerRunError, local_deployment

    setting = tmp_path / "bn.toml"
    setting.write_text(BENCH.format(ref="bn_benchmark:make_benchmark", clients=1))
    cfg = load_config(str(setting), [])  # the server's own (operator's) code: tests/ is on its PYTHONPATH
    with local_deployment(1) as dep:
        with pytest.raises(FlowerRunError) as failure:
            dep.submit(cfg, tmp_path / "run", stage_timeout=60.0)
        text = str(failure.value)
        log = next(Path(dep.workdir).glob("app-*/serverapp.log"), None)
        text += log.read_text() if log is not None else ""
    assert "allow-benchmarks='bn_benchmark:make_benchmark'" in text, text[-3000:]
    assert not (tmp_path / "run" / "summary.json").exists()
