"""Registers and local-memory spills of the paged decode attention kernel's configs, compiled for
sm_90 without a GPU (Triton's compiler and ptxas; ``cuobjdump -res-usage`` reads the cubin).

The FP8 decode kernel reads 32K-token contexts at 63% of copy bandwidth where bf16 reaches 102%
(fp8_kv_decode_h200_configs_2026-12-01.json). A thread that spills its tiles to local memory
re-reads them on every step, so this is the first thing to check for a config before it costs
device time. Runs on any machine with Triton installed (``pip install triton``):

    python -m benchmarks.kernel_spills [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from typing import Any

from benchmarks.common import write_result

# (cache, BLOCK_N, num_warps, fused merge, cut): the defaults first, then neighbours. The cut is
# the split plan (decode_attention.SplitPlan): "even" splits each sequence alike, "balanced"
# by the batch's tokens, "mean floor" as balanced with no split below the mean (full batches).
CONFIGS = [
    ("bf16", 64, 4, False, "even"),
    ("bf16", 64, 4, False, "balanced"),
    ("bf16", 64, 4, True, "mean floor"),
    ("fp8", 64, 4, True, "even"),
    ("fp8", 64, 4, True, "balanced"),
    ("fp8", 64, 4, True, "mean floor"),
    ("fp8", 128, 4, True, "even"),
    ("fp8", 64, 8, True, "even"),
]
_ARGS = {
    "q_ptr": "*bf16", "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "part_out_ptr": "*fp32",
    "part_lse_ptr": "*fp32", "out_ptr": "*bf16", "counter_ptr": "*i32", "scale_log2": "fp32",
    "stride_qb": "i32", "stride_qh": "i32", "stride_cache_page": "i64", "stride_cache_tok": "i32",
    "stride_cache_head": "i32", "stride_bt": "i32", "stride_ob": "i32", "stride_oh": "i32",
    "num_splits": "i32", "min_split": "i32", "budget": "i32",
}  # fmt: skip
# The strides a launch on Llama-3-8B heads passes (page 16 x 8 heads x 128 dims, 32 q heads):
# multiples of 16, which Triton specializes on, and without which it cannot prove the 16-byte
# contiguity of a row: compiled without them (as before 2026-12-02) the kernel loads a byte or
# an element at a time and spills, which no real launch does.
_LAUNCH_MULTIPLES_OF_16 = (
    "stride_qb", "stride_qh", "stride_cache_page", "stride_cache_tok", "stride_cache_head",
    "stride_ob", "stride_oh",
)  # fmt: skip


def compile_sm90(
    kernel,  # noqa: ANN001 - a Triton JITFunction
    signature: dict[str, str],
    constants: dict[str, Any],
    options: dict[str, Any],
    divisible: tuple[str, ...] = (),
) -> bytes:
    """The cubin of ``kernel`` compiled for sm_90 without a GPU: ``signature`` types its
    runtime arguments, ``constants`` its constexprs; ``divisible`` names the arguments a launch
    would specialize as multiples of 16 (pointers, and integers such as K)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    index = kernel.arg_names.index
    src = ASTSource(
        kernel,
        signature={**signature, **{name: "constexpr" for name in constants}},
        constexprs={(index(k),): v for k, v in constants.items()},
        attrs={(index(name),): [["tt.divisibility", 16]] for name in divisible},
    )
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["cubin"]


def compile_decode(cache: str, block_n: int, num_warps: int, fused: bool, cut: str) -> bytes:
    """The cubin of the decode split kernel (``_fp8_decode_split_kernel`` for an FP8 cache) for
    Llama-3-8B heads (4 q heads a kv head); a balanced cut for a batch of up to 32."""
    from kvserve.kernels.decode_attention import _decode_split_kernel, line_elements
    from kvserve.kernels.fp8_decode_attention import _fp8_decode_split_kernel

    fp8 = cache == "fp8"
    constants = {
        "PAGE_SIZE": 16, "GROUP": 4, "BLOCK_H": 16, "BLOCK_N": block_n, "HEAD_DIM": 128,
        "DIRECT": False, "USE_PDL": True, "FUSED_MERGE": fused, "BLOCK_S": 32,
        "EARLY_LOADS": True, "LINE": line_elements(128, 1 if fp8 else 2),
        "BALANCED": cut != "even", "BLOCK_B": 32, "MAX_SPLITS": 64,
        "MEAN_FLOOR": cut == "mean floor",
    }  # fmt: skip
    pointer = "*fp8e4nv" if fp8 else "*bf16"
    signature = {**_ARGS, "k_cache_ptr": pointer, "v_cache_ptr": pointer}
    kernel = _fp8_decode_split_kernel
    if fp8:
        signature |= {"k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32"}
    else:
        kernel, constants["DOT_PRECISION"] = _decode_split_kernel, "tf32"
    divisible = tuple(name for name, kind in signature.items() if kind.startswith("*"))
    options = {"num_warps": num_warps, "num_stages": 3}
    return compile_sm90(kernel, signature, constants, options, divisible + _LAUNCH_MULTIPLES_OF_16)


_PREFILL_ARGS = {
    "q_ptr": "*bf16", "out_ptr": "*bf16", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32",
    "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32", "block_tables_ptr": "*i32",
    "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32", "scale_log2": "fp32", "stride_qt": "i32",
    "stride_qh": "i32", "stride_ot": "i32", "stride_oh": "i32", "stride_cache_page": "i64",
    "stride_cache_tok": "i32", "stride_cache_head": "i32", "stride_bt": "i32", "kv_splits": "i32",
}  # fmt: skip


def compile_prefill(cache: str, config: Any, split: bool = False) -> bytes:  # noqa: ANN401
    """The cubin of the prefill kernel for Llama-3-8B heads at a ``PrefillConfig``: ``cache``
    "bf16" or "fp8" (on FP8 tensor cores)."""
    from kvserve.kernels.prefill_attention import _prefill_kernel

    fp8 = cache == "fp8"
    pointer = "*fp8e4nv" if fp8 else "*bf16"
    signature = {**_PREFILL_ARGS, "k_cache_ptr": pointer, "v_cache_ptr": pointer}
    constants = {
        "PAGE_SIZE": 16, "GROUP": 4, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
        "HEAD_DIM": 128, "DOT_PRECISION": "tf32", "LAZY_RESCALE": config.lazy_rescale,
        "FP8": fp8, "SPLIT": split,
        "Q_TERMS": config.fp8_q_terms,
    }  # fmt: skip
    divisible = tuple(name for name, kind in signature.items() if kind.startswith("*"))
    divisible += ("stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_cache_page",
                  "stride_cache_tok", "stride_cache_head")  # fmt: skip
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    return compile_sm90(_prefill_kernel, signature, constants, options, divisible)


def cuobjdump(cubin: bytes, flag: str) -> str:
    """``cuobjdump <flag>`` of a cubin (the cuobjdump Triton ships beside its ptxas)."""
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        path = str(knobs.nvidia.cuobjdump.path)
        return subprocess.run(
            [path, flag, f.name], capture_output=True, text=True, check=True
        ).stdout


def resource_usage(cubin: bytes) -> dict[str, int]:
    """REG (registers a thread), STACK (bytes of local memory a thread), SHARED (static)."""
    text = cuobjdump(cubin, "-res-usage")
    return {key: int(value) for key, value in re.findall(r"(REG|STACK|SHARED):(\d+)", text)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for cache, block_n, warps, fused, cut in CONFIGS:
        usage = resource_usage(compile_decode(cache, block_n, warps, fused, cut))
        rows.append({"cache": cache, "block_n": block_n, "num_warps": warps,
                     "fused_merge": fused, "cut": cut, **usage})  # fmt: skip
        print(f"{cache} BLOCK_N={block_n} warps={warps} fused_merge={fused} {cut}: "
              f"{usage.get('REG')} registers, {usage.get('STACK')} bytes of stack")  # fmt: skip
    print(write_result("kernel_spills_sm90", {"target": "sm_90", "decode": rows}, args.out_dir))


if __name__ == "__main__":
    main()
