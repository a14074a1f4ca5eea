"""A user's own problems through the public API, as one sweep: each case and its expected outcome.

Every case either **works**, and then its trained model equals a plain-PyTorch replay of the
same federated rounds (float64, to 1e-10), or is **refused before round 1** with one line that
is a :class:`fedhv.FedHVError` naming the parameter, the value and the fix (the regular
expression of the case). The cases are the edge cases a stranger meets with their own model
and data: devices, methods, seeds, references, test sets, shared heads, id partitions, the
weighting modules, and the earlier ones (labels, targets, tasks, datasets).

The replay: every client holds exactly ``batch_size`` samples, so each local step is full-batch
gradient descent on ``sum_i w_i l_i`` (Uniform: ``w_i = 1/m``) whatever the batch order, all
clients are sampled, and the server adds the mean update (``lr_global = 1``).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedhv
from fedhv.weighting import HVBackward, HVWeighting

N_CLIENTS, PER_CLIENT, D = 4, 8, 4
TASKS = [fedhv.Task("cls", size=3), fedhv.Task("reg", "regression", 1)]


class MLP(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (3, 1)) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(D, 8), nn.Tanh())
        self.heads = nn.ModuleList([nn.Linear(8, w) for w in widths])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(x)
        return [head(h) for head in self.heads]


class SharedHead(nn.Module):
    """Two 3-class tasks read by one head module (registered twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(D, 8), nn.Tanh())
        head = nn.Linear(8, 3)
        self.heads = nn.ModuleList([head, head])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(x)
        return [self.heads[0](h), self.heads[1](h + 1)]


class IntOutputs(MLP):
    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = super().forward(x)
        return [out[0].argmax(-1, keepdim=True).expand(-1, 3), out[1]]


class BN(MLP):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(D, 8), nn.BatchNorm1d(8), nn.Tanh())


def _xy(n: int = N_CLIENTS * PER_CLIENT, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g, dtype=torch.float64)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long(), x[:, 2:3] - x[:, 3:4]


def _blocks() -> list[list[int]]:
    return [list(range(c * PER_CLIENT, (c + 1) * PER_CLIENT)) for c in range(N_CLIENTS)]


def _data(**kw: Any) -> fedhv.FederatedDataset:
    x, y, v = _xy()
    tx, ty, tv = _xy(12, seed=1)
    opts: dict[str, Any] = {"partition": _blocks(), "test": (tx, [ty, tv])}
    opts.update(kw)
    return fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, **opts)


KW: dict[str, Any] = {"rounds": 2, "clients_per_round": N_CLIENTS, "local_steps": 3, "batch_size": PER_CLIENT,
                      "lr_local": 0.2, "progress": False}


def _model(net: type[nn.Module] = MLP) -> nn.Module:
    torch.manual_seed(0)
    return net().double()


def _simulate(model: nn.Module | None = None, data: fedhv.FederatedDataset | None = None, method: Any = "uniform",
              **kw: Any) -> fedhv.History:
    seen: list[int] = []
    kw = {**KW, **kw}
    kw.setdefault("callback", lambda rnd, rec: seen.append(rnd))
    try:
        return fedhv.simulate(model if model is not None else _model(), data if data is not None else _data(),
                              fedhv.Uniform() if method == "uniform" else method, **kw)
    finally:
        _simulate.rounds_seen = seen  # type: ignore[attr-defined]


def _task_loss(task: fedhv.Task, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if task.kind == "classification":
        return F.cross_entropy(out, y[:, 0].long())
    return (out - y).square().mean()


def replay(model: nn.Module, data: fedhv.FederatedDataset, rounds: int, steps: int, lr: float) -> nn.Module:
    """FedAvg with uniform task weights, written from scratch: full-batch local GD, mean update."""
    glob = copy.deepcopy(model)
    m = len(data.tasks)
    for _ in range(rounds):
        deltas = []
        for c in range(data.num_clients):
            local = copy.deepcopy(glob)
            opt = torch.optim.SGD(local.parameters(), lr=lr)
            idx = data.parts[c]
            xc, yc = data.x[idx].to(torch.float64), data.y[idx]
            for _ in range(steps):
                opt.zero_grad()
                outs, col, loss = local(xc), 0, torch.zeros((), dtype=torch.float64)
                for task, out in zip(data.tasks, outs):
                    loss = loss + _task_loss(task, out, yc[:, col:col + task.width]) / m
                    col += task.width
                loss.backward()
                opt.step()
            deltas.append([p.detach() - q.detach() for p, q in zip(local.parameters(), glob.parameters())])
        with torch.no_grad():
            for i, p in enumerate(glob.parameters()):
                p.add_(torch.stack([d[i] for d in deltas]).mean(0))
    return glob


def _assert_replayed(hist: fedhv.History, model: nn.Module, data: fedhv.FederatedDataset) -> None:
    expected = replay(model, data, KW["rounds"], KW["local_steps"], KW["lr_local"])
    for (name, p), q in zip(hist.model.named_parameters(), expected.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-10), (name, float((p - q).abs().max()))
    assert any(not torch.equal(p, q) for p, q in zip(hist.model.parameters(), model.parameters()))  # it trained


# ----------------------------------------------------------------------------------------------- works


def _pil_data() -> tuple[fedhv.FederatedDataset, fedhv.FederatedDataset]:
    """Grey 2x2 PIL images (the docs' input), against the same images as ToTensor tensors."""
    from PIL import Image

    x, y, v = _xy()
    pixels = (x.reshape(-1, 2, 2).sigmoid() * 255).round().to(torch.uint8).numpy()

    class Images(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(pixels)

        def __getitem__(self, i: int) -> tuple[Any, tuple[int, float]]:
            return Image.fromarray(pixels[i], mode="L"), (int(y[i]), float(v[i, 0]))

    from_pil = fedhv.FederatedDataset.from_datasets(Images(), None, TASKS, partition=_blocks(), progress=False)
    tensors = (torch.from_numpy(pixels).unsqueeze(1).float() / 255).double()
    plain = fedhv.FederatedDataset.from_tensors(tensors, [y, v], TASKS, partition=_blocks())
    return from_pil, plain


class Flat(MLP):
    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return super().forward(x.reshape(len(x), -1).to(self.heads[0].weight.dtype))


@dataclass(frozen=True)
class Works:
    """A case that trains: ``run() -> (history, initial model, data)`` must equal the replay."""

    id: str
    run: Callable[[], tuple[fedhv.History, nn.Module, fedhv.FederatedDataset]]


def _plain(**kw: Any) -> tuple[fedhv.History, nn.Module, fedhv.FederatedDataset]:
    model, data = _model(), _data()
    return _simulate(copy.deepcopy(model), data, **kw), model, data


def _shared() -> tuple[fedhv.History, nn.Module, fedhv.FederatedDataset]:
    x, y, _ = _xy()
    data = fedhv.FederatedDataset.from_tensors(x, [y, 2 - y], [fedhv.Task("a", size=3), fedhv.Task("b", size=3)],
                                               partition=_blocks())
    model = _model(SharedHead)
    return _simulate(copy.deepcopy(model), data, engine="sequential"), model, data


def _pil() -> tuple[fedhv.History, nn.Module, fedhv.FederatedDataset]:
    from_pil, plain = _pil_data()
    assert torch.equal(from_pil.x.double(), plain.x)  # ToTensor: [1, 2, 2], value / 255
    model = _model(Flat)
    return _simulate(copy.deepcopy(model), from_pil), model, plain


def _string_ids() -> tuple[fedhv.History, nn.Module, fedhv.FederatedDataset]:
    x, y, v = _xy()
    names = ["user_10", "user_2", "user_1", "user_9"]  # natural order: user_1, user_2, user_9, user_10
    ids = np.array([names[i // PER_CLIENT] for i in range(len(x))])
    data = fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, partition="ids", ids=ids)
    assert data.client_ids == ("user_1", "user_2", "user_9", "user_10")
    assert data.parts[0].tolist() == list(range(2 * PER_CLIENT, 3 * PER_CLIENT))  # user_1's rows
    model = _model()
    hist = _simulate(copy.deepcopy(model), data)
    assert hist.client_ids == ["user_1", "user_2", "user_9", "user_10"]
    assert hist.round_client_ids(0) == hist.client_ids  # every client sampled
    return hist, model, data


WORKS = [
    Works("plain", lambda: _plain()),
    Works("seed=numpy.int64", lambda: _plain(seed=np.int64(3))),
    Works("numpy integer arguments", lambda: _plain(rounds=np.int64(2), local_steps=np.int32(3), batch_size=np.int64(8),
                                                    eval_every=np.int64(1), clients_per_round=np.int64(4))),
    Works("clients_per_round=None is min(10, clients)", lambda: _plain(clients_per_round=None)),
    Works("numpy float arguments", lambda: _plain(method=fedhv.Uniform(lr_global=np.float32(1.0)),
                                                  lr_local=np.float64(0.2), momentum=np.float32(0.0))),
    Works("device='cpu'", lambda: _plain(device="cpu")),
    Works("hv_reference per task", lambda: _plain(hv_reference=[2.0, 5.0])),
    Works("engine_chunk=1", lambda: _plain(engine_chunk=1)),
    Works("shared head, sequential engine", _shared),
    Works("PIL images as ToTensor", _pil),
    Works("string ids in natural order", _string_ids),
]


@pytest.mark.parametrize("case", WORKS, ids=[c.id for c in WORKS])
def test_a_users_problem_that_works_equals_a_plain_pytorch_replay(case: Works) -> None:
    hist, model, data = case.run()
    _assert_replayed(hist, model, data)


# ----------------------------------------------------------------------------------------------- refused


@dataclass(frozen=True)
class Refused:
    """A case refused before round 1 with one line matching ``match``."""

    id: str
    call: Callable[[], Any]
    match: str


def _ids_data(ids: Any, **kw: Any) -> fedhv.FederatedDataset:
    x, y, v = _xy()
    return fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, partition="ids", ids=ids, **kw)


def _nan_ids() -> np.ndarray:
    ids = (np.arange(N_CLIENTS * PER_CLIENT) // PER_CLIENT).astype(float)
    ids[5] = math.nan
    return ids


def _none_ids() -> np.ndarray:
    ids = np.array([f"u{i // PER_CLIENT}" for i in range(N_CLIENTS * PER_CLIENT)], dtype=object)
    ids[7] = None
    return ids


def _targets(row: int, value: float, col: int = 0) -> fedhv.FederatedDataset:
    x, y, v = _xy()
    cols = [y.double(), v.clone()]
    cols[col].view(-1)[row] = value
    return fedhv.FederatedDataset.from_tensors(x, cols, TASKS, partition=_blocks())


def _wrong_test_width() -> fedhv.History:
    x, _, _ = _xy(12, seed=1)
    return _simulate(data=_data(test=(torch.cat([x, x[:, :1]], 1), [x[:, 0].gt(0).long(), x[:, 2:3]])))


def _two_heads_one_module(**kw: Any) -> fedhv.History:
    x, y, _ = _xy()
    data = fedhv.FederatedDataset.from_tensors(x, [y, 2 - y], [fedhv.Task("a", size=3), fedhv.Task("b", size=3)],
                                               partition=_blocks())
    return _simulate(_model(SharedHead), data, **kw)


def _iterable() -> Any:
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self) -> Any:
            return iter([])

    return fedhv.FederatedDataset.from_datasets(Stream(), None, TASKS, progress=False)


def _hvb_twice() -> Any:
    p = torch.tensor(1.0, requires_grad=True)
    losses = torch.stack([p * 2, p + 1])
    hvb = HVBackward([5.0, 5.0])
    hvb.backward(losses)
    return hvb.backward(losses)


REFUSED = [
    # devices: the configuration's check (fedhv run --device), not a torch traceback
    *[Refused(f"device={d}", lambda d=d: _simulate(device=d), rf"device = '{d}' is not available: torch .* reports")
      for d in ("cuda", "cuda:1", "mps")],
    Refused("device=gpu0", lambda: _simulate(device="gpu0"), r"device = 'gpu0' is not a torch device; use \"cpu\""),
    Refused("device=3.5", lambda: _simulate(device=3.5), r"device = 3.5 \(float\) is not a device"),
    # values that silently meant something else
    Refused("clients_per_round=0", lambda: _simulate(clients_per_round=0),
            r"clients_per_round = 0 must be in \[1, 4\].*or None for the default min\(10, 4\) = 4"),
    Refused("clients_per_round=-1", lambda: _simulate(clients_per_round=-1), r"clients_per_round = -1 must be in"),
    Refused("clients_per_round=5", lambda: _simulate(clients_per_round=5), r"clients_per_round = 5 must be in \[1, 4\]"),
    Refused("clients_per_round=2.5", lambda: _simulate(clients_per_round=2.5),
            r"clients_per_round = 2.5 must be an integer in \[1, 4\], or None"),
    Refused("ids with clients=", lambda: _ids_data(np.arange(32) // 8, clients=7),
            r"clients = 7 with partition = \"ids\": the ids make 4 clients .*drop clients="),
    Refused("ids with samples_per_client=", lambda: _ids_data(np.arange(32) // 8, samples_per_client=4),
            r"samples_per_client = 4 with partition = \"ids\""),
    Refused("ids= with dirichlet", lambda: fedhv.FederatedDataset.from_tensors(*_xy()[:1], list(_xy()[1:]), TASKS,
                                                                               ids=np.arange(32) // 8),
            r"ids= is given but partition = 'dirichlet' does not use it"),
    Refused("list partition with clients=", lambda: _data(clients=3),
            r"clients = 3 but the partition lists 4 clients"),
    Refused("NaN id", lambda: _ids_data(_nan_ids()), r"ids\[5\] = nan is not a client id; .*drop row 5"),
    Refused("None id", lambda: _ids_data(_none_ids()), r"ids\[7\] = None is not a client id"),
    Refused("ids of another length", lambda: _ids_data(np.arange(31)), r"one client id per sample \(32 values, got 31"),
    # methods and seeds
    Refused("method='gradnorm'", lambda: _simulate(method="gradnorm"),
            r"method = 'gradnorm' is a string; fedhv has no method 'gradnorm'"),
    Refused("method='dwa'", lambda: _simulate(method="dwa"), r"method = 'dwa' is a string; pass fedhv.DWA\(\)"),
    Refused("method='fedhv'", lambda: _simulate(method="fedhv"), r"method = 'fedhv' is a string; pass fedhv.FedHV\(\)"),
    Refused("method='fsmgda-upgrad'", lambda: _simulate(method="fsmgda-upgrad"),  # not a top-level name: its module
            r"method = 'fsmgda-upgrad' is a string; pass fedhv.algorithms.aggregators.FSMGDAUPGrad\(\)"),
    Refused("method=class", lambda: _simulate(method=fedhv.Uniform),
            r"method = fedhv.Uniform is the class; pass an instance: fedhv.Uniform\(\)"),
    Refused("method=42", lambda: _simulate(method=42), r"method = 42 \(int\) is not a fedhv method"),
    Refused("lr_local='0.1'", lambda: _simulate(lr_local="0.1"), r"lr_local = '0.1' \(str\) is not a number"),
    Refused("seed='3'", lambda: _simulate(seed="3"), r"seed = '3' is out of range; seeds must be integers"),
    Refused("seed=2**32", lambda: _simulate(seed=2**32), r"seed = 4294967296 is out of range"),
    Refused("seed=-1 (dataset)", lambda: _data(seed=-1), r"seed = -1 is out of range"),
    # references, test sets, model outputs, heads, train-mode batches
    Refused("hv_reference of 3 for 2 tasks", lambda: _simulate(hv_reference=[3, 3, 3]),
            r"hv_reference = \[3, 3, 3\] must be one finite number for every task or 2 finite numbers"),
    Refused("hv_reference=nan", lambda: _simulate(hv_reference=math.nan), r"hv_reference = nan must be"),
    Refused("hv_reference='3'", lambda: _simulate(hv_reference="3"), r"hv_reference = '3' must be"),
    Refused("test set of another width", _wrong_test_width,
            r"the test set does not fit the model: it fails on 2 test rows \(shape \[2, 5\]; training x has shape "
            r"\[4\]"),
    Refused("int64 model outputs", lambda: _simulate(_model(IntOutputs)),
            r"task 'cls': the model's output has dtype torch.int64; return floating-point outputs"),
    Refused("one head for two tasks, batched", lambda: _two_heads_one_module(),
            r"engine = \"batched\" cannot train a model that shares one parameter as 'heads.0.weight' and "
            r"'heads.1.weight'.*engine=\"sequential\""),
    Refused("one head for two tasks, FSMGDA", lambda: _two_heads_one_module(method=fedhv.FSMGDA(), engine="sequential"),
            r"method = fsmgda: the model shares one parameter as 'heads.0.weight'"),
    Refused("BatchNorm with batch_size=1", lambda: _simulate(_model(BN), batch_size=1),
            r"batch_size = 1: the model fails in train mode on a batch of 1 rows .*use batch_size >= 2"),
    Refused("engine_chunk=-1", lambda: _simulate(engine_chunk=-1), r"engine_chunk = -1 must be"),
    # earlier edge cases (issues 27, 29): arguments
    Refused("rounds=0", lambda: _simulate(rounds=0), r"rounds = 0 must be an integer >= 1"),
    Refused("eval_every=0", lambda: _simulate(eval_every=0), r"eval_every = 0 must be an integer >= 1"),
    Refused("local_steps=0", lambda: _simulate(local_steps=0), r"local_steps = 0 must be an integer >= 1"),
    Refused("precision=fp16", lambda: _simulate(precision="fp16"), r"precision = 'fp16' is unknown"),
    Refused("aggregation=median", lambda: _simulate(aggregation="median"), r"aggregation = 'median' is unknown"),
    Refused("diagnostics='yes'", lambda: _simulate(diagnostics="yes"), r"diagnostics = 'yes' must be True, False"),
    Refused("model not a module", lambda: _simulate(model=lambda x: x), r"model has type function; pass a torch"),
    Refused("data not a FederatedDataset", lambda: _simulate(data=(1, 2)), r"data has type tuple; build it with"),
    Refused("float16 model", lambda: _simulate(_model().half()), r"the model's parameters are torch.float16"),
    Refused("head width != Task.size", lambda: _simulate(_model(lambda: MLP((2, 1)))),
            r"task 'cls': the model's output has shape \[8, 2\] for 8 rows; expected \[8, 3\]"),
    Refused("heads= missing", lambda: _simulate(heads="towers"), r"heads = 'towers'"),
    # earlier edge cases: data and tasks
    Refused("label 3 of 3 classes", lambda: _targets(5, 3), r"task 'cls' has label 3 \(row 5\) outside \[0, 3\)"),
    Refused("fractional label", lambda: _targets(5, 1.5), r"task 'cls' has a fractional class label 1.5 \(row 5\)"),
    Refused("NaN regression target", lambda: _targets(7, math.nan, col=1),
            r"task 'reg' has NaN or infinite targets \(first in row 7\)"),
    Refused("uint8 inputs", lambda: fedhv.FederatedDataset.from_tensors(
        torch.zeros(32, D, dtype=torch.uint8), list(_xy()[1:]), TASKS, partition=_blocks()), r"x has dtype uint8"),
    Refused("index out of range", lambda: _data(partition=[[0, 99]]), r"partition\[0\] has indices outside \[0, 32\)"),
    Refused("unknown partition", lambda: _data(partition="kmeans"), r"partition = 'kmeans' is unknown"),
    Refused("Task size 0", lambda: fedhv.Task("t", size=0), r"Task 't': size = 0 must be an integer >= 1"),
    Refused("Task kind", lambda: fedhv.Task("t", "ranking"), r"Task 't': kind = 'ranking' is unknown"),
    Refused("repeated task names", lambda: fedhv.FederatedDataset.from_tensors(_xy()[0], [_xy()[1], _xy()[1]],
                                                                                ["a", "a"]),
            r"tasks = \['a', 'a'\] repeat a name"),
    Refused("iterable dataset", _iterable, r"train has type Stream, not a map-style dataset"),
    # the weighting modules, misused
    Refused("HVWeighting(list)", lambda: HVWeighting([3.0, 3.0])([1.0, 2.0]),
            r"HVWeighting: losses = \[1.0, 2.0\] \(list\) is not a tensor; pass .* torch.stack"),
    Refused("HVWeighting(ndarray)", lambda: HVWeighting([3.0, 3.0])(np.array([1.0, 2.0])), r"\(ndarray\) is not a tensor"),
    Refused("HVWeighting.weighted_loss(list)", lambda: HVWeighting([3.0, 3.0]).weighted_loss([1.0, 2.0]),
            r"HVWeighting.weighted_loss: losses = \[1.0, 2.0\] \(list\) is not a tensor"),
    Refused("HVWeighting(reference='ab')", lambda: HVWeighting("ab"), r"reference = 'ab' is not numbers"),
    Refused("HVWeighting.backward", lambda: HVWeighting([3.0, 3.0]).backward(torch.ones(2)),
            r"HVWeighting has no backward\(\); call hv.weighted_loss\(losses\).backward\(\)"),
    Refused("HVBackward called", lambda: HVBackward([3.0, 3.0])(torch.ones(2)),
            r"HVBackward is not called: use weights = hvb.backward\(losses\)"),
    Refused("HVBackward(floats)", lambda: HVBackward([3.0, 3.0]).backward([1.0, 2.0]),
            r"HVBackward.backward: losses = \[1.0, 2.0\] are not loss tensors"),
    Refused("HVBackward(detached)", lambda: HVBackward([3.0, 3.0]).backward(torch.tensor([1.0, 2.0])),
            r"HVBackward.backward: the losses do not require grad"),
    Refused("HVBackward twice on one graph", _hvb_twice, r"these losses were back-propagated already"),
    Refused("HVWeighting NaN loss", lambda: HVWeighting([3.0, 3.0])(torch.tensor([1.0, math.nan])),
            r"losses\[\.\.\., 1\] is not finite .*task 1's loss is NaN or infinite.*its loss function"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_a_users_mistake_is_one_line_before_round_one(case: Refused) -> None:
    if case.id.startswith("device=cuda") and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    _simulate.rounds_seen = []  # type: ignore[attr-defined]
    with pytest.raises(fedhv.FedHVError, match=case.match) as caught:
        case.call()
    assert "\n" not in str(caught.value)
    assert _simulate.rounds_seen == []  # type: ignore[attr-defined]  # refused before round 1


# ----------------------------------------------------------------------------------------------- messages


def test_a_loss_that_is_nan_on_some_rows_is_named_not_the_learning_rates() -> None:
    def half_nan(o: torch.Tensor, t: torch.Tensor) -> torch.Tensor:  # NaN on one client's rows only
        err = (o[:, 0] - t[:, 0]).square()
        return torch.where(t[:, 0] > 100, torch.full_like(err, math.nan), err)

    x, y, v = _xy()
    v = v.clone()
    v[PER_CLIENT:] += 1000  # clients 1..3 hold targets > 100: their reports are NaN at the (finite) initial model
    tasks = [TASKS[0], fedhv.Task("reg", "regression", 1, loss=half_nan)]
    data = fedhv.FederatedDataset.from_tensors(x, [y, v], tasks, partition=_blocks())
    with pytest.raises(fedhv.FedHVError) as caught:
        _simulate(_model(), data, fedhv.FedHV(calibration_rounds=2), clients_per_round=2, seed=1)
    text = str(caught.value)
    assert "report has non-finite values" in text and "the loss of task(s) [1]" in text, text
    assert "not the learning rates" in text and "lower train.lr_local" not in text, text


@pytest.mark.parametrize("out", [True, False], ids=["out=DIR", "temporary"])
def test_the_interrupt_hint_of_simulate_names_its_own_resume(out: bool, tmp_path, caplog) -> None:
    def stop(rnd: int, record: dict) -> None:
        if rnd == 3:  # after round 2's evaluation and checkpoint: round 3 is checkpointed on the way out
            raise KeyboardInterrupt

    with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
        _simulate(rounds=4, eval_every=2, callback=stop, out=tmp_path / "run" if out else None)
    text = " ".join(r.getMessage() for r in caplog.records if "checkpoint written" in r.getMessage())
    assert "fedhv run --resume" not in text and text
    if out:
        assert f"fedhv.simulate(..., resume={str(tmp_path / 'run')!r})" in text
        done = _simulate(rounds=4, eval_every=2, resume=tmp_path / "run")  # the hint works
        assert [r["round"] for r in done.rounds] == [1, 2, 3, 4]
    else:
        assert "pass out=DIR to fedhv.simulate" in text
