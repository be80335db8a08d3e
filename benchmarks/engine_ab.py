"""A/B of one boolean engine setting on one machine: decode rate with it on and off.

Engines alternate on, off, on, off (``--rounds``) so that drift in the GPU's clocks falls on
both; each measures the decode rate at the given batches (1K context, rate between output lengths
64 and 192, as in roofline.py), Llama-3-8B shape, bf16 dummy weights (``--quantization``:
quantized online at load). Writes engine_ab_<setting>_<tag>_<date>.json.

    python -m benchmarks.engine_ab --setting enable_pdl --out-dir $OUT
    python -m benchmarks.engine_ab --setting enable_pdl --quantization nvfp4 --batches 1
"""

from __future__ import annotations

import argparse

from benchmarks.common import LLAMA_8B, build_engine, decode_rate, release_memory, write_result


def measure(model: str, settings: dict[str, object], batches: list[int]) -> dict[str, float]:
    core = build_engine(model, **settings)
    rates = {f"decode_b{b}_tok_s": decode_rate(core, b, 1024, 64, 192)["tok_s"] for b in batches}
    del core
    release_memory()
    return rates


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--setting", required=True, help="a boolean engine setting, e.g. enable_pdl")
    ap.add_argument("--model", default=LLAMA_8B)
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--tag", default="h200")
    ap.add_argument("--quantization", default=None, help="fp8, nvfp4 or mxfp4 (online)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    runs = []
    for r in range(args.rounds):
        for value in (True, False):
            settings = {args.setting: value, "quantization": args.quantization}
            rates = measure(args.model, settings, batches)
            runs.append({"round": r, args.setting: value, **rates})
            print(runs[-1], flush=True)
    name = f"engine_ab_{args.setting}_{args.tag}"
    result = {"setting": args.setting, "quantization": args.quantization, "context": 1024,
              "runs": runs}  # fmt: skip
    print(write_result(name, result, args.out_dir))


if __name__ == "__main__":
    main()
