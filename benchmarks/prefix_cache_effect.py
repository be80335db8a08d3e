"""What the prefix cache buys on the `mixed` profile: `kvserve bench` against `kvserve serve`
on the bundled model with the prefix cache on, then against a second server with it off
(``--disable-prefix-cache``), same seed and workload, in one run. Reports the hit rate
(achieved vs ideal), TTFT P50/P99, prefill (input) tok/s and output tok/s of each, and the
on/off ratios. Writes benchmarks/results/prefix_cache_effect_<date>.json.

The `mixed` lengths are scaled down from their defaults (prompts of ~200-800 tokens, 16 output
tokens) so that both runs fit in minutes on a 2-core CPU: 1.5 minutes with the defaults on an
idle one, about 6 on a shared, busy one (``--num-requests 32`` doubles it); the shape (45% chat
sessions, 30% QA, 25% document QA, one system prompt of ~70% of input tokens) is the profile's.
The cache is cold at the start of each run (a fresh server, no warmup). The load average before
and after is recorded because a shared CPU moves the latency figures.

    .venv/bin/python -m benchmarks.prefix_cache_effect [--num-requests 16 --max-concurrency 4]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import write_result
from kvserve.bench import cli as bench_cli
from kvserve.server.launch import launch_server

# scaled-down `mixed` lengths (defaults: 4 turns x 64, QA 128, documents 2048, outputs 128)
MIXED = {"chat-turns": 3, "chat-user-len": 48, "chat-output-len": 16, "qa-len": 64,
         "qa-output-len": 16, "doc-len": 384, "doc-question-len": 32,
         "doc-output-len": 16}  # fmt: skip
FIGURES = ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
           "cached_tokens", "cache_hit_rate", "ideal_cache_hit_rate", "median_ttft_ms",
           "p99_ttft_ms", "mean_ttft_ms", "input_throughput", "output_throughput",
           "request_throughput", "median_tpot_ms", "median_e2el_ms")  # fmt: skip


def bench_argv(url: str, a: argparse.Namespace, out: Path) -> list[str]:
    mixed = [x for k, v in MIXED.items() for x in (f"--{k}", str(v))]
    return ["--base-url", url, "--profile", "mixed", "--seed", str(a.seed),
            "--tokenizer", "bundled", "--num-requests", str(a.num_requests),
            "--max-concurrency", str(a.max_concurrency), "--scrape-metrics", "--quiet",
            "--out", str(out), *mixed]  # fmt: skip


def run_setting(name: str, flags: list[str], a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    started = time.perf_counter()
    server = launch_server(*flags)
    try:
        url = server.wait_healthy(timeout_s=300)
        print(f"[{name}] server up in {time.perf_counter() - started:.0f} s", flush=True)
        out = tmp / name
        assert bench_cli.main(bench_argv(url, a, out)) == 0
    finally:
        code = server.stop()
    result = json.loads((out / "result.json").read_text())
    srv = result.get("server_metrics", {})
    row = {k: result[k] for k in FIGURES}
    row["server_cache_hit_rate"] = srv.get("server_cache_hit_rate")
    row["server_deltas"] = srv.get("deltas")
    row["per_class"] = {
        cls: {
            k: v[k]
            for k in (
                "completed",
                "cache_hit_rate",
                "ideal_cache_hit_rate",
                "mean_ttft_ms",
                "p99_ttft_ms",
            )
        }  # fmt: skip
        for cls, v in result["per_class"].items()
    }
    row["server_flags"] = flags
    row["server_exit_code"] = code
    print(f"[{name}] hit {row['cache_hit_rate']:.1%} of ideal {row['ideal_cache_hit_rate']:.1%}, "
          f"TTFT P50 {row['median_ttft_ms']:.0f} ms P99 {row['p99_ttft_ms']:.0f} ms, "
          f"in {row['input_throughput']:.1f} tok/s, out {row['output_throughput']:.2f} tok/s",
          flush=True)  # fmt: skip
    return row


def _ratio(on: float | None, off: float | None) -> float | None:
    return on / off if on is not None and off else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--max-concurrency", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    started = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]  # the CPU may be shared: say how busy
    with tempfile.TemporaryDirectory(prefix="prefix_cache_effect_") as tmp:
        on = run_setting("cache_on", [], a, Path(tmp))
        off = run_setting("cache_off", ["--disable-prefix-cache"], a, Path(tmp))
    ratios = {
        "ttft_p50": _ratio(on["median_ttft_ms"], off["median_ttft_ms"]),
        "ttft_p99": _ratio(on["p99_ttft_ms"], off["p99_ttft_ms"]),
        "input_throughput": _ratio(on["input_throughput"], off["input_throughput"]),
        "output_throughput": _ratio(on["output_throughput"], off["output_throughput"]),
        "request_throughput": _ratio(on["request_throughput"], off["request_throughput"]),
    }
    payload = {
        "description": "mixed profile (scaled-down lengths), bundled SmolLM2-135M, prefix cache "
        "on vs off (--disable-prefix-cache), same seed; ratios are on/off",
        "workload": {
            "profile": "mixed",
            "seed": a.seed,
            "num_requests": a.num_requests,
            "max_concurrency": a.max_concurrency,
            "system_share": 0.7,
            "lengths": MIXED,
            "cache": "cold (no warmup)",
        },  # fmt: skip
        "cache_on": on,
        "cache_off": off,
        "ratios_on_over_off": ratios,
        "wall_s": round(time.perf_counter() - started, 1),
        "loadavg_start_end": [load_start, [round(x, 2) for x in os.getloadavg()]],
    }
    path = write_result("prefix_cache_effect", payload)
    print(json.dumps(ratios, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
