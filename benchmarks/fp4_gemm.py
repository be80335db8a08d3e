"""Weight-only FP4 GEMMs (NVFP4, MXFP4; ``kvserve/kernels/fp4_gemm.py``) at decode shapes
against their bytes ceiling and against bf16 cuBLAS on the same shapes, in one run.

The floor of a linear is the larger of its weight bytes / bandwidth (the copy ceiling of this
run: 0.5 byte per value plus the block scales, 1 byte per 16 or 32 values, for FP4; 2 bytes for
bf16) and its FLOPs / the run's bf16 matmul rate (what bounds prefill-sized M). Timing as in
``benchmarks/skinny_gemm.py``: one CUDA graph runs the op over L distinct weights (>= 256 MB of
them, over 4x the L2), time per op = replay time / L, median over replays; each config is
checked against the torch reference before and after. Shapes: Llama-3-8B's fused projections
at M = 1, 16, 64, 256 (``--rows`` takes prefill sizes too); the default config and up to
--max-configs candidates per row (at M <= 4 the default is the CUDA-core GEMV, GemvConfig; from
``DEQUANT_GEMM_MIN_ROWS`` dequantize-then-cuBLAS, DequantGemmConfig; the MMA kernel's tiles
follow). Above 128 rows the dequantizing kernel is also timed alone, against its bytes floor
(codes and scales read, the dense bf16 weight written).
About four minutes on an H200, mostly Triton compiles.

    python -m benchmarks.fp4_gemm --out-dir $OUT
"""

from __future__ import annotations

import argparse
import gc
import math
import time
from dataclasses import asdict
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import copy_bandwidth_gbs, matmul_tflops, write_result
from benchmarks.skinny_gemm import graph_us, rel_err
from kvserve.kernels.fp4_dequantize import DequantGemmConfig, dequantize_fp4_dense
from kvserve.kernels.fp4_gemm import MAX_BLOCK_M, Fp4Config, candidate_configs, fp4_linear
from kvserve.kernels.fp4_reference import fp4_linear_reference, group_size_of

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
ROWS = [1, 16, 64, 256]
FORMATS = ("nvfp4", "mxfp4")
SPAN_BYTES = 256 << 20
MIN_LAYERS = 8
REL_TOL = 2e-2

Fp4Weight = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def random_fp4(fmt: str, n: int, k: int) -> Fp4Weight:
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
    if fmt == "nvfp4":
        block = torch.rand(n, k // 16, device="cuda").add_(0.5).div_(3 * k**0.5)
        return packed, block.to(torch.float8_e4m3fn), torch.ones(n, device="cuda")
    exponent = round(math.log2(1 / (3 * k**0.5))) + 127
    return packed, torch.full((n, k // 32), exponent, dtype=torch.uint8, device="cuda"), None


def fp4_bytes(weight: Fp4Weight) -> int:
    return sum(t.numel() * t.element_size() for t in weight if t is not None)


def time_config(
    cfg: Fp4Config, xs: list[torch.Tensor], weights: list[Fp4Weight],
    ref: torch.Tensor, replays: int,
) -> dict[str, Any]:  # fmt: skip
    def op(x: torch.Tensor, w: Fp4Weight) -> torch.Tensor:
        return fp4_linear(x, *w, config=cfg)

    try:
        err = rel_err(op(xs[0], weights[0]), ref)  # compiles outside the capture
        if not err <= REL_TOL:
            return {"error": f"output off by {err:.3g} of its max"}
        us, out = graph_us(op, xs, weights, replays)
    except Exception as e:  # noqa: BLE001 - a config that does not compile (shared memory) etc.
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    err = rel_err(out, ref)
    if not err <= REL_TOL:
        return {"error": f"output after graph replays off by {err:.3g} of its max", "us": us}
    return {"us": us}


def time_row(
    fmt: str, name: str, weights: list[Fp4Weight], bf16: list[torch.Tensor], m: int,
    ceil: dict[str, float], args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    n, k = weights[0][0].shape[0], weights[0][0].shape[1] * 2
    xs = [torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for _ in weights]
    ref = fp4_linear_reference(xs[0], *weights[0])
    matmul_floor_us = 2 * m * n * k / (ceil["bf16_matmul_TFLOPs"] * 1e6)
    floor_us = max(fp4_bytes(weights[0]) / (ceil["copy_GBps"] * 1e3), matmul_floor_us)
    bf16_floor_us = max(n * k * 2 / (ceil["copy_GBps"] * 1e3), matmul_floor_us)
    cublas_us, _ = graph_us(F.linear, xs[: len(bf16)], bf16, args.replays)
    row: dict[str, Any] = {"format": fmt, "shape": name, "N": n, "K": k, "M": m}
    row |= {"layers": len(weights), "floor_us": floor_us, "bf16_floor_us": bf16_floor_us}
    row |= {"matmul_floor_us": matmul_floor_us, "cublas_bf16_us": cublas_us}
    if m > MAX_BLOCK_M:
        row |= time_dequantize(weights, xs, ceil["copy_GBps"], args.replays)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    group = group_size_of(weights[0][1])
    configs = candidate_configs(m, n, k, num_sms=sms, group=group)[: args.max_configs or None]
    results = [
        {"kind": type(c).__name__, "config": asdict(c)}
        | time_config(c, xs, weights, ref, args.replays)
        for c in configs
    ]
    ok = [r for r in results if "error" not in r]
    row |= {"configs": results, "failed": len(results) - len(ok)}
    if "error" not in results[0]:
        row["default_us"] = results[0]["us"]
        row["default_share_of_ceiling"] = floor_us / results[0]["us"]
    if ok:
        best = min(ok, key=lambda r: r["us"])
        row |= {"best": best["config"], "best_kind": best["kind"], "best_us": best["us"]}
        row["best_share_of_ceiling"] = floor_us / best["us"]
        row["speedup_vs_cublas_bf16"] = cublas_us / best["us"]
    return row


# (block_n, block_k, num_warps) of the dequantizing kernel timed alone, after its default
DEQUANTIZE_TILES = ((64, 256, 4), (128, 256, 8), (64, 512, 8), (16, 1024, 4))


def time_dequantize(
    weights: list[Fp4Weight], xs: list[torch.Tensor], copy_gbs: float, replays: int
) -> dict[str, Any]:
    """The dequantizing kernel of DequantGemmConfig alone at its default tile and
    DEQUANTIZE_TILES, against reading the FP4 weight and writing it in bf16 at the copy rate."""
    n, k = weights[0][0].shape[0], weights[0][0].shape[1] * 2
    floor_us = (fp4_bytes(weights[0]) + 2 * n * k) / (copy_gbs * 1e3)
    default = DequantGemmConfig()
    others = [DequantGemmConfig(*tile) for tile in DEQUANTIZE_TILES]
    configs = [default, *(c for c in others if c != default)]
    tiles = []
    for cfg in configs:
        us, _ = graph_us(
            lambda x, w, cfg=cfg: dequantize_fp4_dense(*w, x.dtype, cfg), xs, weights, replays
        )
        tiles.append({"config": asdict(cfg), "us": us, "share_of_copy": floor_us / us})
    first = tiles[0]
    return {"dequantize_us": first["us"], "dequantize_share_of_copy": first["share_of_copy"],
            "dequantize_tiles": tiles}  # fmt: skip


def describe(row: dict[str, Any]) -> str:
    line = (
        f"{row['format']} {row['shape']:8s} M={row['M']:4d}: floor {row['floor_us']:6.1f} us"
        f" | cuBLAS bf16 {row['cublas_bf16_us']:6.1f} us (floor {row['bf16_floor_us']:.1f})"
    )
    if "best_us" in row:
        c = " ".join(f"{key}={value}" for key, value in row["best"].items())
        line += (
            f" | fp4 {row['best_us']:6.1f} us ({100 * row['best_share_of_ceiling']:3.0f}%,"
            f" x{row['speedup_vs_cublas_bf16']:.2f} vs bf16) {row['best_kind']} {c};"
            f" default {row.get('default_us', float('nan')):.1f} us"
        )
    if "dequantize_us" in row:
        best = min(row["dequantize_tiles"], key=lambda t: t["us"])
        line += (
            f" | dequantize alone {row['dequantize_us']:.1f} us"
            f" ({100 * row['dequantize_share_of_copy']:.0f}% of copy; best tile"
            f" {best['us']:.1f} us, {100 * best['share_of_copy']:.0f}%)"
        )
    if row.get("failed"):
        line += f" [{row['failed']} configs failed]"
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated M values")
    ap.add_argument("--max-configs", type=int, default=10, help="configs per row; 0: all")
    ap.add_argument("--replays", type=int, default=10, help="timed graph replays per op")
    args = ap.parse_args()
    t0 = time.perf_counter()
    ceil = {"copy_GBps": copy_bandwidth_gbs(), "bf16_matmul_TFLOPs": matmul_tflops()}
    print(f"ceilings {ceil}", flush=True)
    gc.freeze()  # each graph capture runs gc.collect(); leave the imported modules out of it
    rows = []
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        layers = max(MIN_LAYERS, math.ceil(SPAN_BYTES / (n * k // 2)))
        bf16_layers = max(MIN_LAYERS, math.ceil(SPAN_BYTES / (n * k * 2)))
        bf16 = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(bf16_layers)]
        for fmt in args.formats.split(","):
            weights = [random_fp4(fmt, n, k) for _ in range(layers)]
            for m in [int(v) for v in args.rows.split(",")]:
                row = time_row(fmt, name, weights, bf16, m, ceil, args)
                rows.append(row)
                print(f"[{time.perf_counter() - t0:5.0f} s] {describe(row)}", flush=True)
            del weights
        del bf16
        torch.cuda.empty_cache()
    payload = {**ceil, "span_bytes": SPAN_BYTES, "rows": rows}
    print(write_result("fp4_gemm", payload, args.out_dir))


if __name__ == "__main__":
    main()
