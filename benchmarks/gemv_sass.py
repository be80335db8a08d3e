"""Registers, spills and the K-step loop of the word GEMV (``kvserve/kernels/word_gemv.py``) as
ptxas compiles its default configs for sm_90, without a GPU.

At one row of x the GEMV is bound by instruction issue and latency, not by DRAM (Nsight Compute
on the H200: 27-48% of DRAM peak, a scheduler issuing about every second cycle;
ncu_word_gemv_h200_2026-12-01.json), so the instructions a thread spends per weight in the loop,
and the registers that decide how many programs share an SM, are what a change to the decode
trades. Llama-3-8B's gate_up shape (N 28672, K 4096), bf16 x, one row, the launch's integer
specializations (multiples of 16). Runs on any machine with Triton installed:

    python -m benchmarks.gemv_sass [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from typing import Any

from benchmarks.common import write_result
from benchmarks.kernel_spills import cuobjdump, resource_usage
from kvserve.kernels.fp4_reference import MXFP4_GROUP, NVFP4_GROUP
from kvserve.kernels.word_gemv import (
    FP4_PER_WORD,
    FP8_PER_WORD,
    GemvConfig,
    fp8_gemv_config,
    gemv_config,
)

N, K = 28672, 4096
THREADS_PER_WARP = 32
_POINTERS = {
    "x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "rs_ptr": "*fp32", "bias_ptr": "*bf16",
    "out_ptr": "*bf16", "ws_ptr": "*fp32", "counter_ptr": "*i32", "slot_expert_ptr": "*i32",
    "router_w_ptr": "*fp32",
}  # fmt: skip
_INTS = [
    "M", "N", "words", "stride_xm", "stride_wn", "stride_sn", "stride_om", "words_per_split",
    "num_splits", "top_k", "stride_we", "stride_se", "stride_rse",
]  # fmt: skip
_DIVISIBLE = ["N", "words", "stride_xm", "stride_wn", "stride_sn", "stride_om", "words_per_split"]


def default_configs() -> dict[str, tuple[GemvConfig, int]]:
    """Format -> (its default config at the gate_up shape, its scale group; 0 for FP8)."""
    fp4_words, fp8_words = K // FP4_PER_WORD, K // FP8_PER_WORD
    return {
        "nvfp4": (gemv_config(N, fp4_words, scale_group=NVFP4_GROUP), NVFP4_GROUP),
        "mxfp4": (gemv_config(N, fp4_words, scale_group=MXFP4_GROUP), MXFP4_GROUP),
        "fp8": (fp8_gemv_config(N, fp8_words, 1, 132), 0),
    }


def compile_gemv(cfg: GemvConfig, group: int) -> bytes:
    """The cubin of ``_word_gemv_kernel`` for one bf16 row of x and a split-K launch."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kvserve.kernels.word_gemv import _word_gemv_kernel as kernel

    fp4 = group > 0
    constants = {
        "BLOCK_N": cfg.block_n, "BLOCK_W": cfg.block_w, "FP4": fp4, "GROUP": group or 8,
        "ROWS": 1, "SCALE_E8M0": group == MXFP4_GROUP, "HAS_ROW_SCALE": group != MXFP4_GROUP,
        "SCALAR_ROW_SCALE": False, "HAS_BIAS": False, "DIRECT": cfg.split_k == 1,
        "USE_ASM": True, "PACKED": fp4, "X_BF16": True,
        "ASM_SCALE_LOADS": cfg.asm_scale_loads, "MOE": False, "A_PER_TOKEN": False,
        "SCALE_ROWS": False, "USE_PDL": True,
    }  # fmt: skip
    signature = {**_POINTERS, **{name: "i32" for name in _INTS}}
    signature.update({name: "constexpr" for name in constants})
    index = kernel.arg_names.index
    attrs = {(index(name),): [["tt.divisibility", 16]] for name in [*_POINTERS, *_DIVISIBLE]}
    src = ASTSource(
        kernel,
        signature=signature,
        constexprs={(index(k),): v for k, v in constants.items()},
        attrs=attrs,
    )
    options: dict[str, Any] = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if cfg.maxnreg:
        options["maxnreg"] = cfg.maxnreg
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["cubin"]


_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_BRANCH = re.compile(r"BRA\s+0x([0-9a-f]+)")


def loop_opcodes(sass: str) -> Counter[str]:
    """Opcodes (without modifiers) from the target of the first backward branch to the branch:
    the K-step loop (the only loop before the epilogue)."""
    instructions = [(int(m.group(1), 16), m.group(2), line) for line in sass.splitlines()
                    if (m := _LINE.search(line))]  # fmt: skip
    for address, opcode, line in instructions:
        target = _BRANCH.search(line) if opcode == "BRA" else None
        if target and int(target.group(1), 16) < address:
            start = int(target.group(1), 16)
            return Counter(op.split(".")[0] for a, op, _ in instructions if start <= a <= address)
    raise ValueError("no backward branch in the SASS")


def describe(fmt: str, cfg: GemvConfig, group: int) -> dict[str, Any]:
    cubin = compile_gemv(cfg, group)
    ops = loop_opcodes(cuobjdump(cubin, "-sass"))
    per_word = FP4_PER_WORD if group else FP8_PER_WORD
    threads = cfg.num_warps * THREADS_PER_WARP
    weights = cfg.block_n * cfg.block_w * per_word // threads  # a thread's, per K step
    total = sum(ops.values())
    return {
        "format": fmt, "config": vars(cfg), **resource_usage(cubin),
        "loop_instructions": total, "weights_per_thread_step": weights,
        "instructions_per_weight": total / weights, "loop_opcodes": dict(ops.most_common()),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    rows = []
    for fmt, (cfg, group) in default_configs().items():
        row = describe(fmt, cfg, group)
        rows.append(row)
        print(f"{fmt}: {row.get('REG')} registers, {row.get('STACK')} bytes of stack, "
              f"{row['loop_instructions']} loop instructions for {row['weights_per_thread_step']}"
              f" weights a thread ({row['instructions_per_weight']:.2f} a weight)")  # fmt: skip
    shape = {"N": N, "K": K, "rows": 1, "x": "bf16"}
    print(write_result("gemv_sass_sm90", {"target": "sm_90", "shape": shape, "gemv": rows},
                       args.out_dir))  # fmt: skip


if __name__ == "__main__":
    main()
