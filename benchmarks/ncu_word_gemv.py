"""A driver for Nsight Compute: the word GEMV (``kvserve/kernels/word_gemv.py``) at one bf16 row on
Llama-3-8B's qkv, gate_up and down, six distinct weights each (so L2 does not hold them), for the
formats named; with ``--rows`` above one, the FP4 formats' default there, the MMA kernel of
``kvserve/kernels/fp4_gemm.py`` (``-k regex:fp4_gemm``). It times nothing itself; ncu reads the
counters. On the H200 (Firecracker machines, where ncu works; leave the clocks alone):

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section WarpStateStats --section SchedulerStats --section Occupancy \\
        --section LaunchStats --section ComputeWorkloadAnalysis -k regex:word_gemv -c 30 \\
        python -m benchmarks.ncu_word_gemv nvfp4 mxfp4 fp8

``fp8-half`` is FP8 with ``GemvConfig.half_sums``; ``fp8-block`` and ``fp8-block-half`` carry
128 x 128 block scales; ``fp8-skinny`` is the swap-AB tensor-core kernel
(``kvserve/kernels/fp8_skinny_gemm.py``, ``-k regex:fp8_skinny``) at ``--rows`` with the engine's
choices for per-channel weights (x quantized first past 32 rows, one x scale a row);
``--shapes`` takes names of ``benchmarks/skinny_gemm.py``'s shapes (GLM-4.5-Air's ``glm_qkv``,
``glm_o``, ...).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

DEFAULT_SHAPES = "qkv,gate_up,down"
WEIGHTS = 6


def run_fp8(fmt: str, x: object, n: int, k: int) -> None:
    """One launch of the FP8 GEMV at its default tile (``fmt``: fp8[-block][-half])."""
    import torch

    from kvserve.kernels.word_gemv import FP8_PER_WORD, fp8_gemv, fp8_gemv_config

    weight = (torch.randn(n, k, device="cuda") * 0.02).to(torch.float8_e4m3fn)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = fp8_gemv_config(n, k // FP8_PER_WORD, 1, sms)
    cfg = replace(cfg, half_sums=fmt.endswith("-half"))
    if "-block" in fmt:
        scale = torch.ones(-(-n // 128), -(-k // 128), device="cuda")
        fp8_gemv(x, weight, scale, config=cfg, block=(128, 128))
    else:
        fp8_gemv(x, weight, torch.ones(n, device="cuda"), config=cfg)


def run_fp8_skinny(x: object, n: int, k: int) -> None:
    """One launch of the swap-AB FP8 kernel as a per-channel layer's decode step takes it."""
    import torch

    from kvserve.kernels.fp8_skinny_gemm import fp8_skinny_linear
    from kvserve.quant.fp8_config import Fp8Spec
    from kvserve.quant.fp8_method import skinny_row_scale

    weight = (torch.randn(n, k, device="cuda") * 0.02).to(torch.float8_e4m3fn)
    row_scale = skinny_row_scale(Fp8Spec("channel", "token"))  # as Fp8LinearMethod passes it
    fp8_skinny_linear(x, weight, torch.ones(n, device="cuda"), x_row_scale=row_scale)  # type: ignore[arg-type]


def run(fmt: str, n: int, k: int, rows: int = 1) -> None:
    import torch

    from benchmarks.fp4_gemm import random_fp4
    from kvserve.kernels.fp4_gemm import fp4_linear

    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    for _ in range(WEIGHTS):
        if fmt == "fp8-skinny":
            run_fp8_skinny(x, n, k)
        elif fmt.startswith("fp8"):
            run_fp8(fmt, x, n, k)
        else:
            fp4_linear(x, *random_fp4(fmt, n, k))
    torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("formats", nargs="*", default=["nvfp4", "mxfp4", "fp8"])
    ap.add_argument(
        "--rows", type=int, default=1, help="rows of x (FP8's GEMV takes 1-4, fp8-skinny 1-64)"
    )
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    args = ap.parse_args()
    from benchmarks.skinny_gemm import SHAPES

    for fmt in args.formats:
        for name in args.shapes.split(","):
            run(fmt, *SHAPES[name], args.rows)
            print(f"{fmt} {name} done", flush=True)


if __name__ == "__main__":
    main()
