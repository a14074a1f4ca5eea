from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedhv.models import LeNetMTL, ParamLayout, default_init, get_flat, set_flat
from fedhv.models.functional import max_pool2
from fedhv.rng import torch_generator


def _model(seed: int = 0) -> LeNetMTL:
    m = LeNetMTL((10, 10)).double()
    default_init(m, torch_generator(seed, "init"))
    return m


def test_parameter_counts_match_reference() -> None:
    m = LeNetMTL((10, 10))
    enc = sum(p.numel() for n, p in m.named_parameters() if not n.startswith("heads."))
    heads = [sum(p.numel() for p in h.parameters()) for h in m.heads]
    assert enc == 28_515 and heads == [3_060, 3_060]


def test_seeded_init_is_reproducible_and_default_scaled() -> None:
    a, b, c = get_flat(_model(0)), get_flat(_model(0)), get_flat(_model(1))
    assert torch.equal(a, b) and not torch.equal(a, c)
    w = _model(0).fc.weight
    assert w.abs().max() <= 1 / 540**0.5 + 1e-12  # kaiming-uniform(a=sqrt(5)) bound 1/sqrt(fan_in)


def test_flat_round_trip_and_views() -> None:
    m = _model()
    layout = ParamLayout.of(m)
    flat = get_flat(m)
    assert flat.numel() == layout.size == 28_515 + 2 * 3_060
    stacked = torch.stack([flat, 2 * flat])
    views = layout.views(stacked)
    assert torch.equal(views["conv2.weight"][1], 2 * m.conv2.weight)
    set_flat(m, 3 * flat)
    assert torch.equal(get_flat(m), 3 * flat)


def test_batched_forward_equals_per_client_forward() -> None:
    clients, batch = 3, 5
    models = [_model(k) for k in range(clients)]
    layout = ParamLayout.of(models[0])
    params = layout.views(torch.stack([get_flat(m) for m in models]))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(clients, batch, 1, 28, 28, generator=g, dtype=torch.float64)
    masks = {s: torch.rand(clients, batch, f, generator=g) > 0.5 for s, f in models[0].dropout_sites().items()}
    out = models[0].forward_batched(params, x, masks)
    for k, m in enumerate(models):
        ref = m(x[k], {s: v[k] for s, v in masks.items()})
        for task in range(2):
            torch.testing.assert_close(out[task][k], ref[task], rtol=0, atol=1e-12)


def test_fast_pool_equals_max_pool() -> None:
    x = torch.randn(4, 3, 12, 12)
    with torch.no_grad():
        assert torch.equal(max_pool2(x), F.max_pool2d(x, 2))
    y = torch.randn(2, 2, 7, 7)
    with torch.no_grad():
        assert torch.equal(max_pool2(y), F.max_pool2d(y, 2))


def test_cifar_cnn_parameter_counts_and_vmap_engine_path() -> None:
    from torch.func import functional_call, vmap

    from fedhv.models import CifarCNN

    m = CifarCNN((10, 10)).double()
    default_init(m, torch_generator(0, "init"))
    enc = sum(p.numel() for n, p in m.named_parameters() if not n.startswith("heads."))
    assert enc == 1_685_888 and sum(p.numel() for p in m.heads[0].parameters()) == 20_310
    layout = ParamLayout.of(m)
    flat = get_flat(m)
    params = layout.views(torch.stack([flat, flat * 0.5]))
    x = torch.randn(2, 3, 3, 32, 32, dtype=torch.float64)
    masks = {s: torch.ones(2, 3, f, dtype=torch.bool) for s, f in m.dropout_sites().items()}
    out = vmap(lambda p, xx, mm: functional_call(m, p, (xx, mm)))(params, x, masks)
    ref = m(x[0], {s: v[0] for s, v in masks.items()})
    torch.testing.assert_close(out[1][0], ref[1], rtol=0, atol=1e-12)


def test_cifar_batched_forward_equals_per_copy_forward() -> None:
    from fedhv.models import CifarCNN

    models = [CifarCNN((10, 10)).double() for _ in range(3)]
    for k, m in enumerate(models):
        default_init(m, torch_generator(k, "init"))
    layout = ParamLayout.of(models[0])
    params = layout.views(torch.stack([get_flat(m) for m in models]))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 3, 32, 32, generator=g, dtype=torch.float64)
    masks = {s: torch.rand(3, 4, f, generator=g) > 0.5 for s, f in models[0].dropout_sites().items()}
    out = models[0].forward_batched(params, x, masks)
    for k, m in enumerate(models):
        ref = m(x[k], {s: v[k] for s, v in masks.items()})
        for task in range(2):
            torch.testing.assert_close(out[task][k], ref[task], rtol=0, atol=1e-11)



def _cifar_paper_order(m, x: torch.Tensor, masks: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The CIFAR CNN in the paper's order (conv with bias -> ReLU -> max-pool), written from scratch."""
    h = F.max_pool2d(F.relu(F.conv2d(x, m.conv1.weight, m.conv1.bias, padding=1)), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, m.conv2.weight, m.conv2.bias, padding=1)), 2)
    h = F.relu(F.linear(h.flatten(1), m.fc1.weight, m.fc1.bias)) * masks["fc1"] * 2.0
    z = F.relu(F.linear(h, m.fc2.weight, m.fc2.bias)) * masks["fc2"] * 2.0
    return [F.log_softmax(F.linear(F.linear(z, hd.fc1.weight, hd.fc1.bias), hd.fc2.weight, hd.fc2.bias), -1)
            for hd in m.heads]


def _lenet_paper_order(m, x: torch.Tensor, masks: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """LeNet in the reference order (conv with bias -> max-pool -> ReLU), written from scratch."""
    h = F.relu(F.max_pool2d(F.conv2d(x, m.conv1.weight, m.conv1.bias, padding=1), 2))
    h = F.relu(F.max_pool2d(F.conv2d(h, m.conv2.weight, m.conv2.bias), 2))
    z = F.relu(F.linear(h.flatten(1), m.fc.weight, m.fc.bias)) * masks["encoder"] * 2.0
    out = []
    for i, hd in enumerate(m.heads):
        h = F.relu(F.linear(z, hd.fc1.weight, hd.fc1.bias)) * masks[f"head{i}"] * 2.0
        out.append(F.log_softmax(F.linear(h, hd.fc2.weight, hd.fc2.bias), -1))
    return out


@pytest.mark.parametrize("arch", ["cifar", "lenet"])
def test_models_equal_the_paper_layer_order_with_tied_windows(arch: str) -> None:
    """Pool before ReLU and bias after pooling (both engines) give the paper order's outputs and gradients.

    Blank images make every 2x2 window of a feature map tie (each value is the channel's bias),
    with positive and negative biases: the case where the gradient's routing could differ.
    """
    from fedhv.models import CifarCNN

    m = (CifarCNN((10, 10)) if arch == "cifar" else LeNetMTL((10, 10))).double()
    default_init(m, torch_generator(3, "init"))
    reference = _cifar_paper_order if arch == "cifar" else _lenet_paper_order
    with torch.no_grad():
        m.conv1.bias.copy_(torch.linspace(-0.5, 0.5, m.conv1.bias.numel(), dtype=torch.float64))
    g = torch.Generator().manual_seed(1)
    shape = (3, 32, 32) if arch == "cifar" else (1, 28, 28)
    x = torch.randn(6, *shape, generator=g, dtype=torch.float64)
    x[:3] = 0.0
    x[3, :, :16] = 0.0
    masks = {s: torch.rand(6, f, generator=g) > 0.5 for s, f in m.dropout_sites().items()}
    y = torch.randint(0, 10, (6,), generator=g)
    params = list(m.parameters())

    def grads(out: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(sum(F.nll_loss(o, y) for o in out), params)

    ref_out = reference(m, x, masks)
    ref = grads(ref_out)
    out = m(x, masks)
    for a, b in zip(out, ref_out, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)
    for a, b in zip(grads(out), ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)
    layout = ParamLayout.of(m)
    stacked = torch.stack([get_flat(m), get_flat(m)]).requires_grad_(True)
    two = {s: mk.unsqueeze(0).expand(2, *mk.shape) for s, mk in masks.items()}
    bout = m.forward_batched(layout.views(stacked), x.unsqueeze(0).expand(2, *x.shape), two)
    (bg,) = torch.autograd.grad(sum(F.nll_loss(o.reshape(-1, 10), y.repeat(2)) * 2 for o in bout), stacked)
    ref_flat = torch.cat([r.reshape(-1) for r in ref])
    torch.testing.assert_close(bg[0], ref_flat, rtol=0, atol=1e-13)
    torch.testing.assert_close(bg[1], ref_flat, rtol=0, atol=1e-13)


def test_bmm_linear_gradients_match_finite_differences_and_autocast() -> None:
    """Its hand-written backward against finite differences (float64) and autograd's baddbmm (bf16 autocast)."""
    from fedhv.models.functional import bmm_linear

    g = torch.Generator().manual_seed(0)
    h, w, b = (torch.randn(*s, dtype=torch.float64, generator=g, requires_grad=True)
               for s in ((3, 5, 7), (3, 4, 7), (3, 4)))
    assert torch.autograd.gradcheck(bmm_linear, (h, w, b), atol=1e-9, rtol=1e-9)  # linear: differences are exact
    (gw,) = torch.autograd.grad(bmm_linear(h, w, b).sum(), w)
    assert gw.is_contiguous()  # formed in the weight's [C, out, in] layout
    h32, w32, b32 = (t.detach().float().requires_grad_(True) for t in (h, w, b))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = bmm_linear(h32, w32, b32)
        ref = torch.baddbmm(b32.unsqueeze(1), h32, w32.transpose(1, 2))
    assert y.dtype == ref.dtype == torch.bfloat16 and torch.equal(y, ref)
    seed = torch.randn(y.shape, generator=g)
    ours = torch.autograd.grad((y.float() * seed).sum(), (h32, w32, b32))
    theirs = torch.autograd.grad((ref.float() * seed).sum(), (h32, w32, b32))
    for a, c in zip(ours, theirs, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, c, rtol=0, atol=0)
