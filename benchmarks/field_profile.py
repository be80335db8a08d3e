"""The field's long-context stress profile on one GPU, through the server: `kvserve serve` on
the Llama-3.1-8B shape (dummy weights, 128K rope) and `kvserve bench --profile random` at fixed
lengths (64K-token prompts, 1K-token outputs, 64 concurrent by default), prefix cache off.

Reported: the server's start time (launch to /health 200), TTFT / TPOT / ITL percentiles,
output tok/s, the KV pool's capacity and its occupancy over the run (peak and mean of
kv_cache_usage_perc sampled each second), the peak running / waiting requests, and how many
prompts of this length the pool holds at once.

    python -m benchmarks.field_profile                                   # 64K x 1K x 64
    python -m benchmarks.field_profile --input-len 131072 --concurrency 16 --num-requests 16
    python -m benchmarks.field_profile --kv-cache-dtype fp8_e4m3          # FP8 KV cache
    python -m benchmarks.field_profile --smoke                           # CPU, bundled model
Writes benchmarks/results/field_profile_<tag>_<date>.json (or under --out-dir).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import write_result
from benchmarks.pd_serving import BENCH_KEYS, LLAMA_31_8B, model_dir, run_bench
from kvserve.bench.scrape import parse_metrics
from kvserve.server.launch import ServerProcess, launch_server

EXTRA_KEYS = ("median_itl_ms", "p99_itl_ms", "total_token_throughput", "duration",
              "max_concurrent_requests")  # fmt: skip
SMOKE = {"input_len": 192, "output_len": 8, "num_requests": 4, "concurrency": 4}


def start(args: argparse.Namespace, log: Path) -> tuple[ServerProcess, float, dict]:
    """The server, its seconds from launch to healthy, and the vocabulary sizes in play (the
    dummy model's is cut to the tokenizer's, as in pd_serving, so every sampled id has text)."""
    flags = ["--disable-prefix-cache", "--context-length", str(args.context_length)]
    vocab: dict = {}
    if args.smoke:
        flags += ["--device", "cpu"]
    else:
        model, vocab = model_dir(args.model_config, args.tokenizer_dir, keep_vocab=False)
        flags += ["--model", model, "--load-format", "dummy"]
    if args.kv_cache_dtype:
        flags += ["--kv-cache-dtype", args.kv_cache_dtype]
    started = time.perf_counter()
    server = launch_server(*flags, *args.server_flag, log_level="info", stderr=log.open("w"))
    try:
        server.wait_healthy(1800)
    except BaseException:
        server.stop()
        raise
    return server, time.perf_counter() - started, vocab


def pool(url: str) -> dict[str, float]:
    metrics = parse_metrics(httpx.get(url + "/metrics", timeout=30).text)
    return {k: metrics[k] for k in ("kv_cache_capacity_tokens", "kv_cache_bytes_per_token")
            if k in metrics}  # fmt: skip


def bench(url: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    result = run_bench(url, args, args.tokenizer_dir or "bundled", out, 0.0, "--scrape-metrics")
    row = {k: result.get(k) for k in (*BENCH_KEYS, *EXTRA_KEYS) if k in result}
    server = result.get("server_metrics") or {}
    row["kv_usage_peak"] = server.get("peak_gauges", {}).get("kv_cache_usage_perc")
    row["kv_usage_mean"] = server.get("mean_gauges", {}).get("kv_cache_usage_perc")
    row["peak_running"] = server.get("peak_gauges", {}).get("num_requests_running")
    row["peak_waiting"] = server.get("peak_gauges", {}).get("num_requests_waiting")
    return row


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.field_profile")
    ap.add_argument("--model-config", default=LLAMA_31_8B)
    ap.add_argument("--tokenizer-dir", help="saved tokenizer files (default: the bundled one's)")
    ap.add_argument("--input-len", type=int, default=65536)
    ap.add_argument("--output-len", type=int, default=1024)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--kv-cache-dtype", default=None)
    ap.add_argument("--server-flag", action="append", default=[],
                    help="one more `kvserve serve` argument (repeat it)")  # fmt: skip
    ap.add_argument("--smoke", action="store_true", help="CPU, the bundled model, tiny lengths")
    ap.add_argument("--tag", default=None)
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    args.context_length = args.input_len + args.output_len + 64
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="field-profile-"))
    server, start_s, vocab = start(args, work / "server.log")
    try:
        capacity = pool(server.url)
        row = bench(server.url, args, work / "bench")
    finally:
        server.stop(120)
    held = capacity.get("kv_cache_capacity_tokens", 0) // (args.input_len + args.output_len)
    result = {
        "model_config": "bundled" if args.smoke else args.model_config,
        "weights": "bundled" if args.smoke else "dummy",
        "workload": {k: getattr(args, k) for k in
                     ("input_len", "output_len", "num_requests", "concurrency")},
        "kv_cache_dtype": args.kv_cache_dtype or "model dtype",
        "server_flags": args.server_flag, "server_start_s": start_s, **capacity,
        "requests_the_pool_holds": held, "vocab_size": vocab, "bench": row, "logs": str(work),
    }  # fmt: skip
    tag = args.tag or ("smoke" if args.smoke else f"{args.input_len // 1024}k")
    print(json.dumps(result, indent=1))
    print(f"wrote {write_result(f'field_profile_{tag}', result, args.out_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
