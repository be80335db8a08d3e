"""Prefill/decode disaggregation against replicas, through `kvserve route`, with `kvserve bench`.

Setups (each behind the router, Llama-3-8B shape with dummy weights, the 3.1 config for its
128K rope so 32K prompts need no override):
  pd        1 prefill worker (GPU 0) + 1 decode worker (GPU 1), `route --pd-disaggregation`
  replicas  2 normal workers (GPU 0, GPU 1), `route --policy round_robin`
  single    1 normal worker (GPU 0)
Workload: `kvserve bench --profile random`, prompts of input_len x (1 +- range_ratio) tokens and
outputs of output_len x (1 +- range_ratio) (defaults: 8K-32K in, 256-1K out). Reported: TTFT and
TPOT percentiles, request and token throughput, failures, and for pd the KV transfer of each
request (bytes, seconds, GB/s) read from the decode worker's log, with the per-request time split
of both workers (split_median_s / split_max_s). The dummy model's vocabulary is cut to the
tokenizer's (the JSON's vocab_size; --keep-vocab keeps the config's: see model_dir).

    python -m benchmarks.pd_serving                       # 2 GPUs, the full run
    python -m benchmarks.pd_serving --smoke               # 1 GPU: every worker on GPU 0, small
Writes benchmarks/results/pd_serving_<date>.json (or under --out-dir).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import write_result
from kvserve.router.launch import start_router
from kvserve.server.launch import ServerProcess, free_port, launch_server

LLAMA_31_8B = "benchmarks/configs/llama-3.1-8b"
# the decode and prefill workers' per-request lines (kvserve/disagg/decode_side.py, bootstrap.py)
TRANSFER_LINE = re.compile(
    r"kv transfer \S+: (\d+) bytes in ([\d.]+) s"
    r"(?: \([^;]*; header ([\d.]+) s, wire ([\d.]+) s\))?"
)
IMPORT_LINE = re.compile(
    r"kv import \S+: \d+ bytes, waited ([\d.]+) s for the engine and "
    r"pages, import ([\d.]+) s"
)
SEND_LINE = re.compile(
    r"kv send \S+: \d+ bytes, capture ([\d.]+) s \(engine thread\), held "
    r"([\d.]+) s, copy wait ([\d.]+) s, wire ([\d.]+) s"
)
BENCH_KEYS = ("completed", "failed", "failures_by_kind", "total_input_tokens",
              "total_output_tokens", "request_throughput", "output_throughput",
              "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
              "mean_tpot_ms", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms",
              "mean_e2el_ms", "p99_e2el_ms")  # fmt: skip


def model_dir(config_dir: str, tokenizer_dir: str | None, keep_vocab: bool) -> tuple[str, dict]:
    """The config plus the bundled model's tokenizer, or the one saved in ``tokenizer_dir`` (a
    machine without the bundled model): a dummy-weight model the server can tokenize for.

    Its vocabulary is cut to the tokenizer's (unless ``keep_vocab``): dummy weights sample ids
    all over Llama's 128,256, the tokenizer decodes the 62% above its 49,152 to no text, and
    greedy streams of only such ids carry none (6 of 16 requests failed as no_output in the
    first two-GPU run). The cost: a 49,152-row LM head (0.2 of 8.0 B parameters, was 0.5)."""
    from kvserve.loader import load_tokenizer

    out = Path(tempfile.mkdtemp(prefix="pd-model-"))
    if tokenizer_dir is None:
        load_tokenizer(None).hf.save_pretrained(out)
    else:
        shutil.copytree(tokenizer_dir, out, dirs_exist_ok=True)
    config = json.loads((Path(config_dir) / "config.json").read_text())
    vocab = {"config": config["vocab_size"], "tokenizer": load_tokenizer(str(out)).vocab_size}
    if not keep_vocab and vocab["tokenizer"] < config["vocab_size"]:
        config["vocab_size"] = vocab["tokenizer"]
    vocab["model"] = config["vocab_size"]
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return str(out), vocab


class Workers:
    """The processes of one setup, stopped together."""

    def __init__(self, args: argparse.Namespace, model: str, logs: Path) -> None:
        self.args, self.model, self.logs = args, model, logs
        self.servers: list[ServerProcess] = []
        self.log_files: dict[str, Path] = {}

    def start(self, name: str, gpu: int, *flags: str) -> ServerProcess:
        a = self.args
        # Workers sharing a GPU (--smoke) get a fixed KV size: sized from free memory, the
        # second one would count the first one's pool as its own use.
        kv = ("--max-total-tokens", str(a.max_total_tokens)) if a.max_total_tokens else ()
        log = self.logs / f"{name}.log"
        self.log_files[name] = log
        env = {"CUDA_VISIBLE_DEVICES": str(gpu)}
        stream = log.open("w")
        server = launch_server("--model", self.model, "--load-format", "dummy",
                               "--context-length", str(a.context_length),
                               "--mem-fraction-static", str(a.mem_fraction), *kv, *flags, env=env,
                               log_level="info", stderr=stream)  # fmt: skip
        self.servers.append(server)
        return server

    def wait(self) -> None:
        for s in self.servers:
            s.wait_healthy(1800)

    def stop(self) -> None:
        for s in self.servers:
            s.stop(120)


def run_bench(url: str, args: argparse.Namespace, tokenizer: str, out: Path,
              range_ratio: float, *extra: str) -> dict[str, Any]:  # fmt: skip
    """`kvserve bench`'s random profile at ``args``' lengths and concurrency; its result.json."""
    cmd = [sys.executable, "-m", "kvserve.cli", "bench", "--base-url", url, "--profile",
           "random", "--input-len", str(args.input_len), "--output-len", str(args.output_len),
           "--range-ratio", str(range_ratio), "--num-requests", str(args.num_requests),
           "--max-concurrency", str(args.concurrency), "--endpoint", "completions",
           "--tokenizer", tokenizer, "--seed", "1", "--out", str(out), "--quiet",
           *extra]  # fmt: skip
    subprocess.run(cmd, check=True)
    return json.loads((out / "result.json").read_text())


def bench(url: str, args: argparse.Namespace, tokenizer: str, out: Path) -> dict[str, Any]:
    result = run_bench(url, args, tokenizer, out, args.range_ratio)
    return {k: result.get(k) for k in BENCH_KEYS}


def transfers(decode_log: Path, prefill_log: Path) -> dict[str, Any]:
    """Per-request KV transfer figures: the decode side's fetch (header wait, then the wire),
    its import on the engine thread, and the prefill side's capture, hold and send."""
    text = decode_log.read_text()
    fetched = TRANSFER_LINE.findall(text)
    rows = [(int(b), float(s)) for b, s, _, _ in fetched]
    if not rows:
        return {"count": 0}
    rates = sorted(b / s / 1e9 for b, s in rows if s > 0)
    secs = sorted(s for _, s in rows)
    out: dict[str, Any] = {
        "count": len(rows), "mean_bytes": statistics.mean(b for b, _ in rows),
        "median_seconds": statistics.median(secs), "max_seconds": secs[-1],
        "median_gb_per_s": statistics.median(rates), "min_gb_per_s": rates[0],
        "max_gb_per_s": rates[-1],
    }  # fmt: skip
    imported = IMPORT_LINE.findall(text)
    split = {
        "decode_header_s": [float(h) for _, _, h, _ in fetched if h],
        "decode_wire_s": [float(w) for _, _, _, w in fetched if w],
        "decode_wait_s": [float(w) for w, _ in imported],
        "decode_import_s": [float(i) for _, i in imported],
    }
    sent = SEND_LINE.findall(prefill_log.read_text())
    for i, key in enumerate(("prefill_capture_s", "prefill_held_s", "prefill_copy_wait_s",
                             "prefill_wire_s")):  # fmt: skip
        split[key] = [float(row[i]) for row in sent]
    out["split_median_s"] = {k: statistics.median(v) for k, v in split.items() if v}
    out["split_max_s"] = {k: max(v) for k, v in split.items() if v}
    return out


def run_setup(name: str, args: argparse.Namespace, model: str, work: Path) -> dict[str, Any]:
    w = Workers(args, model, work)
    second_gpu = 0 if args.smoke else 1
    try:
        if name == "pd":
            port = free_port()
            common = ("--disaggregation-transfer-backend", args.transfer_backend,
                      "--disaggregation-staging-gb", str(args.staging_gb))  # fmt: skip
            p = w.start("prefill", 0, "--disaggregation-mode", "prefill",
                        "--disaggregation-bootstrap-port", str(port), *common)  # fmt: skip
            d = w.start("decode", second_gpu, "--disaggregation-mode", "decode", *common)
            flags = ["--pd-disaggregation", "--prefill", p.url, "--decode", d.url]
        elif name == "replicas":
            a, b = w.start("replica0", 0), w.start("replica1", second_gpu)
            flags = ["--worker-urls", a.url, b.url, "--policy", "round_robin"]
        else:
            flags = ["--worker-urls", w.start("single", 0).url, "--policy", "round_robin"]
        w.wait()
        router = start_router(*flags, "--health-check-interval-secs", "2")
        try:
            router.wait_ready(300)
            started = time.perf_counter()
            result = bench(router.url, args, model, work / f"bench-{name}")
            result["wall_s"] = time.perf_counter() - started
        finally:
            router.stop()
        if name == "pd":
            result["kv_transfer"] = transfers(w.log_files["decode"], w.log_files["prefill"])
        return result
    finally:
        w.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pd_serving")
    ap.add_argument("--smoke", action="store_true", help="1 GPU, small sizes")
    ap.add_argument("--model-config", default=LLAMA_31_8B)
    ap.add_argument("--setups", default="pd,replicas,single")
    ap.add_argument("--input-len", type=int, default=20000)
    ap.add_argument("--output-len", type=int, default=640)
    ap.add_argument("--range-ratio", type=float, default=0.6)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--context-length", type=int, default=34816)
    ap.add_argument("--mem-fraction", type=float, default=0.85)
    ap.add_argument("--max-total-tokens", type=int, default=None, help="KV tokens per worker")
    ap.add_argument("--transfer-backend", default="auto")
    ap.add_argument("--staging-gb", type=float, default=16.0, help="per PD worker")
    ap.add_argument("--tokenizer-dir", help="saved tokenizer files (default: the bundled one's)")
    ap.add_argument("--keep-vocab", action="store_true",
                    help="keep the config's vocabulary even past the tokenizer's")  # fmt: skip
    ap.add_argument("--out-dir", default=None)
    argv = sys.argv[1:] if argv is None else argv
    if "--smoke" in argv:  # small sizes unless given
        ap.set_defaults(input_len=2048, output_len=64, num_requests=8, concurrency=4,
                        context_length=4096, max_total_tokens=131072)  # fmt: skip
    args = ap.parse_args(argv)
    model, vocab = model_dir(args.model_config, args.tokenizer_dir, args.keep_vocab)
    work = Path(tempfile.mkdtemp(prefix="pd-serving-"))
    results = {}
    for name in args.setups.split(","):
        print(f"== {name}", flush=True)
        try:
            results[name] = run_setup(name, args, model, work)
        except Exception as exc:  # keep the other setups' figures; the logs say more
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(results[name], indent=1), flush=True)
    payload = {"smoke": args.smoke, "model_config": args.model_config, "vocab_size": vocab,
               "workload": {k: getattr(args, k) for k in ("input_len", "output_len",
                            "range_ratio", "num_requests", "concurrency")},
               "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "all"), "setups": results,
               "logs": str(work)}  # fmt: skip
    path = write_result("pd_serving" + ("_smoke" if args.smoke else ""), payload, args.out_dir)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
