"""A/B of one boolean engine setting on one machine: decode rate with it on and off.

Engines alternate on, off, on, off (``--rounds``) so that drift in the GPU's clocks falls on
both; each measures the decode rate at the given batches (1K context, rate between output lengths
64 and 192, as in roofline.py), Llama-3-8B shape, bf16 dummy weights. Writes
engine_ab_<setting>_<tag>_<date>.json.

    PYTHONPATH=. python3 benchmarks/engine_ab.py --setting enable_pdl --out-dir $OUT
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


def measure(model: str, settings: dict[str, object], batches: list[int]) -> dict[str, float]:
    config = build_engine_config(
        model, load_format="dummy", device="cuda", dtype="bfloat16", **settings
    )
    core = EngineCore(config)
    rates = {f"decode_b{b}_tok_s": decode_rate(core, b, 1024, 64, 192)["tok_s"] for b in batches}
    del core
    gc.collect()
    torch.cuda.empty_cache()
    return rates


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--setting", required=True, help="a boolean engine setting, e.g. enable_pdl")
    ap.add_argument("--model", default="benchmarks/configs/llama-3-8b")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--tag", default="h200")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    runs = []
    for r in range(args.rounds):
        for value in (True, False):
            rates = measure(args.model, {args.setting: value}, batches)
            runs.append({"round": r, args.setting: value, **rates})
            print(runs[-1], flush=True)
    out = None if args.out_dir is None else Path(args.out_dir)
    name = f"engine_ab_{args.setting}_{args.tag}"
    print(write_result(name, {"setting": args.setting, "context": 1024, "runs": runs}, out))


if __name__ == "__main__":
    main()
