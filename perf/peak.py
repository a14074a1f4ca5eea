"""The machine's measured arithmetic peak: what a round's GFLOP/s is compared against.

Usage::

    python perf/peak.py [--device cpu|cuda] [--threads N]

Times dense square matrix products (``n = 1024, 2048, 4096``) and a 3x3, 64 -> 64 channel
convolution on a 64 x 64 x 32 x 32 channels-last batch, in float32 and bfloat16, and
prints GFLOP/s (best of 3 repetitions of 5 calls, after 2 warm-up calls; a product of
``n x n`` matrices is ``2 n^3`` FLOPs, the convolution ``2 N C_out H W C_in k^2``). The
largest float32 figure is the "measured fp32 peak" of docs/performance.md.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F


def matmul_flops(n: int) -> int:
    """FLOPs of one ``n x n`` by ``n x n`` matrix product (a multiply and an add per term)."""
    return 2 * n**3


def conv_flops(batch: int, c_in: int, c_out: int, size: int, kernel: int) -> int:
    """FLOPs of a stride-1, same-padded ``kernel x kernel`` convolution on ``size x size`` maps."""
    return 2 * batch * c_out * size * size * c_in * kernel * kernel


def best_seconds(fn: Callable[[], object], device: torch.device, calls: int = 5, repeats: int = 3) -> float:
    """Fastest mean seconds per call of ``repeats`` timings of ``calls`` calls (synchronised on CUDA)."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(2):
        fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def measure(device: torch.device, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16),
            sizes: tuple[int, ...] = (1024, 2048, 4096)) -> dict[str, float]:
    """``{"<op> <dtype>": GFLOP/s}`` for the matrix products and the convolution."""
    out: dict[str, float] = {}
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        for n in sizes:
            a = torch.randn(n, n, device=device, dtype=dtype)
            b = torch.randn(n, n, device=device, dtype=dtype)
            out[f"matmul {n} {name}"] = matmul_flops(n) / best_seconds(lambda a=a, b=b: a @ b, device) / 1e9
        x = torch.randn(64, 64, 32, 32, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)
        w = torch.randn(64, 64, 3, 3, device=device, dtype=dtype)
        seconds = best_seconds(lambda x=x, w=w: F.conv2d(x, w, padding=1), device)
        out[f"conv3x3 64ch {name}"] = conv_flops(64, 64, 64, 32, 3) / seconds / 1e9
    return out


def fp32_peak(results: dict[str, float]) -> float:
    """The largest float32 GFLOP/s of :func:`measure`'s results."""
    return max(v for k, v in results.items() if k.endswith("float32"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = measure(torch.device(args.device))
    print(f"{args.device}, {torch.get_num_threads()} threads:")
    for key, value in results.items():
        print(f"  {key:<24} {value:8.1f} GFLOP/s")
    print(f"measured fp32 peak: {fp32_peak(results):.1f} GFLOP/s")


if __name__ == "__main__":
    main()
