"""A driver for Nsight Compute: the word GEMV (``kvserve/kernels/word_gemv.py``) at one bf16 row on
Llama-3-8B's qkv, gate_up and down, six distinct weights each (so L2 does not hold them), for the
formats named; with ``--rows`` above one, the FP4 formats' default there, the MMA kernel of
``kvserve/kernels/fp4_gemm.py`` (``-k regex:fp4_gemm``). It times nothing itself; ncu reads the
counters. On the H200 (Firecracker machines, where ncu works; leave the clocks alone):

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section WarpStateStats --section SchedulerStats --section Occupancy \\
        --section LaunchStats --section ComputeWorkloadAnalysis -k regex:word_gemv -c 30 \\
        python -m benchmarks.ncu_word_gemv nvfp4 mxfp4 fp8
"""

from __future__ import annotations

import argparse

SHAPES = {"qkv": (6144, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
WEIGHTS = 6


def run(fmt: str, n: int, k: int, rows: int = 1) -> None:
    import torch

    from benchmarks.fp4_gemm import random_fp4
    from kvserve.kernels.fp4_gemm import fp4_linear
    from kvserve.kernels.word_gemv import fp8_gemv

    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    for _ in range(WEIGHTS):
        if fmt == "fp8":
            weight = (torch.randn(n, k, device="cuda") * 0.02).to(torch.float8_e4m3fn)
            fp8_gemv(x, weight, torch.ones(n, device="cuda"))
        else:
            fp4_linear(x, *random_fp4(fmt, n, k))
    torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("formats", nargs="*", default=["nvfp4", "mxfp4", "fp8"])
    ap.add_argument("--rows", type=int, default=1, help="rows of x (FP8's GEMV takes 1-4)")
    args = ap.parse_args()
    for fmt in args.formats:
        for name, (n, k) in SHAPES.items():
            run(fmt, n, k, args.rows)
            print(f"{fmt} {name} done", flush=True)


if __name__ == "__main__":
    main()
