"""Decode-shaped FP8 GEMMs: the FP8 method's W8A8 path as the engine runs it by default
(per-token activation quantization, then ``torch._scaled_mm``) against the weight-only kernels:
the CUDA-core GEMV (``fp8_gemv``, at most 4 rows, its default config) and the skinny MMA kernel
(``skinny_linear_fp8``, every candidate config), all against the FP8 weight bytes floor of the
same run. Per-channel e4m3 weights of Llama-3-8B's projections; timed as
``benchmarks/skinny_gemm.py`` times (one CUDA graph over L distinct weights, >= 256 MB, so
nothing comes from L2). Each config is checked against the dequantized weight's product first.

    python -m benchmarks.skinny_fp8_gemm --rows 1,4,16 --out-dir $OUT
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import time
from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks.common import copy_bandwidth_gbs, write_result
from benchmarks.skinny_gemm import MIN_LAYERS, REL_TOL, SHAPES, SPAN_BYTES, graph_us, rel_err
from kvserve.kernels.skinny_gemm import candidate_configs, skinny_linear_fp8
from kvserve.kernels.word_gemv import FP8_PER_WORD, GEMV_ROWS, fp8_gemv, gemv_candidates
from kvserve.quant.fp8_config import Fp8Spec
from kvserve.quant.fp8_method import W8A16_ROWS_ENV, Fp8LinearMethod, w8a16_max_rows
from kvserve.quant.fp8_weights import quantize_weight

W8A8 = Fp8LinearMethod(Fp8Spec("channel", "token"))


def fp8_layers(n: int, k: int) -> list[SimpleNamespace]:
    count = max(MIN_LAYERS, math.ceil(SPAN_BYTES / (n * k)))
    layers = []
    for _ in range(count):
        q, scale = quantize_weight(torch.randn(n, k, device="cuda").mul_(k**-0.5), "channel")
        layers.append(SimpleNamespace(weight=q, weight_scale=scale))
    return layers


def time_config(cfg: Any, xs: list, layers: list, ref: torch.Tensor, replays: int) -> dict:  # noqa: ANN401
    def op(x: torch.Tensor, layer: SimpleNamespace) -> torch.Tensor:
        return skinny_linear_fp8(x, layer.weight, layer.weight_scale, cfg)

    try:
        err = rel_err(op(xs[0], layers[0]), ref)  # compiles outside the capture
        if not err <= REL_TOL:
            return {"error": f"output off by {err:.3g} of its max"}
        us, out = graph_us(op, xs, layers, replays)  # type: ignore[arg-type]
    except Exception as e:  # noqa: BLE001 - a config that does not compile, etc.
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    if not rel_err(out, ref) <= REL_TOL:
        return {"error": "output off after graph replays", "us": us}
    return {"us": us}


def time_gemvs(xs: list, layers: list, ref: torch.Tensor, floor_us: float, args) -> dict:  # noqa: ANN001
    """The GEMV's default config (first) and up to --gemv-configs candidates."""
    n, k = layers[0].weight.shape
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    configs = gemv_candidates(n, k // FP8_PER_WORD, rows=xs[0].shape[0], num_sms=sms)
    results = []
    for cfg in configs[: args.gemv_configs]:
        op = lambda x, layer, c=cfg: fp8_gemv(x, layer.weight, layer.weight_scale, config=c)  # noqa: E731
        us, out = graph_us(op, xs, layers, args.replays)  # type: ignore[arg-type]
        results.append({"config": asdict(cfg), "us": us, "err": rel_err(out, ref)})
    ok = [r for r in results if r["err"] <= REL_TOL]
    row: dict[str, Any] = {"gemv_configs": results, "gemv_default_us": results[0]["us"]}
    if ok:
        best = min(ok, key=lambda r: r["us"])
        row |= {"gemv_us": best["us"], "gemv_best": best["config"],
                "gemv_share": floor_us / best["us"]}  # fmt: skip
    return row


def time_row(name: str, layers: list, m: int, copy_gbs: float, args: argparse.Namespace) -> dict:
    n, k = layers[0].weight.shape
    xs = [torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for _ in layers]
    w0 = layers[0].weight.float() * layers[0].weight_scale.reshape(-1, 1)
    ref = xs[0].float() @ w0.T
    floor_us = n * k / (copy_gbs * 1e3)
    w8a8 = lambda x, layer: W8A8._matmul(layer, x)  # noqa: E731 - as the engine runs it today
    w8a8_us, out = graph_us(w8a8, xs, layers, args.replays)  # type: ignore[arg-type]
    row: dict[str, Any] = {"shape": name, "N": n, "K": k, "M": m, "layers": len(layers)}
    row |= {"floor_us": floor_us, "w8a8_us": w8a8_us, "w8a8_share": floor_us / w8a8_us}
    row["w8a8_err"] = rel_err(out, ref)
    if m <= GEMV_ROWS:
        row |= time_gemvs(xs, layers, ref, floor_us, args)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    configs = candidate_configs(m, n, k, num_sms=sms)[: args.max_configs or None]
    results = [{"config": asdict(c), **time_config(c, xs, layers, ref, args.replays)}
               for c in configs]  # fmt: skip
    ok = [r for r in results if "error" not in r]
    row |= {"w8a16_configs": results, "w8a16_failed": len(results) - len(ok)}
    if ok:
        best = min(ok, key=lambda r: r["us"])
        row |= {"w8a16_best": best["config"], "w8a16_us": best["us"],
                "w8a16_share": floor_us / best["us"]}  # fmt: skip
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--max-configs", type=int, default=0, help="Triton configs per row; 0: all")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--gemv-configs", type=int, default=12, help="GEMV configs per row (<= 4)")
    args = ap.parse_args()
    os.environ[W8A16_ROWS_ENV] = "0"  # the W8A8 column is the method's tensor-core path
    w8a16_max_rows.cache_clear()
    t0 = time.perf_counter()
    copy_gbs = copy_bandwidth_gbs()
    gc.freeze()  # each graph capture runs gc.collect()
    rows = []
    for name in args.shapes.split(","):
        layers = fp8_layers(*SHAPES[name])
        for m in (int(v) for v in args.rows.split(",")):
            row = time_row(name, layers, m, copy_gbs, args)
            rows.append(row)
            best = (
                f"{row['w8a16_us']:6.1f} us ({100 * row['w8a16_share']:3.0f}%)"
                if "w8a16_us" in row
                else "none ran"
            )
            gemv = (
                f" | GEMV {row['gemv_us']:6.1f} us ({100 * row['gemv_share']:3.0f}%,"
                f" default {row['gemv_default_us']:.1f}) {row['gemv_best']}"
                if "gemv_us" in row
                else ""
            )
            print(f"[{time.perf_counter() - t0:4.0f} s] {name:8s} M={m:3d}: floor "
                  f"{row['floor_us']:5.1f} us | W8A8 {row['w8a8_us']:6.1f} us "
                  f"({100 * row['w8a8_share']:3.0f}%) | MMA W8A16 {best}{gemv}",
                  flush=True)  # fmt: skip
        del layers
        torch.cuda.empty_cache()
    print(write_result("skinny_fp8_gemm", {"copy_GBps": copy_gbs, "rows": rows}, args.out_dir))


if __name__ == "__main__":
    main()
