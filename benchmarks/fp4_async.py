"""The asynchronous-MMA FP4 GEMM (``kvserve/kernels/fp4_async_gemm.py``, Gluon) against kvserve's
shipped FP4 MMA kernel (``fp4_gemm.py``) at decode steps of 64 and 32 rows on Llama-3-8B's
projections, after a correctness sweep against the shipped kernel over uneven shapes.
Timed as one CUDA graph cycling through >= 256 MB of distinct weights.

    python -m benchmarks.fp4_async --out-dir $OUT
    python -m benchmarks.fp4_async --sass   # the two kernels' sm_90 K loops, no GPU needed
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import torch

from benchmarks.common import write_result
from benchmarks.fp4_gemm import random_fp4
from benchmarks.skinny_gemm import graph_us, rel_err
from kvserve.kernels.fp4_async_choice import TWO_PROGRAMS_REGISTERS, two_programs_fit
from kvserve.kernels.fp4_async_gemm import fp4_async_linear
from kvserve.kernels.fp4_gemm import default_config, fp4_linear
from kvserve.kernels.fp4_reference import MXFP4_GROUP, NVFP4_GROUP
from kvserve.kernels.fp4_step_order import permute_x_steps

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
SPAN_BYTES = 256 << 20
SPLITS = (1, 2, 4, 8)
STAGES = (4,)  # 6 slots lost to 4 in every shape on the H100 (s74)
WARPS = (8, 4)  # the correctness sweep's; timed at 8 (4 spills at 64 rows)
# (m, n, k): rows past a tile, N past a tile, odd step counts, one step
CHECK_SHAPES = ((64, 4096, 4096), (37, 1000, 384), (17, 200, 128), (64, 272, 1152), (5, 96, 640))
CHECK_TOL = 1e-2
SASS_OPCODES = ("HGMMA", "WARPGROUP", "BAR", "STS", "LDSM", "LDS", "LDGSTS", "MEMBAR", "LOP3",
                "SHF", "PRMT", "F2FP", "IMAD", "HMUL2")  # fmt: skip


def compile_async(
    rows: int, group: int, warps: int = 8, stages: int = 4, bits: bool = False
) -> bytes:
    """The cubin of ``_fp4_async_kernel`` for sm_90, unsplit, without a GPU."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from kvserve.kernels.fp4_async_gemm import _X_SMEM, _fp4_async_kernel

    pointers = {
        "x_desc": f"tensordesc<bf16[{rows}, 128],{_X_SMEM!r}>",
        "w_ptr": "*i32", "s_ptr": "*u8", "rs_ptr": "*fp32", "bias_ptr": "*bf16",
        "out_ptr": "*bf16", "ws_ptr": "*fp32", "counter_ptr": "*i32",
    }  # fmt: skip
    ints = ["M", "N", "K", "stride_wn", "stride_sn", "stride_om", "k_per_split"]
    constants = {
        "BLOCK_M": rows, "GROUP": group, "SCALE_E8M0": group == MXFP4_GROUP,
        "HAS_ROW_SCALE": group == NVFP4_GROUP, "HAS_BIAS": False, "DIRECT": True, "STAGES": stages,
        "BITS": bits,
    }  # fmt: skip
    index = _fp4_async_kernel.arg_names.index
    divisible = [*list(pointers)[1:], *ints[2:]]  # not the descriptor
    src = GluonASTSource(
        _fp4_async_kernel,
        signature={
            **pointers,
            **dict.fromkeys(ints, "i32"),
            **dict.fromkeys(constants, "constexpr"),
        },
        constexprs={(index(k),): v for k, v in constants.items()},
        attrs={(index(name),): [["tt.divisibility", 16]] for name in divisible},
    )
    target = GPUTarget("cuda", 90, 32)
    return triton.compile(src, target=target, options={"num_warps": warps}).asm["cubin"]


def sass_summaries(rows: tuple[int, ...] = (64, 32)) -> list[dict[str, Any]]:
    """Both kernels' sm_90 K loops at their 64- and 32-row tiles (Llama-3-8B gate_up's default
    for the shipped one), counted per K step of 128 and per weight a thread decodes."""
    from benchmarks.lowbit_sass import compile_mma, describe

    out = []
    for group, m in itertools.product((NVFP4_GROUP, MXFP4_GROUP), rows):
        cfg = default_config(m, 28672, 4096, group=group)
        shipped = describe(
            compile_mma(cfg, group), cfg.block_n * cfg.block_k // (cfg.num_warps * 32)
        )
        shipped["steps_per_loop"] = 1
        shipped["config"] = str(cfg)
        mine = describe(compile_async(m, group), 16 * 128 * 8 // (8 * 32) * 4)
        bits = describe(compile_async(m, group, bits=True), 16 * 128 * 8 // (8 * 32) * 4)
        mine["steps_per_loop"] = bits["steps_per_loop"] = 4
        for row in (shipped, mine, bits):
            row["instructions_per_step"] = row["loop_instructions"] / row["steps_per_loop"]
            row["weights_per_thread_step"] //= row["steps_per_loop"]
        out.append({"group": group, "rows": m, "shipped": shipped, "async": mine,
                    "async_bits": bits})  # fmt: skip
    return out


def variants(
    splits: tuple[int, ...],
    stages: tuple[int, ...] = STAGES,
    decodes: tuple[bool, ...] = (False, True),
    registers: tuple[int | None, ...] = (None, TWO_PROGRAMS_REGISTERS),
    permutes: tuple[str, ...] = ("torch",),
) -> list[tuple[str, dict[str, Any]]]:
    """(name, ``fp4_async_linear`` keywords) of each setting to check or time, at 8 warps:
    ``bits`` the bit-placing decode, ``regs 128`` two programs an SM; x permuted by torch's
    copy, ``tperm`` by the Triton kernel (``fp4_x_permute``), ``xperm`` by none (its producer
    wrote it permuted: ``with_input`` hands the kernel x so)."""
    out = []
    for split, slots, bits, regs, permute in itertools.product(
        splits, stages, decodes, registers, permutes
    ):
        name = f"split {split} warps {WARPS[0]} stages {slots}" + (" bits" if bits else "")
        name += (f" regs {regs}" if regs else "") + PERMUTE_SUFFIX[permute]
        out.append((name, {"split_k": split, "num_warps": WARPS[0], "stages": slots,
                           "bits": bits, "max_registers": regs,
                           "triton_permute": permute == "triton",
                           "x_permuted": permute == "producer"}))  # fmt: skip
    return out


PERMUTE_SUFFIX = {"torch": "", "triton": " tperm", "producer": " xperm"}


def with_input(x: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    """x as the setting's kernel reads it: in its K-step order where its producer wrote it so."""
    return permute_x_steps(x, kwargs["bits"]) if kwargs["x_permuted"] else x


def check(fmt: str, settings: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The async kernel against the shipped one (both exact weights, fp32 sums), with split K,
    a row scale (NVFP4) and a bias, in each setting."""
    rows = []
    for (m, n, k), (name, kwargs) in itertools.product(CHECK_SHAPES, settings):
        packed, scales, row_scale = random_fp4(fmt, n, k)
        if row_scale is not None:
            row_scale = torch.rand(n, device="cuda") + 0.5
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        ref = fp4_linear(x, packed, scales, row_scale, bias)
        out = fp4_async_linear(with_input(x, kwargs), packed, scales, row_scale, bias, **kwargs)
        err = rel_err(out, ref)
        rows.append({"format": fmt, "m": m, "n": n, "k": k, "setting": name,
                     "rel_err": err, "ok": err <= CHECK_TOL})  # fmt: skip
    return rows


def measure_shape(
    fmt: str, rows: int, name: str, replays: int, settings: list[tuple[str, dict[str, Any]]]
) -> dict[str, Any]:
    n, k = SHAPES[name]
    group = NVFP4_GROUP if fmt == "nvfp4" else MXFP4_GROUP
    layers = max(2, -(-SPAN_BYTES // (n * k // 2)))
    weights = [random_fp4(fmt, n, k) for _ in range(layers)]
    x = torch.randn(rows, k, dtype=torch.bfloat16, device="cuda")
    ref = fp4_linear(x, *weights[0]).float()
    row: dict[str, Any] = {"format": fmt, "rows": rows, "shape": name, "n": n, "k": k}
    us, _ = graph_us(lambda xin, w: fp4_linear(xin, *w), [x] * layers, weights, replays)
    row["kvserve_default"] = {"config": str(default_config(rows, n, k, group=group)), "us": us}
    for key, kwargs in settings:
        if kwargs["max_registers"] and not two_programs_fit(rows):
            continue  # a 128-row tile spills under the cap

        def op(xin: torch.Tensor, w: tuple, kw=kwargs) -> torch.Tensor:  # noqa: ANN001
            return fp4_async_linear(xin, *w, **kw)

        xin = with_input(x, kwargs)
        err = rel_err(op(xin, weights[0]), ref)  # compiles outside the capture
        us, _ = graph_us(op, [xin] * layers, weights, replays)
        row[key] = {"us": us, "rel_err": err}
    return row


def best_by_family(row: dict[str, Any]) -> dict[str, float]:
    """The best time (us) of each decode and register cap over the splits timed."""
    best: dict[str, float] = {}
    for key, value in row.items():
        if isinstance(value, dict) and "rel_err" in value:
            family = ("bits" if " bits" in key else "e4m3") + (
                f" regs {key.split(' regs ')[1].split()[0]}" if " regs " in key else ""
            )
            family += next((s for s in (" tperm", " xperm") if key.endswith(s)), "")
            best[family] = round(min(best.get(family, float("inf")), value["us"]), 1)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--formats", default="nvfp4,mxfp4")
    ap.add_argument("--rows", default="64,32")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--tag", default="")
    ap.add_argument("--stages", default=",".join(map(str, STAGES)), help="ring slots to time")
    ap.add_argument("--decodes", default="e4m3,bits", help="W decodes to time: e4m3, bits")
    ap.add_argument("--registers", default=f"0,{TWO_PROGRAMS_REGISTERS}",
                    help="register caps a thread to time (0: none)")  # fmt: skip
    ap.add_argument("--splits", default=",".join(map(str, SPLITS)))
    ap.add_argument(
        "--permutes", default="torch", help="x's permutation: torch, triton, producer (none)"
    )
    ap.add_argument("--sass", action="store_true", help="only the sm_90 K loops (no GPU needed)")
    args = ap.parse_args()
    if args.sass:
        rows = sass_summaries()
        for row in rows:
            for kernel in ("shipped", "async", "async_bits"):
                r = row[kernel]
                ops = r["loop_opcodes"]
                per_step = ", ".join(
                    f"{k} {ops.get(k, 0) / r['steps_per_loop']:g}" for k in SASS_OPCODES
                )
                print(f"group {row['group']} rows {row['rows']} {kernel}: REG {r['REG']} "
                      f"STACK {r['STACK']}, {r['instructions_per_step']:.0f} instructions a "
                      f"step, {r['instructions_per_weight']:.2f} a weight; {per_step}")  # fmt: skip
        name = "fp4_async_sass" + (f"_{args.tag}" if args.tag else "")
        print(f"wrote {write_result(name, {'loops': rows}, args.out_dir)}")
        return
    torch.manual_seed(0)
    decodes = tuple(d == "bits" for d in args.decodes.split(","))
    registers = tuple(int(r) or None for r in args.registers.split(","))
    stages = tuple(map(int, args.stages.split(",")))
    permutes = tuple(args.permutes.split(","))
    if not set(permutes) <= set(PERMUTE_SUFFIX):
        ap.error(f"--permutes: each of {', '.join(PERMUTE_SUFFIX)}")
    settings = variants(
        tuple(map(int, args.splits.split(","))), stages, decodes, registers, permutes
    )
    checks = [
        c
        for fmt in args.formats.split(",")
        for c in check(fmt, variants((1, 3), stages, decodes, registers, permutes))
    ]
    bad = [c for c in checks if not c["ok"]]
    print(f"checks: {len(checks) - len(bad)} of {len(checks)} within {CHECK_TOL}; worst "
          f"{max(c['rel_err'] for c in checks):.3g}")  # fmt: skip
    for c in bad:
        print("  off:", c)
    results = []
    for fmt, rows, name in itertools.product(
        args.formats.split(","), map(int, args.rows.split(",")), args.shapes.split(",")
    ):
        row = measure_shape(fmt, rows, name, args.replays, settings)
        timed = [(v["us"], key) for key, v in row.items() if isinstance(v, dict) and "rel_err" in v]
        us, best = min(timed)
        print(f"{fmt} {rows} rows {name}: kvserve {row['kvserve_default']['us']:.1f} us, "
              f"best async {us:.1f} us ({best}, rel err {row[best]['rel_err']:.2g})")  # fmt: skip
        print("  best of each decode and cap:", best_by_family(row))
        results.append(row)
    name = "fp4_async" + (f"_{args.tag}" if args.tag else "")
    print(f"wrote {write_result(name, {'checks': checks, 'shapes': results}, args.out_dir)}")


if __name__ == "__main__":
    main()
