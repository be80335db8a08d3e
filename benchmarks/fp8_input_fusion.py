"""An FP8 layer's activation quantization done by the kernel before it, against its own
quantization kernel, per Llama-3-8B projection at decode-sized steps:
- q/k/v and gate/up: the residual add + RMSNorm, then the layer (which quantizes x by a kernel
  of its own past 32 rows), against ``rms_norm_fp8`` writing e4m3, then the layer on it
  (``KVSERVE_FP8_NORM_QUANT``);
- down: the SiLU-mul, then the layer, against the layer's quantization applying the SiLU-mul
  (``KVSERVE_FP8_SILU_QUANT``).
Whether each pair gives the same bits is recorded (both should), then each is timed as
``benchmarks/fp8_gemv.py`` times (one CUDA graph over distinct weights, >= 256 MB, launches
chained with programmatic dependent launch as in the engine), against the weight bytes floor
at this run's copy rate.

    python -m benchmarks.fp8_input_fusion --rows 48,64,128,256 [--block] --out-dir $OUT

Writes fp8_input_fusion_<date>.json.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks.fp8_gemv import BLOCK, sweep_shapes
from benchmarks.skinny_gemm import graph_us
from kvserve.kernels.activation import silu_and_mul
from kvserve.kernels.rmsnorm import fused_add_rms_norm
from kvserve.kernels.rmsnorm_fp8 import rms_norm_fp8
from kvserve.quant.fp8_activation import Fp8Activation
from kvserve.quant.fp8_config import Fp8Spec
from kvserve.quant.fp8_method import (
    NORM_QUANT_ENV,
    SILU_QUANT_ENV,
    Fp8LinearMethod,
    norm_quant_enabled,
    silu_quant_enabled,
)

EPS = 1e-5
NORM_FED = ("qkv", "gate_up")  # the layers an RMSNorm feeds; "down" takes the SiLU-mul's
Chain = Callable[[torch.Tensor, SimpleNamespace], torch.Tensor]


def _chains(shape: str, method: Fp8LinearMethod, norm_weight: torch.Tensor) -> tuple[Chain, ...]:
    """(the two launches apart, fused) for one layer kind; x is the layer's step input (the
    norm's input, [M, K + K]: x then the residual; or the gate/up output, [M, 2K])."""
    if shape not in NORM_FED:

        def silu_apart(x: torch.Tensor, layer: SimpleNamespace) -> torch.Tensor:
            return method._matmul(layer, silu_and_mul(x, pdl=True))  # type: ignore[arg-type]

        def silu_fused(x: torch.Tensor, layer: SimpleNamespace) -> torch.Tensor:
            out = method.apply_after_silu_mul(layer, x, None)  # type: ignore[arg-type]
            assert out is not None, "the SiLU-mul was not folded at this step size"
            return out

        return silu_apart, silu_fused

    def norm_apart(x: torch.Tensor, layer: SimpleNamespace) -> torch.Tensor:
        hidden, residual = x.chunk(2, dim=1)
        normed, _ = fused_add_rms_norm(hidden, residual, norm_weight, EPS, pdl=True)
        return method._matmul(layer, normed)  # type: ignore[arg-type]

    def norm_fused(x: torch.Tensor, layer: SimpleNamespace) -> torch.Tensor:
        hidden, residual = x.chunk(2, dim=1)
        scheme = method.fp8_input_scheme(layer, hidden)  # type: ignore[arg-type]
        assert scheme is not None, "the layer names no input scheme at this step size"
        q, scales = rms_norm_fp8(
            hidden, residual, norm_weight, EPS, scheme.group, scheme.static_scale, pdl=True
        )
        return method.apply_fp8(layer, Fp8Activation(q, scales, hidden.dtype), None)  # type: ignore[arg-type]

    return norm_apart, norm_fused


def time_row(
    shape: str, layers: list[SimpleNamespace], m: int, copy_gbs: float, args: argparse.Namespace
) -> dict[str, Any]:
    n, k = layers[0].weight.shape
    for layer in layers:
        layer.launch_pdl = True  # chained as in the engine
    spec = Fp8Spec("block", "group", BLOCK) if args.block else Fp8Spec("channel", "token")
    method = Fp8LinearMethod(spec)
    norm_weight = torch.rand(k, device="cuda").add_(0.5).to(torch.bfloat16)
    apart, fused = _chains(shape, method, norm_weight)
    # the residual stream is updated in place each replay: the residual starts small, so its
    # growth over the replays stays in range
    xs = [torch.randn(m, 2 * k, device="cuda").to(torch.bfloat16) for _ in layers]
    for x in xs:
        x[:, k:].mul_(1e-3)
    same = torch.equal(apart(xs[0].clone(), layers[0]), fused(xs[0].clone(), layers[0]))
    floor_us = n * k / (copy_gbs * 1e3)
    apart_us, _ = graph_us(apart, [x.clone() for x in xs], layers, args.replays)
    fused_us, _ = graph_us(fused, [x.clone() for x in xs], layers, args.replays)
    return {
        "shape": shape, "N": n, "K": k, "M": m, "layers": len(layers), "same_bits": same,
        "floor_us": floor_us, "apart_us": apart_us, "fused_us": fused_us,
        "speedup": apart_us / fused_us, "fused_share": floor_us / fused_us,
    }  # fmt: skip


def _switch_on() -> None:
    os.environ[NORM_QUANT_ENV] = os.environ[SILU_QUANT_ENV] = "1"
    norm_quant_enabled.cache_clear()
    silu_quant_enabled.cache_clear()


def describe(row: dict[str, Any]) -> str:
    return (
        f"{row['shape']:8s} M={row['M']:4d}: floor {row['floor_us']:6.1f} us | apart "
        f"{row['apart_us']:6.1f} | fused {row['fused_us']:6.1f} (x{row['speedup']:.3f}) "
        f"same bits: {row['same_bits']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--shapes", default="qkv,gate_up,down")
    ap.add_argument("--rows", default="48,64,128,256", help="comma-separated M (> 32)")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--block", action="store_true", help="128 x 128 block weight scales")
    args = ap.parse_args()
    _switch_on()
    sweep_shapes("fp8_input_fusion", args, time_row, describe)


if __name__ == "__main__":
    main()
