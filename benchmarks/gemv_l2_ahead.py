"""The word GEMV at one row with its programs asking L2 for W's lines some K steps ahead of
their loads (``KVSERVE_GEMV_L2_AHEAD``, ``GemvConfig.l2_ahead``), against none.

The GEMV loads one K step ahead into registers. At one row a decode projection of 16-60 MB runs
at 1.7-3.7 TB/s (the engine's no-PDL profile of Llama-3-8B FP8), and filling L2 from HBM during
the attention kernels before it saved only 0.5-2 us of the o projection's 8-18
(l2_prefetch_2026-12-03.json, 938907a): not the bytes but the latency each program waits out
per step limits it. Asking L2 for the lines a few steps ahead shortens that wait without the
registers a deeper register pipeline costs.

Timed as ``benchmarks/skinny_gemm.py`` times (one CUDA graph over L distinct weights, >= 256 MB,
so nothing comes from L2 across layers); each setting's output is checked bit for bit against
none's. Llama-3-8B FP8 per-channel and NVFP4 projections (gate_up gated as the engine runs it),
GLM-4.5-Air's FP8 128 x 128-block attention projections, Qwen3-30B-A3B's bf16 ones.

    python -m benchmarks.gemv_l2_ahead --out-dir $OUT

Writes gemv_l2_ahead_<date>.json.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import copy_bandwidth_gbs, write_result
from benchmarks.fp4_gemm import random_fp4
from benchmarks.skinny_gemm import SPAN_BYTES, graph_us
from kvserve.kernels.fp4_gemm import fp4_linear
from kvserve.kernels.word_gemv import L2_AHEAD_ENV, fp8_gemv, half_gemv, l2_ahead_setting

# name: (N, K, format, gated)
SHAPES: dict[str, tuple[int, int, str, bool]] = {
    "llama_fp8_qkv": (6144, 4096, "fp8", False),
    "llama_fp8_o": (4096, 4096, "fp8", False),
    "llama_fp8_gate_up": (28672, 4096, "fp8", True),
    "llama_fp8_down": (4096, 14336, "fp8", False),
    "glm_fp8_block_qkv": (14336, 4096, "fp8_block", False),
    "glm_fp8_block_o": (4096, 12288, "fp8_block", False),
    "qwen3_bf16_qkv": (5120, 2048, "bf16", False),
    "qwen3_bf16_o": (2048, 4096, "bf16", False),
    "llama_nvfp4_qkv": (6144, 4096, "nvfp4", False),
    "llama_nvfp4_o": (4096, 4096, "nvfp4", False),
    "llama_nvfp4_gate_up": (28672, 4096, "nvfp4", True),
    "llama_nvfp4_down": (4096, 14336, "nvfp4", False),
}
Weight = tuple[torch.Tensor, ...]


def _weight(n: int, k: int, fmt: str) -> Weight:
    if fmt == "bf16":
        return (torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02,)
    if fmt == "nvfp4":
        return random_fp4("nvfp4", n, k)
    w = (torch.randn(n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    shape = (n // 128, k // 128) if fmt == "fp8_block" else (n,)
    return w, torch.rand(shape, device="cuda") * 0.01 + 0.001


def _op(fmt: str, gated: bool) -> Callable[[torch.Tensor, Weight], torch.Tensor]:
    if fmt == "bf16":
        return lambda x, w: half_gemv(x, w[0], gated=gated)
    if fmt == "nvfp4":
        return lambda x, w: fp4_linear(x, *w, gated=gated)
    block = (128, 128) if fmt == "fp8_block" else None
    return lambda x, w: fp8_gemv(x, w[0], w[1], block=block, gated=gated)


def _set_ahead(steps: int) -> None:
    os.environ[L2_AHEAD_ENV] = str(steps)
    l2_ahead_setting.cache_clear()


def run_shape(name: str, aheads: list[int], replays: int) -> dict[str, Any]:
    n, k, fmt, gated = SHAPES[name]
    first = _weight(n, k, fmt)
    nbytes = sum(t.numel() * t.element_size() for t in first if t is not None)
    weights = [first] + [_weight(n, k, fmt) for _ in range(max(8, math.ceil(SPAN_BYTES / nbytes)))]
    xs = [torch.randn(1, k, device="cuda", dtype=torch.bfloat16)] * len(weights)
    op = _op(fmt, gated)
    row: dict[str, Any] = {"shape": name, "n": n, "k": k, "format": fmt, "gated": gated,
                           "bytes": nbytes, "us": {}, "GBps": {}}  # fmt: skip
    reference = None
    for steps in aheads:
        _set_ahead(steps)
        op(xs[0], weights[0])  # compiles outside the capture
        us, out = graph_us(op, xs, weights, replays)
        if reference is None:
            reference = out.clone()
        elif not torch.equal(out, reference):
            row.setdefault("mismatch", []).append(steps)
        row["us"][str(steps)] = round(us, 2)
        row["GBps"][str(steps)] = round(nbytes / us / 1e3, 1)
    del weights
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--aheads", default="0,2,3,4,6")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    aheads = [int(a) for a in args.aheads.split(",")]
    rows = []
    for name in args.shapes.split(","):
        rows.append(run_shape(name, aheads, args.replays))
        print(rows[-1], flush=True)
    _set_ahead(0)
    payload = {"copy_GBps": copy_bandwidth_gbs(), "span_bytes": SPAN_BYTES, "rows": rows}
    print(write_result("gemv_l2_ahead", payload, args.out_dir))


if __name__ == "__main__":
    main()
