"""Does asking L2 for a weight during the attention kernels make its GEMV faster?

One CUDA graph per variant over L distinct weights (>= 256 MB, so nothing stays in L2 from one
to the next), each step: a prefetch launch (of nothing, or of the first fraction of the weight
and its scales), a spin kernel standing in for the attention kernels (``torch.cuda._sleep``),
then the weight's GEMV at one row. The GEMV's time is the step's less the same step without it.

    python -m benchmarks.l2_prefetch --out-dir $OUT

Writes l2_prefetch_<date>.json.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import copy_bandwidth_gbs, graph_replay_ms, write_result
from kvserve.kernels.l2_prefetch import l2_prefetch
from kvserve.kernels.word_gemv import fp8_gemv, half_gemv

SPAN_BYTES = 256 << 20
REPLAYS = 20
WARMUP = 3
# name: (N, K, weight kind)
SHAPES = {
    "llama_o_fp8": (4096, 4096, "fp8"),
    "llama_qkv_fp8": (6144, 4096, "fp8"),
    "llama_down_fp8": (4096, 14336, "fp8"),
    "glm_o_fp8_block": (4096, 12288, "fp8_block"),
    "qwen3_o_bf16": (2048, 4096, "bf16"),
}


def _weights(n: int, k: int, kind: str) -> tuple[list[tuple[torch.Tensor, ...]], Callable]:
    elem = 2 if kind == "bf16" else 1
    layers = max(8, math.ceil(SPAN_BYTES / (n * k * elem)))
    out = []
    for _ in range(layers):
        if kind == "bf16":
            out.append((torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02,))
            continue
        w = (torch.randn(n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        shape = (n // 128, k // 128) if kind == "fp8_block" else (n,)
        out.append((w, torch.rand(shape, device="cuda") * 0.01 + 0.001))
    if kind == "bf16":
        return out, lambda x, t: half_gemv(x, t[0])
    if kind == "fp8_block":
        return out, lambda x, t: fp8_gemv(x, t[0], t[1], block=(128, 128))
    return out, lambda x, t: fp8_gemv(x, t[0], t[1])


def _step_us(
    weights: list[tuple[torch.Tensor, ...]],
    gemv: Callable | None,
    x: torch.Tensor,
    fraction: float,
    spin_cycles: int,
    chunk: int,
    lines: bool,
) -> float:
    def step(t: tuple[torch.Tensor, ...]) -> None:
        for part in t:
            nbytes = int(part.numel() * part.element_size() * fraction)
            l2_prefetch(part, nbytes, chunk=chunk, lines=lines)
        torch.cuda._sleep(spin_cycles)
        if gemv is not None:
            gemv(x, t)

    step(weights[0])  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for t in weights:
            step(t)
    return graph_replay_ms(graph, REPLAYS, WARMUP) * 1e3 / len(weights)


def run_shape(name: str, spin_cycles: int, fractions: list[float], chunks: list[int]) -> dict:
    n, k, kind = SHAPES[name]
    weights, gemv = _weights(n, k, kind)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    nbytes = sum(p.numel() * p.element_size() for p in weights[0])
    base = _step_us(weights, None, x, 0.0, spin_cycles, 16384, False)
    cold = _step_us(weights, gemv, x, 0.0, spin_cycles, 16384, False) - base
    row: dict[str, Any] = {"shape": name, "n": n, "k": k, "kind": kind, "bytes": nbytes,
                           "spin_only_us": round(base, 2), "gemv_cold_us": round(cold, 2),
                           "prefetched": []}  # fmt: skip
    for fraction in fractions:
        for chunk, lines in [(c, False) for c in chunks] + [(4096, True)]:
            spin = _step_us(weights, None, x, fraction, spin_cycles, chunk, lines)
            full = _step_us(weights, gemv, x, fraction, spin_cycles, chunk, lines)
            row["prefetched"].append({
                "fraction": fraction, "chunk": chunk, "lines": lines,
                "spin_with_prefetch_us": round(spin, 2), "gemv_us": round(full - spin, 2),
                "step_saved_us": round(base + cold - full, 2),
            })  # fmt: skip
    del weights
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--spin-us", type=float, default=12.0)
    ap.add_argument("--fractions", default="0.5,1.0")
    ap.add_argument("--chunks", default="4096,16384,65536")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    clock_khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 0) or 1_980_000
    spin_cycles = int(args.spin_us * clock_khz / 1e3)
    fractions = [float(f) for f in args.fractions.split(",")]
    chunks = [int(c) for c in args.chunks.split(",")]
    rows = []
    for name in args.shapes.split(","):
        rows.append(run_shape(name, spin_cycles, fractions, chunks))
        print(rows[-1], flush=True)
    payload = {"copy_GBps": copy_bandwidth_gbs(), "spin_us": args.spin_us,
               "spin_cycles": spin_cycles, "rows": rows}  # fmt: skip
    print(write_result("l2_prefetch", payload, args.out_dir))


if __name__ == "__main__":
    main()
