"""`kvserve preflight`: check this node's GPU stack (and a model, if given) before serving."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvserve.errors import ConfigError
from kvserve.preflight.checks import run_checks
from kvserve.preflight.collect import collect
from kvserve.preflight.options import KV_CACHE_DTYPES, PreflightOptions
from kvserve.preflight.report import exit_code, render_table, to_json, verdict


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvserve preflight",
        description="Check drivers, Fabric Manager, CUDA, NVLink, InfiniBand, NCCL, thermals, host "
        "limits and (with --model) the model, and print the fix for each failure. "
        "Exit status 1 if any check fails.",
    )
    p.add_argument("--model", type=Path, help="HF model directory or .gguf file to check")
    p.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, help="TP ranks")
    p.add_argument("--context-length", "--max-model-len", dest="context_length", type=int)
    p.add_argument(
        "--max-running-requests",
        "--max-num-seqs",
        dest="max_running_requests",
        type=int,
        help="target concurrency the KV cache must hold at --context-length",
    )
    p.add_argument(
        "--mem-fraction-static",
        "--gpu-memory-utilization",
        dest="mem_fraction_static",
        type=float,
        default=0.88,
        help="share of GPU memory for weights + KV (default 0.88)",
    )
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    p.add_argument(
        "--quantization", help="override the checkpoint's: fp8, modelopt, nvfp4, mxfp4, gguf"
    )
    p.add_argument(
        "--gpu-memory-gib", type=float, help="size the model against this GPU when none is visible"
    )
    p.add_argument("--nccl", action="store_true", help="also run a short NCCL all-reduce")
    p.add_argument("--json", type=Path, dest="json_path", help="write the full report here")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    opts = PreflightOptions(
        model=args.model,
        tp=args.tp,
        context_length=args.context_length,
        max_running_requests=args.max_running_requests,
        mem_fraction_static=args.mem_fraction_static,
        kv_cache_dtype=args.kv_cache_dtype,
        quantization=args.quantization,
        nccl=args.nccl,
        gpu_memory_gib=args.gpu_memory_gib,
    )
    facts = collect(opts)
    rows = run_checks(facts, opts)
    print(render_table(rows))
    print(verdict(rows))
    if args.json_path is not None:
        try:
            args.json_path.write_text(to_json(rows, facts, opts) + "\n")
        except OSError as exc:
            raise ConfigError(f"cannot write --json {args.json_path}: {exc.strerror}") from exc
    return exit_code(rows)
