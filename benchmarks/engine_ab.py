"""A/B of one engine setting on one machine: decode rate (and prefill rate) with each value.

Engines alternate between the values (on, off, on, off for a boolean: ``--rounds``) so that
drift in the GPU's clocks falls on both; each measures the decode rate at the given batches (1K
context, rate between output lengths 64 and 192, as in roofline.py) and, with
``--prefill-lengths``, roofline's prefill rate of prompts of those lengths. Llama-3-8B shape,
bf16 dummy weights (``--quantization``: quantized online at load). Writes
engine_ab_<setting>_<tag>_<date>.json.

    python -m benchmarks.engine_ab --setting enable_pdl --out-dir $OUT
    python -m benchmarks.engine_ab --setting enable_pdl --quantization nvfp4 --batches 1
    python -m benchmarks.engine_ab --setting prefill_attention_backend --values cudnn,triton \
        --batches "" --prefill-lengths 1024,4096,16384
"""

from __future__ import annotations

import argparse

from benchmarks.common import (
    LLAMA_8B,
    allow_longer_context,
    build_engine,
    decode_rate,
    gpu_ceilings,
    release_memory,
    write_result,
)
from benchmarks.roofline import PREFILL_ENGINE, run_prefill


def measure(
    model: str, settings: dict[str, object], batches: list[int], prefill: list[int], ceil: dict
) -> dict[str, float]:
    core = build_engine(model, **settings)
    rates = {f"decode_b{b}_tok_s": decode_rate(core, b, 1024, 64, 192)["tok_s"] for b in batches}
    for row in run_prefill(core, ceil, prefill) if prefill else []:
        rates[f"prefill_{row['prompt_len']}_tok_s"] = row["tok_s"]
        rates[f"prefill_{row['prompt_len']}_share_of_matmul"] = row["share_of_matmul_ceiling"]
    del core
    release_memory()
    return rates


def setting_value(text: str) -> object:
    return {"true": True, "false": False}.get(text.lower(), text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--setting", required=True, help="an engine setting, e.g. enable_pdl")
    ap.add_argument("--values", default="true,false", help="comma list of its values")
    ap.add_argument("--prefill-lengths", default="", help="prompt lengths to time prefill at")
    ap.add_argument("--model", default=LLAMA_8B)
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--tag", default="h200")
    ap.add_argument("--quantization", default=None, help="fp8, nvfp4 or mxfp4 (online)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",") if b]
    prefill = [int(n) for n in args.prefill_lengths.split(",") if n]
    ceil = gpu_ceilings() if prefill else {}
    if prefill:
        allow_longer_context()  # a 32K context on Llama-3-8B's 8K config, as roofline has
    runs = []
    for r in range(args.rounds):
        for value in map(setting_value, args.values.split(",")):
            settings = {args.setting: value, "quantization": args.quantization}
            if prefill:
                settings.update(PREFILL_ENGINE)
            rates = measure(args.model, settings, batches, prefill, ceil)
            runs.append({"round": r, args.setting: value, **rates})
            print(runs[-1], flush=True)
    name = f"engine_ab_{args.setting}_{args.tag}"
    result = {"setting": args.setting, "quantization": args.quantization, "context": 1024,
              "ceilings": ceil, "runs": runs}  # fmt: skip
    print(write_result(name, result, args.out_dir))


if __name__ == "__main__":
    main()
