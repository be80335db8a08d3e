"""Issue rate of the instructions the low-bit kernels decode with, on the GPU: the FP8-to-half
conversion (``cvt.rn.f16x2.e4m3x2``, SASS ``F2FP``) against a plain integer op (``PRMT``) and a
packed half FMA (``HFMA2``), each in a loop of independent chains with nothing else to wait on.

The word GEMV widens two weight codes per ``F2FP`` and the FP8 KV decode attention widens its
keys and values the same way; if ``F2FP`` issues at a fraction of the integer ops' rate, decoding by
integer ops (a layout whose half-precision pairs come out of a shift and a ``LOP3``) is the next
lever for both (see benchmarks/results/INDEX.md). Reported: instructions per SM per clock at an
assumed SM clock (``--sm-clock-mhz``), and their ratio to ``PRMT``'s; a composite op (the
integer decode) counts once.

Measured on the H200 (convert_throughput_h200_2026-12-01.json): F2FP, HFMA2, PRMT and the f16 ->
f32 widening all ran at 63 per SM per clock, and the four-instruction integer decode at 15.9:
F2FP is not slower than the integer ops, so decoding by integer ops would cost more, not less.
That run also timed two chains that measured nothing and are gone: shifts, which folded away
(4096 shifts by one of a 32-bit word), and a LOP3 whose function is idempotent (its ``lop3`` row
in that file is not a rate).

    python -m benchmarks.convert_throughput [--out-dir $OUT]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from benchmarks.common import median_ms, write_result
from kvserve.kernels._triton import jit, tl

CHAINS = 8  # independent dependency chains per thread: enough to cover each op's latency
ITERS = 4096
BLOCK = 256  # threads per program (8 warps), one element each
OPS = {
    # the low half's two e4m3 bytes -> f16x2 (unpacking a register's halves costs nothing)
    "f2fp_e4m3x2_to_f16x2": "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; "
    "cvt.rn.f16x2.e4m3x2 $0, lo; }",
    "hfma2": "{ .reg .b32 one; mov.b32 one, 0x3c003c00; fma.rn.f16x2 $0, $1, one, one; }",
    "prmt": "prmt.b32 $0, $1, 0, 0x1404;",
    # f16 -> f32 widening (the GEMVs' lane sums); the result's bits feed the chain
    "cvt_f32_f16": "{ .reg .b16 lo, hi; .reg .f32 f; mov.b32 {lo, hi}, $1; cvt.f32.f16 f, lo; "
    "mov.b32 $0, f; }",
    # two e4m3 bytes -> f16x2 by integer ops, worth value * 2**-8: PRMT spreads the bytes to the
    # halves' high bytes, SHR moves exponent and mantissa under f16's, two LOP3s keep the signs
    # at bits 15 / 31 and clear the copies SHR left at 14 / 30 (no one LOP3 can do both)
    "int_e4m3x2_to_f16x2": "{ .reg .b32 t, s, m; prmt.b32 t, $1, 0, 0x1404; shr.b32 s, t, 1; "
    "and.b32 s, s, 0x3f803f80; and.b32 m, t, 0x80008000; or.b32 $0, s, m; }",
}


@jit
def _op(x, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.uint32, is_pure=True, pack=1)


@jit
def _throughput_kernel(out_ptr, seed, ASM: tl.constexpr, ITERS: tl.constexpr,
                       BLOCK: tl.constexpr):  # fmt: skip
    lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x0 = (lanes * 7 + seed).to(tl.uint32)
    x1, x2, x3 = x0 ^ 1, x0 ^ 2, x0 ^ 3
    x4, x5, x6, x7 = x0 ^ 4, x0 ^ 5, x0 ^ 6, x0 ^ 7
    for _ in range(ITERS):
        # each chain feeds its result back: the op cannot be hoisted or folded
        x0 = _op(x0, ASM)
        x1 = _op(x1, ASM)
        x2 = _op(x2, ASM)
        x3 = _op(x3, ASM)
        x4 = _op(x4, ASM)
        x5 = _op(x5, ASM)
        x6 = _op(x6, ASM)
        x7 = _op(x7, ASM)
    tl.store(out_ptr + lanes, x0 ^ x1 ^ x2 ^ x3 ^ x4 ^ x5 ^ x6 ^ x7)


def time_op(name: str, programs: int) -> float:
    """Seconds per launch (median, after warm-up)."""
    out = torch.empty(programs * BLOCK, dtype=torch.int32, device="cuda")

    def launch() -> None:
        _throughput_kernel[(programs,)](out, 12345, ASM=OPS[name], ITERS=ITERS, BLOCK=BLOCK,
                                        num_warps=BLOCK // 32)  # fmt: skip

    return median_ms(launch) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--sm-clock-mhz", type=float, default=1980.0,
                    help="for per-clock rates (the H200's most; ratios need none)")  # fmt: skip
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    clock_hz = args.sm_clock_mhz * 1e6
    programs = sms * 8  # 64 warps per SM resident
    rows: dict[str, Any] = {}
    for name in OPS:
        seconds = time_op(name, programs)
        instructions = programs * BLOCK * CHAINS * ITERS  # per-thread instructions in the loop
        per_sm_clock = instructions / seconds / clock_hz / sms
        rows[name] = {"seconds": seconds, "per_sm_per_clock": per_sm_clock}
        print(f"{name:24s} {seconds * 1e3:8.3f} ms  {per_sm_clock:6.1f} per SM per clock")
    for row in rows.values():
        row["vs_prmt"] = row["per_sm_per_clock"] / rows["prmt"]["per_sm_per_clock"]
    result = {"sms": sms, "clock_hz": clock_hz, "chains": CHAINS, "iters": ITERS, "ops": rows}
    print(write_result("convert_throughput", result, args.out_dir))


if __name__ == "__main__":
    main()
