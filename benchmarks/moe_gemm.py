"""The experts' grouped GEMMs at prefill sizes, against cuBLAS on the same FLOPs.

    python -m benchmarks.moe_gemm --models qwen3-30b-a3b,glm-4.5-air --tokens 2048,8192 \
        [--formats bf16,nvfp4] [--max-configs 8]

For each MoE shape (from ``benchmarks/configs/<model>/config.json``) and token count T, the
routing is a softmax top-k of random logits (about T * k / E slots an expert). Per format:
- the gate/up and the down grouped GEMM at the default tile and at ``--max-configs`` others,
  each against ``torch.mm`` of the same [T * k, K] x [K, N] (one dense GEMM: the same FLOPs
  with no grouping, the most a grouped GEMM can hope for);
- the steps around them: the sort of slots by expert, SiLU-mul, the sum of a token's k rows,
  and the whole ``fused_moe*`` call;
- FP4 also: its stacks dequantized whole to bf16 (``dequantize_fp4_dense`` over [E * N, K])
  and the bf16 grouped GEMM on them, the path dense FP4 layers take past 128 rows.
Times are medians of Triton's do_bench (the experts are far larger than L2). Writes
moe_gemm_<tag>_<date>.json.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import gpu_ceilings, median_ms, write_result
from kvserve.kernels.activation import silu_and_mul
from kvserve.kernels.fp4_dequantize import dequantize_fp4_dense
from kvserve.kernels.fused_moe import (
    _block_config,
    _grouped_gemm,
    fused_moe,
    sort_slots_by_expert_kernel,
)
from kvserve.kernels.fused_moe_fp4 import Fp4Stack, _fp4_grouped_gemm, fused_moe_fp4
from kvserve.kernels.moe_routing import with_shared_slot
from kvserve.loader.hf_moe_config import moe_config_of

CONFIGS = Path(__file__).parent / "configs"
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), timed after the default
TILES = (
    (128, 256, 64, 8, 3),
    (128, 256, 64, 8, 4),
    (256, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 128, 8, 3),
    (64, 256, 64, 8, 4),
    (128, 128, 64, 4, 4),
    (64, 128, 64, 4, 4),
)


def moe_shape(model: str) -> dict[str, int]:
    """The experts' shape of ``model``: a directory under benchmarks/configs, or any directory
    holding the model's config.json. ``shared`` is 1 when the engine stacks a shared expert as
    one more expert (one of the routed experts' size: ``kvserve.layers.moe``)."""
    directory = Path(model) if (Path(model) / "config.json").is_file() else CONFIGS / model
    data = json.loads((directory / "config.json").read_text())
    cfg = moe_config_of(data, data["architectures"][0])
    assert cfg is not None, f"{model} is not a mixture of experts"
    return {"experts": cfg.num_experts, "top_k": cfg.top_k, "hidden": data["hidden_size"],
            "inter": cfg.expert_intermediate_size,
            "shared": int(cfg.shared_expert_fits_stacks)}  # fmt: skip


def stacked(shape: dict[str, int]) -> tuple[int, int]:
    """(slots a token, experts in the stacks) of a step as the engine runs ``shape``: a stacked
    shared expert adds one of each. The tile tables stay keyed by the routed ``experts`` and
    ``top_k`` (``moe_tiles.expert_tiles``)."""
    shared = shape.get("shared", 0)
    return shape["top_k"] + shared, shape["experts"] + shared


def random_fp4_stack(fmt: str, e: int, n: int, k: int) -> Fp4Stack:
    packed = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda")
    if fmt == "nvfp4":
        block = torch.rand(e, n, k // 16, device="cuda").add_(0.5).div_(3 * k**0.5)
        return packed, block.to(torch.float8_e4m3fn), torch.ones(e, n, device="cuda")
    exponent = round(math.log2(1 / (3 * k**0.5))) + 127
    return packed, torch.full((e, n, k // 32), exponent, dtype=torch.uint8, device="cuda"), None


def dequantize_stack(stack: Fp4Stack) -> torch.Tensor:
    packed, block, row = stack
    e, n = packed.shape[:2]
    flat = dequantize_fp4_dense(
        packed.flatten(0, 1), block.flatten(0, 1), None if row is None else row.flatten(),
        torch.bfloat16,
    )  # fmt: skip
    return flat.view(e, n, -1)


def tile_config(tile: tuple[int, ...]) -> dict[str, int]:
    keys = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
    return dict(zip(keys, tile, strict=True))


def time_gemm(run: Callable[[dict[str, int]], torch.Tensor], configs: list[dict[str, int]],
              ref: torch.Tensor, flops: float) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    for cfg in configs:
        try:
            out = run(cfg)
            err = float((out.float() - ref).abs().max() / ref.abs().max())
            ms = median_ms(lambda cfg=cfg: run(cfg))
            rows.append({"config": cfg, "ms": ms, "tflops": flops / ms / 1e9, "rel_err": err})
        except Exception as e:  # noqa: BLE001 - a tile that does not fit shared memory etc.
            rows.append({"config": cfg, "error": f"{type(e).__name__}: {str(e)[:160]}"})
    return rows


class Routed:
    """Random tokens routed by a softmax top-k of random logits (then the stacked shared
    expert's slot, as the engine's router writes it), sorted for each BLOCK_M."""

    def __init__(self, shape: dict[str, int], tokens: int, device: str = "cuda") -> None:
        e, routed, h = shape["experts"], shape["top_k"], shape["hidden"]
        self.top_k, self.experts = stacked(shape)
        self.tokens, self.slots = tokens, tokens * self.top_k
        self.x = torch.randn(tokens, h, dtype=torch.bfloat16, device=device)
        weights, ids = torch.randn(tokens, e, device=device).softmax(-1).topk(routed)
        weights, ids = weights / weights.sum(-1, keepdim=True), ids.to(torch.int32)
        weights, ids = with_shared_slot(weights, ids, e, bool(shape.get("shared")))
        self.weights, self.ids = weights.contiguous(), ids.contiguous()
        self.flat_weights = self.weights.flatten().float().contiguous()
        self.default = _block_config(self.slots, self.experts)
        self._sorted: dict[int, Any] = {}

    def blocks(self, block_m: int) -> Any:  # noqa: ANN401 - SortedSlots
        if block_m not in self._sorted:
            self._sorted[block_m] = sort_slots_by_expert_kernel(self.ids, self.experts, block_m)
        return self._sorted[block_m]


def expert_stacks(fmt: str, shape: dict[str, int]) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """(the stacks in ``fmt``, the same experts in bf16)."""
    (_, e), h, inter = stacked(shape), shape["hidden"], shape["inter"]
    if fmt == "bf16":
        w13 = torch.randn(e, 2 * inter, h, dtype=torch.bfloat16, device="cuda") / h**0.5
        w2 = torch.randn(e, h, inter, dtype=torch.bfloat16, device="cuda") / inter**0.5
        return (w13, w2), (w13, w2)
    stacks = (random_fp4_stack(fmt, e, 2 * inter, h), random_fp4_stack(fmt, e, h, inter))
    return stacks, (dequantize_stack(stacks[0]), dequantize_stack(stacks[1]))


def time_projection(fmt: str, r: Routed, which: int, a: torch.Tensor, stack: Any,
                    dense: torch.Tensor, max_configs: int) -> dict[str, Any]:  # fmt: skip
    """One grouped GEMM (0: gate/up, 1: down) over its tiles, cuBLAS on the same FLOPs, and
    for FP4 the dequantize-whole path."""
    n, k = dense.shape[1], dense.shape[2]
    flops = 2.0 * r.slots * n * k
    rw = None if which == 0 else r.flat_weights
    gemm = _grouped_gemm if fmt == "bf16" else _fp4_grouped_gemm
    a_rows = a.repeat_interleave(r.top_k, 0) if which == 0 else a
    cublas_ms = median_ms(lambda: a_rows @ dense[0].t())

    def run(cfg: dict[str, int]) -> torch.Tensor:
        return gemm(a, stack, r.blocks(cfg["BLOCK_M"]), r.slots, r.top_k, cfg, rw)

    def bf16_grouped() -> torch.Tensor:
        return _grouped_gemm(a, dense, r.blocks(r.default["BLOCK_M"]), r.slots, r.top_k,
                             r.default, rw)  # fmt: skip

    configs = [r.default] + [tile_config(t) for t in TILES[:max_configs]]
    entry: dict[str, Any] = {"N": n, "K": k, "cublas_same_flops_ms": cublas_ms,
                             "cublas_tflops": flops / cublas_ms / 1e9}  # fmt: skip
    entry["configs"] = time_gemm(run, configs, bf16_grouped().float(), flops)
    if fmt != "bf16":
        entry["dequantize_ms"] = median_ms(lambda: dequantize_stack(stack))
        entry["bf16_grouped_ms"] = median_ms(bf16_grouped)
    return entry


def time_format(fmt: str, shape: dict[str, int], tokens: int, max_configs: int,
                ) -> dict[str, Any]:  # fmt: skip
    r = Routed(shape, tokens)
    stacks, dense = expert_stacks(fmt, shape)
    blocks = r.blocks(r.default["BLOCK_M"])
    gate_up = _grouped_gemm(r.x, dense[0], blocks, r.slots, r.top_k, r.default, None)
    hidden = silu_and_mul(gate_up)
    row: dict[str, Any] = {"format": fmt, "tokens": tokens, "slots": r.slots}
    row["default"] = r.default
    for which, name, a in ((0, "gate_up", r.x), (1, "down", hidden)):
        row[name] = time_projection(fmt, r, which, a, stacks[which], dense[which], max_configs)
    down = torch.randn(r.slots, shape["hidden"], dtype=torch.bfloat16, device="cuda")
    row["sort_ms"] = median_ms(
        lambda: sort_slots_by_expert_kernel(r.ids, r.experts, r.default["BLOCK_M"])
    )
    row["silu_mul_ms"] = median_ms(lambda: silu_and_mul(gate_up))
    row["sum_ms"] = median_ms(lambda: down.view(tokens, r.top_k, -1).sum(dim=1))
    whole = fused_moe if fmt == "bf16" else fused_moe_fp4
    row["fused_moe_ms"] = median_ms(lambda: whole(r.x, *stacks, r.weights, r.ids))
    return row


def describe(model: str, row: dict[str, Any]) -> str:
    lines = [f"{model} {row['format']} T={row['tokens']}: fused_moe {row['fused_moe_ms']:.3f} ms"
             f" (sort {row['sort_ms']:.3f}, silu {row['silu_mul_ms']:.3f},"
             f" sum {row['sum_ms']:.3f})"]  # fmt: skip
    for name in ("gate_up", "down"):
        p = row[name]
        ok = [c for c in p["configs"] if "ms" in c]
        cells = " ".join(
            f"{'/'.join(str(c['config'][k]) for k in ('BLOCK_M', 'BLOCK_N', 'BLOCK_K'))}"
            f":{c['ms']:.3f}" for c in ok)  # fmt: skip
        extra = ""
        if "dequantize_ms" in p:
            extra = f" | dequant {p['dequantize_ms']:.3f} + bf16 {p['bf16_grouped_ms']:.3f}"
        lines.append(f"  {name} {p['N']}x{p['K']}: cublas {p['cublas_same_flops_ms']:.3f} "
                     f"({p['cublas_tflops']:.0f} TF) | {cells}{extra}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="qwen3-30b-a3b,glm-4.5-air")
    ap.add_argument("--tokens", default="2048,8192")
    ap.add_argument("--formats", default="bf16,nvfp4")
    ap.add_argument("--max-configs", type=int, default=len(TILES))
    ap.add_argument("--tag", default="h200")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    rows = []
    for model in args.models.split(","):
        shape = moe_shape(model)
        for tokens in (int(t) for t in args.tokens.split(",")):
            for fmt in args.formats.split(","):
                row = {"model": model, **shape} | time_format(fmt, shape, tokens, args.max_configs)
                print(describe(model, row), flush=True)
                rows.append(row)
                torch.cuda.empty_cache()
    result = {"ceilings": gpu_ceilings(), "rows": rows}
    print(f"wrote {write_result(f'moe_gemm_{args.tag}', result, args.out_dir)}")


if __name__ == "__main__":
    main()
