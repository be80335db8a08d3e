"""Decode-shaped GEMMs (few rows, a large weight) against the copy ceiling of the same run:
cuBLAS through ``F.linear``, every candidate config of the skinny Triton kernel
(``kvserve/kernels/skinny_gemm.py``, M <= 64 rows) and, at most 4 rows, the 16-bit word GEMV
(``word_gemv.half_gemv``: its default and up to --gemv-configs candidates).

A decode step's linear layers read each weight once, so their floor is weight bytes / bandwidth,
the copy ceiling (bytes read + written per second). As in the engine's decode graph, which runs
32 layers, each op is timed inside one CUDA graph that runs it over L distinct weights back to
back (L weights >= 256 MB, over 4x the L2): no weight comes from L2 and no launch cost shows.
Time per op = graph replay time / L, median over replays. Each Triton config is checked against
F.linear before it is timed and again after the replays; a failing config is reported, not
timed. Shapes: Llama-3-8B's fused projections and lm_head, bf16. About two minutes on an H200,
mostly Triton compiles (--max-configs, --shapes and --rows trim it).

    python -m benchmarks.skinny_gemm --out-dir $OUT
"""

from __future__ import annotations

import argparse
import gc
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import copy_bandwidth_gbs, graph_replay_ms, write_result
from kvserve.kernels.skinny_gemm import MAX_ROWS, SkinnyGemmConfig, candidate_configs, skinny_linear
from kvserve.kernels.word_gemv import (
    GEMV_ROWS,
    GemvConfig,
    gemv_candidates,
    half_gemv,
)

# name: (N, K) of Llama-3-8B's fused projections and its lm_head
SHAPES = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "lm_head": (128256, 4096),
    # GLM-4.5-Air: attention (96 q heads, 8 kv heads) and the shared expert's projections
    "glm_qkv": (14336, 4096),
    "glm_o": (4096, 12288),
    "glm_shared_gate_up": (2816, 4096),
    "glm_shared_down": (4096, 1408),
    # Qwen3-30B-A3B's attention (32 q heads, 4 kv heads, head 128, hidden 2048)
    "q3_qkv": (5120, 2048),
    "q3_o": (2048, 4096),
    # one rank's shards at TP2 (column-parallel halves N, row-parallel halves K)
    "qkv_tp2": (3072, 4096),
    "o_tp2": (4096, 2048),
    "gate_up_tp2": (14336, 4096),
    "down_tp2": (4096, 7168),
    "lm_head_tp2": (64128, 4096),
}
ROWS = [1, 8, 16, 32, 64, 128]
SPAN_BYTES = 256 << 20  # weights per graph: over 4x the H200's L2
MIN_LAYERS = 8
REL_TOL = 2e-2  # of the output's largest magnitude; bf16 rounding is 0.4%
WARMUP_REPLAYS = 2

Op = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def graph_us(
    op: Op, xs: list[torch.Tensor], weights: list[torch.Tensor], replays: int
) -> tuple[float, torch.Tensor]:
    """(us per op, layer 0's output after the replays) for one graph of ``op`` over all weights."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [op(x, w) for x, w in zip(xs, weights, strict=True)]
    ms = graph_replay_ms(graph, replays, WARMUP_REPLAYS)
    return ms * 1e3 / len(weights), outs[0]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.float()
    return float((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def time_triton(
    cfg: SkinnyGemmConfig,
    xs: list[torch.Tensor],
    weights: list[torch.Tensor],
    ref: torch.Tensor,
    replays: int,
) -> dict[str, Any]:
    def op(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return skinny_linear(x, w, cfg)

    try:
        err = rel_err(op(xs[0], weights[0]), ref)  # compiles outside the capture
        if not err <= REL_TOL:  # NaN fails too
            return {"error": f"output off by {err:.3g} of its max"}
        us, out = graph_us(op, xs, weights, replays)
    except Exception as e:  # noqa: BLE001 - a config that does not compile (shared memory) etc.
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    err = rel_err(out, ref)
    if not err <= REL_TOL:
        return {"error": f"output after graph replays off by {err:.3g} of its max", "us": us}
    return {"us": us}


def time_gemvs(
    xs: list[torch.Tensor], weights: list[torch.Tensor], ref: torch.Tensor, floor_us: float,
    args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    """The 16-bit word GEMV (``half_gemv``, at most 4 rows): the first --gemv-configs of
    ``gemv_candidates`` (its default first), each checked against F.linear."""
    n, k = weights[0].shape
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for cfg in gemv_candidates(n, k // 2, rows=xs[0].shape[0], num_sms=sms)[: args.gemv_configs]:

        def op(x: torch.Tensor, w: torch.Tensor, c: GemvConfig = cfg) -> torch.Tensor:
            return half_gemv(x, w, config=c)

        us, out = graph_us(op, xs, weights, args.replays)
        results.append({"config": asdict(cfg), "us": us, "err": rel_err(out, ref)})
    return summarize("gemv", results, floor_us)


def summarize(kernel: str, results: list[dict[str, Any]], floor_us: float) -> dict[str, Any]:
    """A kernel's timed configs (the default first) and the fastest within REL_TOL."""
    ok = [r for r in results if r["err"] <= REL_TOL]
    row: dict[str, Any] = {f"{kernel}_configs": results, f"{kernel}_default_us": results[0]["us"]}
    if ok:
        best = min(ok, key=lambda r: r["us"])
        row |= {f"{kernel}_us": best["us"], f"{kernel}_best": best["config"],
                f"{kernel}_share": floor_us / best["us"]}  # fmt: skip
    return row


def time_row(
    name: str, weights: list[torch.Tensor], m: int, copy_gbs: float, args: argparse.Namespace
) -> dict[str, Any]:
    n, k = weights[0].shape
    xs = [torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for _ in weights]
    ref = F.linear(xs[0], weights[0])
    floor_us = n * k * 2 / (copy_gbs * 1e3)
    cublas_us, out = graph_us(F.linear, xs, weights, args.replays)
    row: dict[str, Any] = {"shape": name, "N": n, "K": k, "M": m, "layers": len(weights)}
    row["cublas_graph_err"] = rel_err(out, ref)  # a check of the harness: ~0
    row |= {"floor_us": floor_us, "cublas_us": cublas_us, "cublas_share": floor_us / cublas_us}
    if m <= GEMV_ROWS and args.gemv_configs:
        row |= time_gemvs(xs, weights, ref, floor_us, args)
    if m > MAX_ROWS:
        return row
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    configs = candidate_configs(m, n, k, num_sms=sms)[: args.max_configs or None]
    results = [
        {"config": asdict(c), **time_triton(c, xs, weights, ref, args.replays)} for c in configs
    ]
    ok = [r for r in results if "error" not in r]
    row |= {"triton_configs": results, "triton_failed": len(results) - len(ok)}
    if results and "error" not in results[0]:
        row["triton_default_us"] = results[0]["us"]  # candidate_configs puts the default first
    if ok:
        best = min(ok, key=lambda r: r["us"])
        row |= {"triton_best": best["config"], "triton_us": best["us"]}
        row["triton_share"] = floor_us / best["us"]
    return row


def describe(row: dict[str, Any]) -> str:
    line = (
        f"{row['shape']:8s} M={row['M']:4d} L={row['layers']:2d}: floor {row['floor_us']:6.1f} us"
        f" | cuBLAS {row['cublas_us']:6.1f} us ({100 * row['cublas_share']:3.0f}%)"
    )
    if "triton_us" in row:
        c = row["triton_best"]
        line += (
            f" | triton {row['triton_us']:6.1f} us ({100 * row['triton_share']:3.0f}%)"
            f" n{c['block_n']} k{c['block_k']} m{c['block_m']} split{c['split_k']}"
            f" w{c['num_warps']}"
            f" st{c['num_stages']}; default {row.get('triton_default_us', float('nan')):.1f} us"
        )
    if "gemv_us" in row:
        line += (
            f" | GEMV {row['gemv_us']:6.1f} us ({100 * row['gemv_share']:3.0f}%,"
            f" default {row['gemv_default_us']:.1f})"
        )
    if row.get("triton_failed"):
        line += f" [{row['triton_failed']} configs failed]"
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--shapes", default="qkv,o,gate_up,down,lm_head",
                    help="comma-separated names (the *_tp2 ones: a TP2 rank's shards)")  # fmt: skip
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated M values")
    ap.add_argument("--max-configs", type=int, default=0, help="Triton configs per row; 0: all")
    ap.add_argument("--replays", type=int, default=10, help="timed graph replays per op")
    ap.add_argument("--gemv-configs", type=int, default=6,
                    help="word GEMV configs per row of at most 4 (0: none)")  # fmt: skip
    args = ap.parse_args()
    rows_m = [int(m) for m in args.rows.split(",")]
    t0 = time.perf_counter()
    copy_gbs = copy_bandwidth_gbs()
    print(f"copy ceiling {copy_gbs:.0f} GB/s", flush=True)
    gc.freeze()  # each graph capture runs gc.collect(); leave the imported modules out of it
    rows = []
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        layers = max(MIN_LAYERS, math.ceil(SPAN_BYTES / (n * k * 2)))
        weights = [
            torch.randn(n, k, dtype=torch.bfloat16, device="cuda").mul_(k**-0.5)
            for _ in range(layers)
        ]
        for m in rows_m:
            row = time_row(name, weights, m, copy_gbs, args)
            rows.append(row)
            print(f"[{time.perf_counter() - t0:5.0f} s] {describe(row)}", flush=True)
        del weights
        torch.cuda.empty_cache()
    payload = {"copy_GBps": copy_gbs, "span_bytes": SPAN_BYTES, "rows": rows}
    print(write_result("skinny_gemm", payload, args.out_dir))


if __name__ == "__main__":
    main()
