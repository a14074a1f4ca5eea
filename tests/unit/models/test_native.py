"""The compiled LeNet first layer (:mod:`fedhv.models.native`) against independent oracles.

Oracle: the paper-order layer in PyTorch, ``max_pool2d(relu(conv2d(x, w, b, padding=1,
groups=C)), 2)`` (bias inside the convolution, ReLU before the pool), its outputs and its
autograd gradients; and finite differences (``gradcheck``). The kernel must also give the
same bits for any thread count, leave every case it cannot run to PyTorch, and fall back with
one warning where no compiler is found.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedhv.models import native
from fedhv.models.functional import conv_pool_relu
from fedhv.models.native.build import compiler

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C++ compiler on PATH: the kernel cannot be built")


def paper_order(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, groups: int) -> torch.Tensor:
    """conv (bias inside) -> ReLU -> 2x2 max-pool: the layer as the paper writes it."""
    return F.max_pool2d(F.relu(F.conv2d(x, w, b, padding=1, groups=groups)), 2)


def _case(c: int, b: int, k: int, h: int, w: int, dtype: torch.dtype, seed: int):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(c, b, 1, h, w, generator=g, dtype=dtype)
    x = x.transpose(0, 1).reshape(b, c, h, w)  # the batched engine's strided view: planes not adjacent
    wt = torch.randn(c * k, 1, 3, 3, generator=g, dtype=dtype).requires_grad_(True)
    bias = torch.randn(c * k, generator=g, dtype=dtype).sub_(2.0).requires_grad_(True)  # ReLU off often
    return x, wt, bias


def test_the_kernel_is_built_here() -> None:
    """On a machine with a compiler the kernel loads (no silent fallback in CI)."""
    assert native.available()


@pytest.mark.parametrize("c,b,k,h,w", [(1, 5, 10, 28, 28), (3, 37, 10, 28, 28), (4, 17, 16, 12, 20),
                                       (2, 1, 1, 6, 4), (20, 33, 10, 28, 28)])
def test_forward_and_gradients_equal_paper_order_float64(c: int, b: int, k: int, h: int, w: int) -> None:
    """Outputs and the gradients of weight and bias equal the paper-order layer (float64, 1e-12),
    for single and many groups, K from 1 to 16, non-square maps, and batches that end mid-block."""
    x, wt, bias = _case(c, b, k, h, w, torch.float64, seed=c * 100 + b)
    assert native.applies(x, wt, bias, 1, c) and (c == 1 or b == 1 or not x.is_contiguous())
    calls = dict(native.CALLS)
    got = conv_pool_relu(x, wt, bias, 1, groups=c)
    assert native.CALLS["forward"] == calls["forward"] + 1
    assert got.shape == (b, c * k, h // 2, w // 2) and got.is_contiguous(memory_format=torch.channels_last)
    ref = paper_order(x, wt, bias, c)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    assert (ref > 0).any() and (ref == 0).any()  # both sides of the ReLU occur
    up = torch.randn(ref.shape, generator=torch.Generator().manual_seed(7), dtype=ref.dtype)
    gw, gb = torch.autograd.grad((got * up).sum(), (wt, bias))
    assert native.CALLS["backward"] == calls["backward"] + 1
    rw, rb = torch.autograd.grad((ref * up).sum(), (wt, bias))
    torch.testing.assert_close(gw, rw, rtol=0, atol=1e-10)
    torch.testing.assert_close(gb, rb, rtol=0, atol=1e-10)


@pytest.mark.parametrize("c,b,k,h,w", [(1, 19, 10, 28, 28), (3, 5, 16, 6, 36), (2, 2, 1, 4, 2)])
def test_inference_forward_equals_paper_order_and_the_training_forward(c: int, b: int, k: int, h: int,
                                                                        w: int) -> None:
    """Without autograd the kernel runs its column-vectorised forward (no window codes): the same
    values as the paper-order layer and, bit for bit, as the recording forward; rows of more than
    16 pooled columns are split into vectors."""
    x, wt, bias = _case(c, b, k, h, w, torch.float64, seed=31 + c)
    ref = paper_order(x, wt, bias, c)
    recorded = conv_pool_relu(x, wt, bias, 1, groups=c)
    with torch.no_grad():
        got = conv_pool_relu(x, wt, bias, 1, groups=c)
    torch.testing.assert_close(got, ref.detach(), rtol=0, atol=1e-12)
    assert torch.equal(got, recorded.detach()) and got.is_contiguous(memory_format=torch.channels_last)
    x32, w32, b32 = x.float(), wt.detach().float(), bias.detach().float()
    with torch.no_grad():
        torch.testing.assert_close(conv_pool_relu(x32, w32, b32, 1, groups=c), paper_order(x32, w32, b32, c),
                                   rtol=1e-5, atol=1e-5)


def test_ties_send_the_gradient_to_the_first_maximum() -> None:
    """Every 2x2 window ties, while the patches under it differ: PyTorch's pool takes the first
    (row-major) maximum, and so must the kernel, or the weight gradient of every tap changes.

    Images are constant on 2x2 blocks and the filters have only their centre tap (the others
    exactly 0), so the convolution is ``w_c x`` exactly, equal across each window.
    """
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 2, 5, 6, generator=g, dtype=torch.float64).repeat_interleave(2, 2).repeat_interleave(2, 3)
    wt = torch.zeros(2 * 5, 1, 3, 3, dtype=torch.float64)
    wt[:, 0, 1, 1] = torch.randn(10, generator=g, dtype=torch.float64)
    wt.requires_grad_(True)
    bias = torch.randn(10, generator=g, dtype=torch.float64).requires_grad_(True)
    got, ref = conv_pool_relu(x, wt, bias, 1, groups=2), paper_order(x, wt, bias, 2)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    up = torch.randn(ref.shape, generator=g, dtype=ref.dtype)
    got_w, got_b = torch.autograd.grad((got * up).sum(), (wt, bias))
    ref_w, ref_b = torch.autograd.grad((ref * up).sum(), (wt, bias))
    torch.testing.assert_close(got_w, ref_w, rtol=0, atol=1e-11)
    torch.testing.assert_close(got_b, ref_b, rtol=0, atol=1e-11)
    last = F.max_pool2d(F.relu(F.conv2d(x.flip(2, 3), wt, bias, padding=1, groups=2)), 2).flip(2, 3)
    last_w = torch.autograd.grad((last * up).sum(), wt)[0]  # the gradient of the *last* maximum
    assert (last_w - ref_w).abs().max() > 1e-3  # the case tells first from last


def test_float32_matches_to_round_off_and_gradcheck_float64() -> None:
    x, wt, bias = _case(3, 21, 10, 28, 28, torch.float32, seed=5)
    got, ref = conv_pool_relu(x, wt, bias, 1, groups=3), paper_order(x, wt, bias, 3)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    x, wt, bias = _case(2, 3, 4, 6, 8, torch.float64, seed=9)
    assert torch.autograd.gradcheck(lambda w_, b_: native.conv1_pool_relu(x, w_, b_), (wt, bias), eps=1e-6, atol=1e-7)


def test_results_do_not_depend_on_the_thread_count() -> None:
    """Output and gradients are the same bits with 1 and 2 threads (fixed-size blocks, summed in order)."""
    x, wt, bias = _case(5, 70, 10, 28, 28, torch.float32, seed=3)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            y = native.conv1_pool_relu(x, wt, bias)
            outs.append((y, *torch.autograd.grad(y.square().sum(), (wt, bias))))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_only_where_it_applies() -> None:
    """Everything the kernel does not implement keeps the PyTorch path (and gives its result)."""
    x, wt, bias = _case(2, 4, 10, 28, 28, torch.float32, seed=2)
    assert native.applies(x, wt, bias, 1, 2)
    assert not native.applies(x, wt, bias, 0, 2)  # padding
    assert not native.applies(x, wt, bias, 1, 1)  # groups do not match the planes
    assert not native.applies(x.requires_grad_(True), wt, bias, 1, 2)  # input gradients are not implemented
    x = x.detach()
    assert not native.applies(x.double(), wt, bias, 1, 2)  # mixed dtypes
    assert not native.applies(x.half(), wt.half(), bias.half(), 1, 2)
    assert not native.applies(x[..., :27, :27], wt, bias, 1, 2)  # odd sizes
    assert not native.applies(x[..., ::2], wt, bias, 1, 2)  # rows not contiguous
    assert not native.applies(x.repeat(1, 1, 1, 1), torch.randn(2 * 17, 1, 3, 3), torch.randn(34), 1, 2)  # K > 16
    assert not native.applies(x, torch.randn(20, 1, 5, 5), bias, 1, 2)  # not 3x3
    assert not native.applies(x.to("meta"), wt.to("meta"), bias.to("meta"), 1, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not native.applies(x, wt, bias, 1, 2)
    with native.disabled():
        assert not native.applies(x, wt, bias, 1, 2)
    assert native.applies(x, wt, bias, 1, 2)
    seen: list[bool] = []

    def one(xi: torch.Tensor, wi: torch.Tensor, bi: torch.Tensor) -> torch.Tensor:
        seen.append(native.applies(xi, wi, bi, 1, 1))
        return conv_pool_relu(xi, wi, bi, 1)

    out = torch.func.vmap(one)(x[:, :1].unsqueeze(0).expand(2, -1, -1, -1, -1).contiguous(),
                               wt[:10].unsqueeze(0).expand(2, -1, -1, -1, -1), bias[:10].unsqueeze(0).expand(2, -1))
    assert seen == [False]  # torch.func transforms keep PyTorch
    torch.testing.assert_close(out[0], paper_order(x[:, :1], wt[:10], bias[:10], 1), rtol=1e-5, atol=1e-5)


def test_without_a_compiler_one_warning_and_the_pytorch_path(tmp_path: Path) -> None:
    """A fresh process whose CXX does not exist warns once, then LeNet trains as before."""
    script = textwrap.dedent("""
        import warnings, torch
        from fedhv.models import native
        from fedhv.models.lenet import LeNetMTL
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = LeNetMTL()
            out = model(torch.randn(4, 1, 28, 28))
            out[0].sum().backward()
            model(torch.randn(4, 1, 28, 28))
        texts = [str(w.message) for w in caught if "compiled kernels" in str(w.message)]
        print(len(texts), native.available(), native.CALLS["forward"], texts[0] if texts else "")
    """)
    env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"), FEDHV_CACHE=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    count, available, calls, text = done.stdout.strip().split(" ", 3)
    assert (count, available, calls) == ("1", "False", "0")
    assert "no-such-compiler" in text or "compiler" in text


@pytest.mark.deploy
def test_builds_into_the_cache_directory(tmp_path: Path) -> None:
    """A fresh cache directory gets one library, which a second process reuses without compiling."""
    script = "from fedhv.models import native; import sys; sys.exit(0 if native.available() else 1)"
    env = dict(os.environ, FEDHV_CACHE=str(tmp_path))
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        libs = list((tmp_path / "kernels").glob("kernels-*.so"))
        assert len(libs) == 1 and not list((tmp_path / "kernels").glob("*.tmp*"))
    stamp = libs[0].stat().st_mtime_ns
    subprocess.run([sys.executable, "-c", script], env=env, timeout=300, check=True)
    assert libs[0].stat().st_mtime_ns == stamp  # reused, not rebuilt


def pool_oracle(h: torch.Tensor, bias: torch.Tensor, groups: int) -> torch.Tensor:
    """PyTorch: ``relu(max_pool2d(h) + bias)``, then per group flattened to ``[G, B, K*H'*W']``."""
    out = F.relu(F.max_pool2d(h, 2) + bias.view(-1, 1, 1))
    return out.reshape(out.shape[0], groups, -1).transpose(0, 1)


@pytest.mark.parametrize("b,g,k,hw", [(33, 1, 15, 12), (5, 20, 15, 12), (18, 3, 17, 6), (2, 1, 64, 8), (1, 2, 1, 4)])
def test_pool_kernel_equals_pytorch_float64(b: int, g: int, k: int, hw: int) -> None:
    """The pooled, biased, rectified and per-group flattened map, and the gradients of map and bias,
    equal PyTorch's (float64); channel counts with and without a partial 16-lane vector."""
    gen = torch.Generator().manual_seed(b * 7 + k)
    h = torch.randn(b, hw, hw, g * k, generator=gen, dtype=torch.float64).permute(0, 3, 1, 2).requires_grad_(True)
    bias = (torch.randn(g * k, generator=gen, dtype=torch.float64) - 0.5).requires_grad_(True)
    assert native.pool_applies(h, bias, g)
    got = native.pool_bias_relu_flat(h, bias, g)
    ref = pool_oracle(h, bias, g)
    assert got.shape == (g, b, k * (hw // 2) ** 2) and got.is_contiguous()
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    up = torch.randn(ref.shape, generator=gen, dtype=ref.dtype)
    gh, gb = torch.autograd.grad((got * up).sum(), (h, bias))
    rh, rb = torch.autograd.grad((ref * up).sum(), (h, bias))
    torch.testing.assert_close(gh, rh, rtol=0, atol=0)  # each element is one upstream value or 0
    torch.testing.assert_close(gb, rb, rtol=0, atol=1e-12)


def test_pool_kernel_ties_and_threads() -> None:
    """Tied windows give the gradient to the first maximum; 1 and 2 threads give the same bits."""
    h = torch.randn(20, 3, 3, 40, dtype=torch.float32).repeat_interleave(2, 1).repeat_interleave(2, 2)
    h = h.permute(0, 3, 1, 2).requires_grad_(True)
    bias = torch.randn(40).requires_grad_(True)
    outs, before = [], torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            y = native.pool_bias_relu_flat(h, bias, 4)
            outs.append((y, *torch.autograd.grad(y.square().sum(), (h, bias))))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    ref = pool_oracle(h, bias, 4)
    rh = torch.autograd.grad(ref.square().sum(), h)[0]
    assert torch.equal(outs[0][1], rh)


def test_pool_kernel_only_where_it_applies() -> None:
    h = torch.randn(2, 6, 6, 30).permute(0, 3, 1, 2)
    bias = torch.randn(30)
    assert native.pool_applies(h, bias, 2) and native.pool_applies(h, bias, 3)
    assert not native.pool_applies(h.contiguous(), bias, 2)  # NCHW
    assert not native.pool_applies(h, bias, 4)  # 30 channels are not 4 groups
    assert not native.pool_applies(h[..., :5, :5], bias, 2)  # odd sizes
    assert not native.pool_applies(h, bias.double(), 2)
    assert not native.pool_applies(h.bfloat16(), bias.bfloat16(), 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not native.pool_applies(h, bias, 2)
    with native.disabled():
        assert not native.pool_applies(h, bias, 2)


def test_flat_features_equal_the_module_layout_with_and_without_kernels() -> None:
    """``conv_pool_relu_flat`` gives ``conv_pool_relu``'s map in ``nn.Flatten`` order per group, on
    every path: compiled first layer, compiled pooling (channels last), and PyTorch only."""
    from fedhv.models.functional import conv_pool_relu_flat

    gen = torch.Generator().manual_seed(11)
    x1 = torch.randn(7, 3, 28, 28, generator=gen, dtype=torch.float64)
    w1, b1 = torch.randn(30, 1, 3, 3, generator=gen, dtype=torch.float64), torch.randn(30, generator=gen, dtype=torch.float64)
    x2 = torch.randn(7, 30, 14, 14, generator=gen, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    w2 = torch.randn(45, 10, 3, 3, generator=gen, dtype=torch.float64)
    b2 = torch.randn(45, generator=gen, dtype=torch.float64)
    for x, w, b, pad in ((x1, w1, b1, 1), (x2, w2, b2, 0)):
        with native.disabled():
            ref = conv_pool_relu(x, w, b, pad, groups=3)
            plain = conv_pool_relu_flat(x, w, b, pad, groups=3)
        ref = ref.reshape(7, 3, -1).transpose(0, 1)
        torch.testing.assert_close(plain, ref, rtol=0, atol=0)
        calls = dict(native.CALLS)
        torch.testing.assert_close(conv_pool_relu_flat(x, w, b, pad, groups=3), ref, rtol=0, atol=1e-12)
        assert native.CALLS != calls  # a kernel ran
