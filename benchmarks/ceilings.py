"""The GPU's own ceilings, measured in the run that quotes them: device-to-device copy
bandwidth (bytes read + written) and the bf16 matmul rate on random data (8192^3)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def median_ms(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))


def copy_bandwidth_gbs() -> float:
    src = torch.randn(2 * 2**30, dtype=torch.bfloat16, device="cuda")  # 4 GiB
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / ms / 1e6


def matmul_tflops() -> float:
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    ms = median_ms(lambda: a @ b)
    return 2 * 8192**3 / ms / 1e9
