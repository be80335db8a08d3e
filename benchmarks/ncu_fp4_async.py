"""A driver for Nsight Compute: the asynchronous-MMA FP4 GEMM (``kernels/fp4_async_gemm.py``) and
the shipped Triton FP4 kernel (``kernels/fp4_gemm.py``) once each on Llama-3-8B projections at
one x tile (the async kernel with each W decode, uncapped and at two programs an SM). It times
nothing itself; ncu reads the counters, e.g. where a K step's time goes (warp stalls, issue
slots):

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats \\
        --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis \\
        -k regex:fp4 --csv --page details \\
        python -m benchmarks.ncu_fp4_async --shapes gate_up:1,down:1,down:4 --rows 64
"""

from __future__ import annotations

import argparse
import itertools

import torch

from benchmarks.fp4_async import SHAPES
from benchmarks.fp4_gemm import random_fp4
from kvserve.kernels.fp4_async_choice import TWO_PROGRAMS_REGISTERS
from kvserve.kernels.fp4_async_gemm import fp4_async_linear
from kvserve.kernels.fp4_gemm import fp4_linear


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", default="nvfp4", choices=["nvfp4", "mxfp4"])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--shapes", default="gate_up:1,down:1,down:4", help="name:split of the async")
    args = ap.parse_args()
    torch.manual_seed(0)
    for item in args.shapes.split(","):
        name, split = item.split(":")
        n, k = SHAPES[name]
        weight = random_fp4(args.format, n, k)
        x = torch.randn(args.rows, k, dtype=torch.bfloat16, device="cuda")
        fp4_linear(x, *weight)
        for bits, regs in itertools.product((False, True), (None, TWO_PROGRAMS_REGISTERS)):
            fp4_async_linear(x, *weight, split_k=int(split), bits=bits, max_registers=regs)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
