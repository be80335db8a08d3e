"""A/B of the LM head's skinny Triton GEMM against cuBLAS inside the engine, on one machine.

Engines alternate A (kernel), B (cuBLAS), A, B so that drift in the GPU's clocks falls on both;
each measures the decode rate at the given batches (1K context, rate between output lengths 64
and 192, as in roofline.py). Writes lm_head_ab_<tag>_<date>.json.

    PYTHONPATH=. python3 benchmarks/lm_head_ab.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from results_io import write_result  # noqa: E402
from roofline import decode_rate  # noqa: E402

from kvserve.engine.config_builder import build_engine_config  # noqa: E402
from kvserve.engine.engine_core import EngineCore  # noqa: E402
from kvserve.kernels import skinny_gemm  # noqa: E402


def measure(model: str, use_kernel: bool, batches: list[int]) -> dict[int, float]:
    hopper = skinny_gemm.is_hopper
    if not use_kernel:  # the LM head asks this before taking the kernel path
        skinny_gemm.is_hopper = lambda device: False  # type: ignore[assignment]
    try:
        config = build_engine_config(model, load_format="dummy", device="cuda", dtype="bfloat16")
        core = EngineCore(config)
        rates = {b: decode_rate(core, b, 1024, 64, 192)["tok_s"] for b in batches}
    finally:
        skinny_gemm.is_hopper = hopper
    del core
    gc.collect()
    torch.cuda.empty_cache()
    return rates


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/configs/llama-3-8b")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--tag", default="h200")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    runs = []
    for r in range(args.rounds):
        for use_kernel in (True, False):
            rates = measure(args.model, use_kernel, batches)
            runs.append({"round": r, "lm_head": "skinny" if use_kernel else "cublas", **{
                f"decode_b{b}_tok_s": v for b, v in rates.items()}})  # fmt: skip
            print(runs[-1], flush=True)
    out = None if args.out_dir is None else Path(args.out_dir)
    print(write_result(f"lm_head_ab_{args.tag}", {"context": 1024, "runs": runs}, out))


if __name__ == "__main__":
    main()
