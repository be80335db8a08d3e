"""Decode with low-bit weights against bf16, on the same machine in the same run.

    python -m benchmarks.lowbit_decode --formats bf16,fp8,fp8-block,nvfp4,mxfp4 \
        --batches 1,64,256 --context 1024 [--offline] --out-dir benchmarks/results

Llama-3-8B shape, dummy (random) weights, one engine per format, built and dropped in turn.
Decode tok/s at each batch size and 1K context, measured as benchmarks/roofline.py's decode part
(tokens between two output lengths over the time between them), with the share of the
bytes-moved ceiling: (weight bytes of that format + KV read per step) / copy bandwidth; the
ceiling tok/s is what that share would be at 100%. ``--prefill-lengths`` adds prefill
throughput at those prompt lengths (roofline's prefill part: full steps of the engine's token
budget, share of the run's bf16 matmul ceiling, since every format's GEMMs run in bf16 or FP8
on Hopper and the FP8 ones are still counted against bf16). ``--offline`` adds 1000 x (1024
in, 1024 out) per format (minutes each). Formats:

  bf16       the unquantized model
  fp8        --quantization fp8: per-channel FP8 weights, dynamic per-token FP8 activations
             (torch._scaled_mm; steps of 2-64 tokens on kernels/fp8_skinny_gemm.py, of one on
             the weight-only GEMV)
  fp8-tensor ModelOpt FP8 layout: per-tensor weights, static activation scale
  fp8-block  quant_method fp8 with 128x128 weight blocks, per-token-group(128) activations
             (cuBLASLt's block-scaled GEMM past 64 tokens on sm_90, else the Triton one), as
             Qwen3-FP8 / DeepSeek ship
  nvfp4, mxfp4  --quantization nvfp4 / mxfp4 (weight-only, where registered)

A format alone runs with the engine's kernel choices (those of the environment the benchmark
started in). A ``+kv8`` suffix (``bf16+kv8``, ``fp8+kv8``) runs the format with an FP8 (e4m3)
KV cache; a ``+w8a16`` suffix (``fp8+w8a16``) runs FP8 weights weight-only on the CUDA-core
GEMV for steps of up to ``--w8a16-rows`` tokens (``KVSERVE_FP8_W8A16_ROWS``, at most 4; one
token is the engine's default), a ``+w8a8`` suffix for none (so ``fp8,fp8+w8a8`` is an A/B at
batch 1; plain ``fp8`` meant this before 2026-12-05); a ``+cublas`` suffix runs every FP8 step
on cuBLAS W8A8, none on the swap-AB tensor-core kernel (``KVSERVE_FP8_SKINNY_ROWS=0``). Each
format records its KV pool's capacity in tokens at the default memory fraction. ``--contexts``
takes several context lengths (e.g. ``1024,32768`` with ``--batches 1,64,256,32``; a batch
whose KV does not fit the pool is skipped and says so).

Writes lowbit_decode_<tag>_<date>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import (
    LLAMA_8B,
    build_engine,
    gpu_ceilings,
    kv_bytes_per_token,
    kv_capacity_tokens,
    matmul_ceiling_tflops,
    max_running_requests,
    release_memory,
    step_weight_bytes,
    weight_bytes,
    write_result,
)
from benchmarks.roofline import run_decode, run_offline, run_prefill
from kvserve.quant.fp8_method import (
    SKINNY_ROWS_ENV,
    W8A16_ROWS_ENV,
    skinny_max_rows,
    w8a16_max_rows,
)

# format -> (--quantization, quantization_config written into a copy of config.json)
FORMATS: dict[str, tuple[str | None, dict[str, Any] | None]] = {
    "bf16": (None, None),
    "fp8": ("fp8", None),
    "fp8-tensor": (None, {"quant_method": "modelopt", "quant_algo": "FP8"}),
    "fp8-block": (
        None,
        {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
    ),
    "nvfp4": ("nvfp4", None),
    "mxfp4": ("mxfp4", None),
}


def model_dir(base: str, quantization_config: dict[str, Any] | None, tmp: Path) -> str:
    """``base``, or a copy of its config.json with a quantization_config (dummy weights need
    nothing else)."""
    if quantization_config is None:
        return base
    out = tmp / json.dumps(quantization_config, sort_keys=True).encode().hex()[:16]
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((Path(base) / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (out / "config.json").write_text(json.dumps(config))
    for extra in ("generation_config.json",):
        if (Path(base) / extra).is_file():
            shutil.copy(Path(base) / extra, out / extra)
    return str(out)


SUFFIXES = ("kv8", "w8a16", "w8a8", "cublas")
_STARTING_ENV = {var: os.environ.get(var) for var in (W8A16_ROWS_ENV, SKINNY_ROWS_ENV)}


def _set_env(var: str, value: str | None) -> None:
    """``var`` to ``value``, or (None) back to what the benchmark started with."""
    value = _STARTING_ENV[var] if value is None else value
    if value is None:
        os.environ.pop(var, None)
    else:
        os.environ[var] = value


def apply_kernel_settings(suffixes: list[str], w8a16_rows: int, skinny_rows: int | None) -> None:
    """The FP8 kernel choices a format's suffixes name (module docstring); what they leave alone
    goes back to the environment the benchmark started in."""
    w8a16 = "0" if "w8a8" in suffixes else str(w8a16_rows) if "w8a16" in suffixes else None
    _set_env(W8A16_ROWS_ENV, w8a16)
    skinny = None if skinny_rows is None else str(skinny_rows)
    _set_env(SKINNY_ROWS_ENV, "0" if "cublas" in suffixes else skinny)
    w8a16_max_rows.cache_clear()
    skinny_max_rows.cache_clear()


def known_format(name: str, suffixes: tuple[str, ...] = SUFFIXES) -> bool:
    """``name`` is a format, each ``+suffix`` after it one of ``suffixes``."""
    base, *named = name.split("+")
    return base in FORMATS and all(s in suffixes for s in named)


def parse_formats(names: str, suffixes: tuple[str, ...] = SUFFIXES) -> list[str]:
    """``--formats``' comma list, or a one-line exit naming the unknown ones and what is known."""
    formats = names.split(",")
    if unknown := [f for f in formats if not known_format(f, suffixes)]:
        known = f"{', '.join(FORMATS)}, each +{' / +'.join(suffixes)}"
        raise SystemExit(f"unknown format(s) {unknown}; known: {known}")
    return formats


def format_settings(base: str, suffixes: list[str]) -> dict[str, Any]:
    """The engine settings a format names: its online quantization, FP8 KV for ``+kv8``."""
    flag, _ = FORMATS[base]
    settings: dict[str, Any] = {} if flag is None else {"quantization": flag}
    if "kv8" in suffixes:
        settings["kv_cache_dtype"] = "fp8_e4m3"
    return settings


def run_format(name: str, args: argparse.Namespace, ceil: dict, tmp: Path) -> dict[str, Any]:
    base, *suffixes = name.split("+")
    settings = {"max_running_requests": args.max_running, **format_settings(base, suffixes)}
    apply_kernel_settings(suffixes, args.w8a16_rows, args.skinny_rows)
    core = build_engine(model_dir(args.model, FORMATS[base][1], tmp), **settings)
    wbytes = weight_bytes(core)
    kv_tokens = kv_capacity_tokens(core)
    print(f"{name}: weights {wbytes / 1e9:.2f} GB, KV pool {kv_tokens} tokens", flush=True)
    rate = matmul_ceiling_tflops(ceil, fp8_tensor_cores=base.startswith("fp8"))
    prefill = []
    if args.prefill_lengths:
        prefill = run_prefill(core, ceil, args.prefill_lengths, rate)
    rows = run_decode(core, ceil, args.batches, args.contexts) if args.batches else []
    for r in rows:
        if "tok_s" in r:
            r["ceiling_tok_s"] = r["batch"] * ceil["copy_GBps"] * 1e9 / r["bytes_per_step"]
    out: dict[str, Any] = {
        "weight_bytes": wbytes,
        "step_weight_bytes": step_weight_bytes(core),  # what bytes_per_step counts
        "kv_capacity_tokens": kv_tokens,
        "kv_bytes_per_token": kv_bytes_per_token(core),
        "max_running_requests": max_running_requests(core),
        "decode": rows,
        "prefill": prefill,
    }
    if args.offline:
        out["offline"] = run_offline(core, ceil, args.offline_requests, 1024, 1024, rate)
    del core
    release_memory()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=LLAMA_8B)
    ap.add_argument("--formats", default="bf16,fp8,fp8-block")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--contexts", default="1024", help="comma list of context lengths")
    ap.add_argument("--prefill-lengths", default="", help="comma list of prompt lengths")
    ap.add_argument("--max-running", type=int, default=None,
                    help="the running cap (default: the engine's, from its KV pool)")  # fmt: skip
    ap.add_argument("--offline", action="store_true", help="also 1000 x (1024 in, 1024 out)")
    ap.add_argument("--offline-requests", type=int, default=1000)
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--w8a16-rows", type=int, default=1,
                    help="the +w8a16 suffix's row limit (1: the engine's default)")  # fmt: skip
    ap.add_argument("--skinny-rows", type=int, default=None,
                    help="FP8 steps of up to this many tokens on the tensor-core decode kernel "
                    "(KVSERVE_FP8_SKINNY_ROWS; default: the engine's)")  # fmt: skip
    ap.add_argument("--tag", default="h200")
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.prefill_lengths = [int(n) for n in args.prefill_lengths.split(",") if n]
    args.contexts = [int(c) for c in args.contexts.split(",")]
    formats = parse_formats(args.formats)
    ceil = gpu_ceilings()
    result: dict[str, Any] = {"model": args.model, "weights": "dummy", "contexts": args.contexts,
                              "w8a16_rows": args.w8a16_rows, "skinny_rows": args.skinny_rows,
                              "ceilings": ceil,
                              "formats": {}}  # fmt: skip
    print(f"ceilings: {ceil}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in formats:
            try:
                result["formats"][name] = run_format(name, args, ceil, Path(tmp))
            except Exception as exc:  # one format failing must not lose the others' figures
                print(f"{name}: failed: {exc!r}", flush=True)
                result["formats"][name] = {"error": repr(exc)}
                release_memory()
            path = write_result(f"lowbit_decode_{args.tag}", result, args.out_dir)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
