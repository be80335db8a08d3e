"""Decode-shaped FP8 linears: cuBLAS W8A8 (per-token activation quantization, then
``torch._scaled_mm``), the weight-only CUDA-core GEMV (``fp8_gemv``, at most 4 rows; its default
config and up to --gemv-configs candidates) and the swap-AB tensor-core kernel with in-loop
activation quantization (``fp8_skinny_linear``, at most 64 rows; its default and up to
--skinny-configs candidates), all against the FP8 weight bytes floor of the same run.
Per-channel e4m3 weights of Llama-3-8B's projections; timed as
``benchmarks/skinny_gemm.py`` times (one CUDA graph over L distinct weights, >= 256 MB, so
nothing comes from L2). Each config is checked against the dequantized weight's product.

    python -m benchmarks.fp8_gemv --rows 1,4,16,64 --out-dir $OUT
    python -m benchmarks.fp8_gemv --block --shapes glm_qkv,glm_o --rows 1   # 128 x 128 scales

With ``--block`` the weights carry 128 x 128 block scales and the W8A8 column is the Triton
block GEMM (``fp8_block_gemm``) with activations per 128-column group.

Writes fp8_gemv_<date>.json.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks.common import copy_bandwidth_gbs, write_result
from benchmarks.skinny_gemm import (
    MIN_LAYERS,
    SHAPES,
    SPAN_BYTES,
    graph_us,
    rel_err,
    summarize,
)
from kvserve.kernels.fp8_gemm import dequantize_fp8_weight
from kvserve.kernels.fp8_skinny_gemm import (
    MAX_ROWS,
    Fp8SkinnyConfig,
    fp8_skinny_candidates,
    fp8_skinny_config,
    fp8_skinny_linear,
    fp8_skinny_reference,
)
from kvserve.kernels.word_gemv import (
    FP8_PER_WORD,
    GEMV_ROWS,
    fp8_gemv,
    fp8_gemv_config,
    gemv_candidates,
)
from kvserve.quant.fp8_config import Fp8Spec
from kvserve.quant.fp8_method import (
    SKINNY_ROWS_ENV,
    W8A16_ROWS_ENV,
    Fp8LinearMethod,
    skinny_max_rows,
    skinny_row_scale_enabled,
    w8a16_max_rows,
)
from kvserve.quant.fp8_weights import quantize_weight

BLOCK = (128, 128)  # --block: the DeepSeek-V3 / Qwen3-FP8 / GLM-4.5-FP8 weight scales


def w8a8_method(block: bool) -> Fp8LinearMethod:
    """cuBLAS with per-token activations, or for block scales the Triton block GEMM."""
    if block:
        return Fp8LinearMethod(Fp8Spec("block", "group", BLOCK))
    return Fp8LinearMethod(Fp8Spec("channel", "token"))


def fp8_layers(n: int, k: int, block: bool) -> list[SimpleNamespace]:
    count = max(MIN_LAYERS, math.ceil(SPAN_BYTES / (n * k)))
    layers = []
    for _ in range(count):
        w = torch.randn(n, k, device="cuda").mul_(k**-0.5)
        q, scale = quantize_weight(w, "block", BLOCK) if block else quantize_weight(w, "channel")
        layers.append(SimpleNamespace(weight=q, weight_scale=scale, launch_pdl=False,
                                      out_features=n, in_features=k, input_scale=None))  # fmt: skip
    return layers


def layer_block(layer: SimpleNamespace) -> tuple[int, int] | None:
    return BLOCK if layer.weight_scale.dim() == 2 else None


def time_gemvs(
    xs: list, layers: list, ref: torch.Tensor, floor_us: float, args: argparse.Namespace
) -> dict[str, Any]:
    """The GEMV's default config (first) and up to --gemv-configs candidates, each tile with
    and without ``half_sums``."""
    n, k = layers[0].weight.shape
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, words = xs[0].shape[0], k // FP8_PER_WORD
    default = fp8_gemv_config(n, words, rows, sms)
    others = gemv_candidates(n, words, rows=rows, num_sms=sms)
    tiles = [default, *(c for c in others if c != default)]
    configs = [c for t in tiles for c in (t, replace(t, half_sums=not t.half_sums))]
    results = []
    for cfg in configs[: args.gemv_configs]:

        def op(x: torch.Tensor, layer: SimpleNamespace, c: Any = cfg) -> torch.Tensor:  # noqa: ANN401
            return fp8_gemv(x, layer.weight, layer.weight_scale, config=c, block=layer_block(layer))

        us, out = graph_us(op, xs, layers, args.replays)  # type: ignore[arg-type]
        results.append({"config": asdict(cfg), "us": us, "err": rel_err(out, ref)})
    return summarize("gemv", results, floor_us)


def time_skinny(
    xs: list, layers: list, ref: torch.Tensor, floor_us: float, args: argparse.Namespace
) -> dict[str, Any]:
    """The tensor-core kernel's default config (first, with one x scale a row where the engine
    gives it one: ``skinny_row_scale``) and up to --skinny-configs candidates, each checked
    against its own reference (x quantized as the kernel does); for weights without blocks, the
    candidates that quantize x first again with one x scale a row (``x_row_scale``: the MMAs
    chained)."""
    n, k = layers[0].weight.shape
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    block = layer_block(layers[0])
    w, ws = layers[0].weight, layers[0].weight_scale
    refs = {False: fp8_skinny_reference(xs[0], w, ws, block=block)}
    if block is None:
        refs[True] = fp8_skinny_reference(xs[0], w, ws, group=k)
    candidates = fp8_skinny_candidates(xs[0].shape[0], n, k, num_sms=sms)
    if block:  # tiles inside one scale block
        candidates = [c for c in candidates if c.block_k == BLOCK[1] and BLOCK[0] % c.block_n == 0]
    runs = [(c, False) for c in candidates[: args.skinny_configs]]
    runs += [(c, True) for c, _ in runs if c.quantize_first and block is None]
    # the first run is the default the engine takes (summarize reports it as "default"): past
    # 32 rows of x, W without blocks, one x scale a row with its own tiling (``chained``)
    if skinny_row_scale_enabled() and (candidates[0], True) in runs:
        chained = fp8_skinny_config(xs[0].shape[0], n, k, num_sms=sms, chained=True)
        runs = [(chained, True)] + [r for r in runs if r != (chained, True)]
    results = []
    for cfg, rows in runs:

        def op(
            x: torch.Tensor, layer: SimpleNamespace, c: Fp8SkinnyConfig = cfg, r: bool = rows
        ) -> torch.Tensor:
            return fp8_skinny_linear(x, layer.weight, layer.weight_scale, config=c, block=block,
                                     x_row_scale=r)  # fmt: skip

        us, out = graph_us(op, xs, layers, args.replays)  # type: ignore[arg-type]
        errors = {"err": rel_err(out, refs[rows]), "err_to_exact": rel_err(out, ref)}
        results.append({"config": asdict(cfg) | {"x_row_scale": rows}, "us": us, **errors})
    return summarize("skinny", results, floor_us)


def time_row(name: str, layers: list, m: int, copy_gbs: float, args: argparse.Namespace) -> dict:
    n, k = layers[0].weight.shape
    xs = [torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for _ in layers]
    block = layer_block(layers[0])
    ref = xs[0].float() @ dequantize_fp8_weight(layers[0].weight, layers[0].weight_scale, block).T
    floor_us = n * k / (copy_gbs * 1e3)
    method = w8a8_method(block is not None)
    w8a8 = lambda x, layer: method._matmul(layer, x)  # noqa: E731 - the method's tensor-core path
    w8a8_us, out = graph_us(w8a8, xs, layers, args.replays)  # type: ignore[arg-type]
    row: dict[str, Any] = {"shape": name, "N": n, "K": k, "M": m, "layers": len(layers)}
    row |= {"floor_us": floor_us, "w8a8_us": w8a8_us, "w8a8_share": floor_us / w8a8_us}
    row["w8a8_err"] = rel_err(out, ref)
    if m <= GEMV_ROWS:
        row |= time_gemvs(xs, layers, ref, floor_us, args)
    if m <= MAX_ROWS and args.skinny_configs:
        row |= time_skinny(xs, layers, ref, floor_us, args)
    return row


def describe(row: dict[str, Any]) -> str:
    line = (
        f"{row['shape']:8s} M={row['M']:3d}: floor {row['floor_us']:5.1f} us | W8A8"
        f" {row['w8a8_us']:6.1f} us ({100 * row['w8a8_share']:3.0f}%)"
    )
    if "gemv_us" in row:
        line += (
            f" | GEMV {row['gemv_us']:6.1f} us ({100 * row['gemv_share']:3.0f}%,"
            f" default {row['gemv_default_us']:.1f}) {row['gemv_best']}"
        )
    if "skinny_us" in row:
        line += (
            f" | TC {row['skinny_us']:6.1f} us ({100 * row['skinny_share']:3.0f}%,"
            f" default {row['skinny_default_us']:.1f}) {row['skinny_best']}"
        )
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--gemv-configs", type=int, default=12, help="GEMV configs per row (<= 4)")
    ap.add_argument("--skinny-configs", type=int, default=10, help="tensor-core kernel configs")
    ap.add_argument("--block", action="store_true", help="128 x 128 block weight scales")
    args = ap.parse_args()
    # the W8A8 column is cuBLAS: neither the GEMV nor the tensor-core kernel
    os.environ[W8A16_ROWS_ENV] = os.environ[SKINNY_ROWS_ENV] = "0"
    w8a16_max_rows.cache_clear()
    skinny_max_rows.cache_clear()
    sweep_shapes("fp8_gemv", args, time_row, describe)


RowTimer = Callable[[str, list[SimpleNamespace], int, float, argparse.Namespace], dict[str, Any]]


def sweep_shapes(
    name: str, args: argparse.Namespace, time_row: RowTimer, describe: Callable[[dict], str]
) -> None:
    """``time_row`` over ``--shapes`` x ``--rows`` on fresh FP8 layers of each shape (per-channel
    scales, or ``--block``), a line each as it goes; writes ``<name>_<date>.json``."""
    t0 = time.perf_counter()
    copy_gbs = copy_bandwidth_gbs()
    gc.freeze()  # each graph capture runs gc.collect()
    rows = []
    for shape in args.shapes.split(","):
        layers = fp8_layers(*SHAPES[shape], args.block)
        for m in (int(v) for v in args.rows.split(",")):
            rows.append(time_row(shape, layers, m, copy_gbs, args))
            print(f"[{time.perf_counter() - t0:4.0f} s] {describe(rows[-1])}", flush=True)
        del layers
        torch.cuda.empty_cache()
    result = {"copy_GBps": copy_gbs, "block_scales": BLOCK if args.block else None, "rows": rows}
    print(write_result(name, result, args.out_dir))


if __name__ == "__main__":
    main()
