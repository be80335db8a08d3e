"""128 x 128 block-scaled FP8 GEMMs (the Qwen3-FP8 / DeepSeek / GLM-4.5 FP8 layout, x quantized
per 1 x 128 group) at the row counts past the decode kernels: the Triton block GEMM
(``fp8_block_gemm``, the default; also in its old tile order, row tile by row tile) against
cuBLASLt's block-scaled GEMM (``blockwise_scaled_mm``, ``KVSERVE_FP8_BLOCK_CUBLAS_ROWS``), per
projection, each as one CUDA graph over distinct weights; error against the fp32 reference and
TFLOP/s against this run's FP8 matmul ceiling.

    python -m benchmarks.fp8_block_gemm [--shapes qkv,o,gate_up,down] [--rows 128,256,1024,8192]

Writes fp8_block_gemm_<tag>_<date>.json.
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import gpu_ceilings, write_result
from benchmarks.fp8_gemv import BLOCK, fp8_layers
from benchmarks.skinny_gemm import SHAPES, graph_us, rel_err
from kvserve.kernels.fp8_gemm import (
    blockwise_scaled_mm,
    blockwise_scaled_mm_fits,
    fp8_block_gemm,
    fp8_gemm_reference,
)
from kvserve.kernels.fp8_quant import quantize_fp8

GEMMS: dict[str, Callable[..., torch.Tensor]] = {
    "triton": lambda xq, xs, w, ws: fp8_block_gemm(xq, xs, w, ws, BLOCK, torch.bfloat16),
    "triton_row_order": lambda xq, xs, w, ws: fp8_block_gemm(
        xq, xs, w, ws, BLOCK, torch.bfloat16, group_m=1
    ),
    "cublas": lambda xq, xs, w, ws: blockwise_scaled_mm(xq, xs, w, ws, torch.bfloat16),
}


def time_shape(shape: str, rows: list[int], replays: int, ceiling: float) -> list[dict[str, Any]]:
    n, k = SHAPES[shape]
    weights = [(layer.weight, layer.weight_scale) for layer in fp8_layers(n, k, block=True)]
    out = []
    for m in rows:
        xs = [quantize_fp8(torch.randn(m, k, device="cuda").to(torch.bfloat16), 128)]
        xs *= len(weights)  # one x, distinct weights: the weights' bytes are what stay out of L2
        ref = fp8_gemm_reference(*xs[0], *weights[0], torch.float32, BLOCK)
        row: dict[str, Any] = {"shape": shape, "M": m, "N": n, "K": k}
        for name, gemm in GEMMS.items():
            if name == "cublas" and not blockwise_scaled_mm_fits(weights[0][0], BLOCK):
                row[name] = {"error": "not taken: blockwise_scaled_mm_fits"}
                continue

            def op(x: tuple, w: tuple, gemm: Callable[..., torch.Tensor] = gemm) -> torch.Tensor:
                return gemm(*x, *w)

            try:
                err = rel_err(op(xs[0], weights[0]), ref)
                us, _ = graph_us(op, xs, weights, replays)
            except RuntimeError as e:  # cuBLASLt refusing a shape is a result, not a crash
                row[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                continue
            tflops = 2 * m * n * k / us / 1e6
            row[name] = {"us": us, "rel_err": err, "TFLOPs": tflops, "of_ceiling": tflops / ceiling}
        out.append(row)
        print(describe(row), flush=True)
    return out


def describe(row: dict[str, Any]) -> str:
    parts = [f"{row['shape']:8s} M={row['M']:5d}"]
    for name in GEMMS:
        r = row[name]
        if "us" in r:
            parts.append(f"{name} {r['us']:7.1f} us {r['TFLOPs']:5.0f} TF ({r['of_ceiling']:.0%})")
        else:
            parts.append(f"{name} {r['error'][:60]}")
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--rows", default="65,128,256,1024,8192")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--tag", default="h200")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("fp8_block_gemm needs a CUDA GPU")
    gc.freeze()  # each graph capture runs gc.collect()
    ceil = gpu_ceilings()
    rows = [int(v) for v in args.rows.split(",")]
    result: dict[str, Any] = {"ceilings": ceil, "rows": []}
    for shape in args.shapes.split(","):
        result["rows"] += time_shape(shape, rows, args.replays, ceil["fp8_matmul_TFLOPs"])
        torch.cuda.empty_cache()
    print(write_result(f"fp8_block_gemm_{args.tag}", result, args.out_dir))


if __name__ == "__main__":
    main()
