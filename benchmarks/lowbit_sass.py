"""Registers, spills and the K-step loop of the low-bit weight kernels as ptxas compiles their
default configs for sm_90, without a GPU: the word GEMV (``kvserve/kernels/word_gemv.py``; FP4
and FP8 at one row), the FP4 MMA kernel (``kvserve/kernels/fp4_gemm.py``; 16 and 64 rows) and
the FP4 MoE grouped kernel (``kvserve/kernels/fused_moe_fp4.py``; its decode tile), the FP4
kernels with W read as bytes and as words, the MMA kernel at 16 rows with W as either MMA
operand, and the FP8 tensor-core decode kernel (``kvserve/kernels/fp8_skinny_gemm.py``; 1, 16 and
64 rows, x quantized in the loop or, past 32 rows, before the launch).

At one row of x the GEMV is bound by instruction issue and latency, not by DRAM (Nsight Compute
on the H200: 27-48% of DRAM peak, a scheduler issuing about every second cycle;
ncu_word_gemv_h200_2026-12-01.json), and the MMA kernel by its dequantization, so the
instructions a thread spends per weight in the loop, and the registers that decide how many
programs share an SM, are what a change to the decode trades. Llama-3-8B's gate_up shape
(N 28672, K 4096), bf16 x, the launch's integer specializations (multiples of 16). Runs on any
machine with Triton installed:

    python -m benchmarks.lowbit_sass [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import itertools
import re
from collections import Counter
from dataclasses import replace
from typing import Any

from benchmarks.common import write_result
from benchmarks.kernel_spills import compile_sm90, cuobjdump, resource_usage
from kvserve.kernels.fp4_gemm import Fp4GemmConfig, default_config
from kvserve.kernels.fp4_reference import MXFP4_GROUP, NVFP4_GROUP
from kvserve.kernels.fp8_skinny_gemm import Fp8SkinnyConfig, fp8_skinny_config
from kvserve.kernels.word_gemv import (
    FP4_PER_WORD,
    FP8_PER_WORD,
    GemvConfig,
    fp4_gemv_config,
    fp8_gemv_config,
)

N, K = 28672, 4096
THREADS_PER_WARP = 32
MMA_ROWS = (16, 64)
_GEMV_POINTERS = {
    "x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "rs_ptr": "*fp32", "bias_ptr": "*bf16",
    "out_ptr": "*bf16", "ws_ptr": "*fp32", "counter_ptr": "*i32", "slot_expert_ptr": "*i32",
    "router_w_ptr": "*fp32", "sums_ptr": "*fp32", "sum_counter_ptr": "*i32",
}  # fmt: skip
_GEMV_INTS = [
    "M", "N", "words", "stride_xm", "stride_wn", "stride_sn", "stride_om", "words_per_split",
    "num_splits", "stride_we", "stride_se", "stride_rse",
]  # fmt: skip
_MMA_POINTERS = {
    "x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "rs_ptr": "*fp32", "bias_ptr": "*bf16",
    "out_ptr": "*bf16", "ws_ptr": "*fp32", "counter_ptr": "*i32",
}  # fmt: skip
_MMA_INTS = [
    "M", "N", "K", "stride_xm", "stride_wn", "stride_sn", "stride_om", "k_per_split",
    "num_splits",
]  # fmt: skip
# the integer arguments a launch at these shapes specializes as multiples of 16 (the MoE
# kernel's per-expert and per-row strides too, since 2026-12-05: the files before compiled its
# codes and scales without them, in 8-byte and 1-byte pieces, which no launch does)
_DIVISIBLE = {"N", "K", "words", "stride_xm", "stride_xs", "stride_wn", "stride_sn", "stride_om",
              "words_per_split", "k_per_split", "stride_a", "stride_we", "stride_se",
              "stride_rse", "stride_out"}  # fmt: skip


def gemv_defaults() -> dict[str, tuple[GemvConfig, int]]:
    """Format -> (its default GEMV config at one row, its scale group; 0 for FP8)."""
    fp4_words, fp8_words = K // FP4_PER_WORD, K // FP8_PER_WORD
    return {
        "nvfp4": (fp4_gemv_config(N, fp4_words, 1, 132, NVFP4_GROUP), NVFP4_GROUP),
        "mxfp4": (fp4_gemv_config(N, fp4_words, 1, 132, MXFP4_GROUP), MXFP4_GROUP),
        "fp8": (fp8_gemv_config(N, fp8_words, 1, 132), 0),
        "fp8 fp32 sums": (replace(fp8_gemv_config(N, fp8_words, 1, 132), half_sums=False), 0),
    }


def _compile(kernel, pointers: dict, ints: list, constants: dict, options: dict) -> bytes:  # noqa: ANN001
    signature = {**pointers, **{name: "i32" for name in ints}}
    divisible = (*pointers, *(name for name in ints if name in _DIVISIBLE))
    return compile_sm90(kernel, signature, constants, options, divisible)


def compile_gemv(cfg: GemvConfig, group: int) -> bytes:
    """The cubin of ``_word_gemv_kernel`` for one bf16 row of x."""
    from kvserve.kernels.word_gemv import _word_gemv_kernel

    fp4 = group > 0
    constants = {
        "BLOCK_N": cfg.block_n, "BLOCK_W": cfg.block_w, "FP4": fp4, "GROUP": group or 8,
        "ROWS": 1, "SCALE_E8M0": group == MXFP4_GROUP, "HAS_ROW_SCALE": group != MXFP4_GROUP,
        "SCALAR_ROW_SCALE": False, "HAS_BIAS": False, "DIRECT": cfg.split_k == 1,
        "USE_ASM": True, "PACKED": fp4 or cfg.half_sums, "X_BF16": True,
        "ASM_SCALE_LOADS": cfg.asm_scale_loads, "MOE": False, "A_PER_TOKEN": False,
        "SCALE_ROWS": False, "TOP_K": 1, "SUM_TOKENS": 0, "USE_PDL": True,
        "X_CHUNK": 0 if fp4 or not cfg.half_sums else 4096,
    }  # fmt: skip
    options: dict[str, Any] = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if cfg.maxnreg:
        options["maxnreg"] = cfg.maxnreg
    return _compile(_word_gemv_kernel, _GEMV_POINTERS, _GEMV_INTS, constants, options)


def compile_mma(cfg: Fp4GemmConfig, group: int) -> bytes:
    """The cubin of ``_fp4_gemm_kernel`` for bf16 x, K a multiple of its step."""
    from kvserve.kernels.fp4_gemm import _fp4_gemm_kernel

    constants = {
        "BLOCK_N": cfg.block_n, "BLOCK_M": cfg.block_m, "BLOCK_K": cfg.block_k, "GROUP": group,
        "SCALE_E8M0": group == MXFP4_GROUP, "HAS_ROW_SCALE": group == NVFP4_GROUP,
        "HAS_BIAS": False, "EVEN_K": True, "DIRECT": cfg.split_k == 1, "DOT_PRECISION": "tf32",
        "WORD_DEQUANT": cfg.word_dequant, "W_AS_B": cfg.w_as_b,
    }  # fmt: skip
    pointers = {**_MMA_POINTERS, "w_ptr": "*i32" if cfg.word_dequant else "*u8"}
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return _compile(_fp4_gemm_kernel, pointers, _MMA_INTS, constants, options)


_FP8_TC_POINTERS = {
    "x_ptr": "*bf16", "xs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "rs_ptr": "*fp32",
    "bias_ptr": "*bf16", "out_ptr": "*bf16", "ws_ptr": "*fp32", "counter_ptr": "*i32",
}  # fmt: skip
_FP8_TC_INTS = [
    "M", "N", "K", "stride_xm", "stride_xs", "stride_wn", "stride_om", "stride_rs", "k_per_split",
    "num_splits",
]  # fmt: skip
FP8_TC_ROWS = (1, 16, 64)


def compile_fp8_skinny(cfg: Fp8SkinnyConfig, x_row_scale: bool = False) -> bytes:
    """The cubin of ``_fp8_skinny_kernel`` (per-channel scales) at ``cfg``, x read as bf16 or,
    with ``quantize_first``, as e4m3 (``x_row_scale``: with one scale a row, the MMAs
    chained)."""
    from kvserve.kernels.fp8_skinny_gemm import _fp8_skinny_kernel

    constants = {
        "BLOCK_N": cfg.block_n, "BLOCK_M": cfg.block_m, "BLOCK_K": cfg.block_k, "EVEN_K": True,
        "DIRECT": cfg.split_k == 1, "SCALAR_ROW_SCALE": False, "SCALE_BLOCK_N": 0,
        "HAS_BIAS": False, "X_FP8": cfg.quantize_first, "WIDEN": False, "USE_PDL": True,
        "X_ROW_SCALE": x_row_scale,
    }  # fmt: skip
    pointers = {**_FP8_TC_POINTERS, "x_ptr": "*fp8e4nv" if cfg.quantize_first else "*bf16"}
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return _compile(_fp8_skinny_kernel, pointers, _FP8_TC_INTS, constants, options)


_MOE_POINTERS = {
    "a_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "rs_ptr": "*fp32", "out_ptr": "*bf16",
    "slots_ptr": "*i32", "block_expert_ptr": "*i32", "weights_ptr": "*fp32",
}  # fmt: skip
_MOE_INTS = [
    "num_slots", "N", "K", "stride_a", "stride_we", "stride_wn", "stride_se", "stride_sn",
    "stride_rse", "stride_out",
]  # fmt: skip
# the decode tile of fused_moe._block_config (up to 16 slots an expert)
MOE_TILE = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4}
_MOE_THREADS = MOE_TILE["num_warps"] * THREADS_PER_WARP
MOE_WEIGHTS_PER_THREAD = MOE_TILE["BLOCK_N"] * MOE_TILE["BLOCK_K"] // _MOE_THREADS


def compile_moe(group: int, words: bool) -> bytes:
    """The cubin of ``fused_moe_fp4``'s grouped kernel (gate/up: x rows per token, top 8) at
    the decode tile, W read as words or bytes."""
    from kvserve.kernels.fused_moe_fp4 import _fp4_grouped_gemm_kernel

    tiles = {key: MOE_TILE[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}
    constants = {
        "TOP_K": 8, "A_PER_TOKEN": True, "SCALE_ROWS": False, "ONE_SLOT_PER_BLOCK": False,
        "GROUP": group, "SCALE_E8M0": group == MXFP4_GROUP,
        "HAS_ROW_SCALE": group == NVFP4_GROUP, **tiles, "DOT_PRECISION": "tf32",
        "WORD_DEQUANT": words, "EVEN_K": K % MOE_TILE["BLOCK_K"] == 0,
    }  # fmt: skip
    pointers = {**_MOE_POINTERS, "w_ptr": "*i32" if words else "*u8"}
    options = {"num_warps": MOE_TILE["num_warps"], "num_stages": MOE_TILE["num_stages"]}
    return _compile(_fp4_grouped_gemm_kernel, pointers, _MOE_INTS, constants, options)


def compile_dequantize(group: int, words: bool) -> bytes:
    """The cubin of ``fp4_dequantize``'s kernel (W whole to bf16, for large steps) at its
    default tile, W read as words or bytes."""
    from kvserve.kernels.fp4_dequantize import DequantGemmConfig, _dequantize_kernel

    cfg = DequantGemmConfig()
    constants = {
        "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "GROUP": group,
        "SCALE_E8M0": group == MXFP4_GROUP, "HAS_ROW_SCALE": group == NVFP4_GROUP,
        "WORD_DEQUANT": words,
    }  # fmt: skip
    pointers = {"w_ptr": "*i32" if words else "*u8", "s_ptr": "*u8", "rs_ptr": "*fp32",
                "out_ptr": "*bf16"}  # fmt: skip
    ints = ["N", "K", "stride_wn", "stride_sn"]
    return _compile(_dequantize_kernel, pointers, ints, constants, {"num_warps": cfg.num_warps})


_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_BRANCH = re.compile(r"BRA\s+0x([0-9a-f]+)")


def k_loop_span(sass: str) -> tuple[int, int]:
    """(first, last) address of the longest loop: a backward branch's target to the branch,
    among the branches before the last unconditional EXIT (past it lie the out-of-line slow
    paths, such as an mbarrier wait's retry, which branch back into the body from far below)."""
    instructions = [(int(m.group(1), 16), m.group(2), line) for line in sass.splitlines()
                    if (m := _LINE.search(line))]  # fmt: skip
    exits = [a for a, op, line in instructions if op == "EXIT" and "@" not in line.split("*/")[1]]
    body_end = exits[-1] if exits else instructions[-1][0]
    loops = []
    for address, opcode, line in instructions:
        target = _BRANCH.search(line) if opcode == "BRA" else None
        if target and int(target.group(1), 16) < address < body_end:
            loops.append((int(target.group(1), 16), address))
    if not loops:
        raise ValueError("no backward branch in the SASS")
    return max(loops, key=lambda span: span[1] - span[0])


def loop_opcodes(sass: str) -> Counter[str]:
    """Opcodes (without modifiers) of the longest loop (``k_loop_span``): the K-step loop
    (FP8's half sums have a short one before it, x's peak)."""
    start, end = k_loop_span(sass)
    listed = [m for line in sass.splitlines() if (m := _LINE.search(line))]
    return Counter(m.group(2).split(".")[0] for m in listed if start <= int(m.group(1), 16) <= end)


def describe(cubin: bytes, weights: int) -> dict[str, Any]:
    """``weights``: a thread's share of one K step's weight tile."""
    ops = loop_opcodes(cuobjdump(cubin, "-sass"))
    total = sum(ops.values())
    return {
        **resource_usage(cubin), "loop_instructions": total, "weights_per_thread_step": weights,
        "instructions_per_weight": total / weights, "loop_opcodes": dict(ops.most_common()),
    }  # fmt: skip


def measure() -> list[dict[str, Any]]:
    rows = []
    for fmt, (cfg, group) in gemv_defaults().items():
        per_word = FP4_PER_WORD if group else FP8_PER_WORD
        weights = cfg.block_n * cfg.block_w * per_word // (cfg.num_warps * THREADS_PER_WARP)
        row = {"kernel": "word GEMV", "format": fmt, "rows": 1, "config": vars(cfg)}
        rows.append({**row, **describe(compile_gemv(cfg, group), weights)})
    for fmt, group in (("nvfp4", NVFP4_GROUP), ("mxfp4", MXFP4_GROUP)):
        for m, words, flip in itertools.product(MMA_ROWS, (False, True), (False, True)):
            if flip and m > 32:
                continue  # W as B takes at most 32 rows
            cfg = default_config(m, N, K, group=group)
            cfg = replace(cfg, word_dequant=words, w_as_b=cfg.w_as_b != flip)
            weights = cfg.block_n * cfg.block_k // (cfg.num_warps * THREADS_PER_WARP)
            row = {"kernel": "FP4 MMA", "format": fmt, "rows": m, "config": vars(cfg)}
            rows.append({**row, **describe(compile_mma(cfg, group), weights)})
        for words in (False, True):
            config = {**MOE_TILE, "word_dequant": words}
            row = {"kernel": "FP4 MoE grouped", "format": fmt, "rows": 16, "config": config}
            rows.append({**row, **describe(compile_moe(group, words), MOE_WEIGHTS_PER_THREAD)})
    for m in FP8_TC_ROWS:
        cfg = fp8_skinny_config(m, N, K)
        weights = cfg.block_n * cfg.block_k // (cfg.num_warps * THREADS_PER_WARP)
        row = {"kernel": "FP8 tensor-core decode", "format": "fp8", "rows": m, "config": vars(cfg)}
        rows.append({**row, **describe(compile_fp8_skinny(cfg), weights)})
        if cfg.quantize_first:  # and with one x scale a row; and x quantized in the loop
            chained = {**row, "config": {**vars(cfg), "x_row_scale": True}}
            rows.append({**chained, **describe(compile_fp8_skinny(cfg, True), weights)})
            cfg = replace(cfg, quantize_first=False)
            row = {**row, "config": vars(cfg)}
            rows.append({**row, **describe(compile_fp8_skinny(cfg), weights)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    rows = measure()
    for row in rows:
        words = " word_dequant" if row["config"].get("word_dequant") else ""
        words += " w_as_b" if row["config"].get("w_as_b") else ""
        words += " quantize_first" if row["config"].get("quantize_first") else ""
        words += " x_row_scale" if row["config"].get("x_row_scale") else ""
        print(f"{row['kernel']}{words} {row['format']} M={row['rows']}: "
              f"{row.get('REG')} registers, {row.get('STACK')} bytes of stack, "
              f"{row['loop_instructions']} loop instructions for "
              f"{row['weights_per_thread_step']} weights a thread "
              f"({row['instructions_per_weight']:.2f} a weight)")  # fmt: skip
    shape = {"N": N, "K": K, "x": "bf16"}
    print(write_result("lowbit_sass_sm90", {"target": "sm_90", "shape": shape, "kernels": rows},
                       args.out_dir))  # fmt: skip


if __name__ == "__main__":
    main()
