"""`kvserve bench [sweep|report] ...`: argparse front end (flags follow vLLM's bench_serving)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from kvserve.bench import outputs, profiles, sweep, tokens
from kvserve.bench.arrivals import ARRIVALS
from kvserve.bench.client import Target
from kvserve.bench.profiles.mixed import MixedLengths
from kvserve.bench.revenue import parse_price
from kvserve.bench.runner import LoadConfig, run
from kvserve.bench.slo import parse_slos
from kvserve.bench.units import parse_duration, parse_int_list
from kvserve.errors import ConfigError

MIXED_FLAGS = ("chat_turns", "chat_user_len", "chat_output_len", "qa_len", "qa_output_len",
               "doc_len", "doc_question_len", "doc_output_len")  # fmt: skip


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # a one-line ConfigError, not argparse's exit
        raise ConfigError(message)


def _add_workload(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--profile", default="random", choices=profiles.PROFILES)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--tokenizer", help="model dir or .gguf of the target ('bundled': ours)")
    g.add_argument("--input-len", type=int)
    g.add_argument("--output-len", type=int)
    g.add_argument("--range-ratio", type=float, default=0.0)
    g.add_argument("--system-share", type=float, default=0.7)
    for name in MIXED_FLAGS:
        g.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(MixedLengths, name))
    g.add_argument("--groups", type=int, default=8, help="shared-prefix: groups")
    g.add_argument("--prefix-len", type=int, default=512, help="shared-prefix: prefix tokens")
    g.add_argument("--questions", type=int, default=8, help="shared-prefix: questions per group")
    g.add_argument("--question-len", type=int, default=64)
    g.add_argument("--trace", help="Mooncake-format JSONL trace")
    g.add_argument("--time-scale", type=float, default=1.0)
    g.add_argument("--dataset", help="ShareGPT-format JSON file")


def _add_target(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("target and load")
    g.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    g.add_argument("--model", default="default", help="model name (default: the server's first)")
    g.add_argument("--endpoint", default="auto", choices=("auto", "chat", "completions"))
    g.add_argument("--api-key")
    g.add_argument("--no-ignore-eos", action="store_true", help="let outputs stop at EOS")
    g.add_argument("--request-timeout", default="3600s")
    g.add_argument("--max-concurrency", type=int)
    g.add_argument("--request-rate", type=float, default=math.inf)
    g.add_argument("--arrival", default="poisson", choices=ARRIVALS)
    g.add_argument("--burstiness", type=float, default=1.0)
    g.add_argument("--num-requests", type=int)
    g.add_argument("--duration")
    g.add_argument("--warmup", type=int, default=0)
    g.add_argument("--turn-delay", default=None, help="pause before each chat turn (e.g. 1s)")
    g.add_argument("--slo", action="append", default=[], help="ttft=2s, tpot=100ms, e2e=10s")
    g.add_argument("--price", action="append", default=[], help="input=4,cached=1,output=16")
    g.add_argument("--scrape-metrics", action="store_true")
    g.add_argument("--monitor-samples", help="JSONL of `kvserve monitor` samples to embed")
    g.add_argument("--out", default=None, help="directory for result.json, plots, report")
    g.add_argument("--quiet", action="store_true")


def _parser(mode: str) -> argparse.ArgumentParser:
    prog = "kvserve bench" + ("" if mode == "run" else f" {mode}")
    p = _Parser(prog=prog, description="Load-test an OpenAI-compatible server (WORKLOADS.md).")
    if mode == "report":
        p.add_argument("run_dir", help="a run (or sweep) directory written by kvserve bench")
        return p
    _add_workload(p)
    _add_target(p)
    if mode == "sweep":
        p.add_argument("--concurrency", default="32,64,128,256,512")
        p.add_argument("--knee-threshold", type=float, default=0.1)
    return p


def _workload(a: argparse.Namespace) -> profiles.WorkloadConfig:
    if a.trace and a.profile != "trace":
        raise ConfigError("--trace is only for --profile trace")
    if a.dataset and a.profile != "dataset":
        raise ConfigError("--dataset is only for --profile dataset")
    mixed = MixedLengths(**{name: getattr(a, name) for name in MIXED_FLAGS})
    return profiles.WorkloadConfig(
        a.profile, a.seed, a.input_len, a.output_len, a.range_ratio, a.system_share, mixed,
        a.groups, a.prefix_len, a.questions, a.question_len, a.trace, a.time_scale, a.dataset,
    )  # fmt: skip


def _load(a: argparse.Namespace, sweep_mode: bool) -> LoadConfig:
    if a.num_requests is not None and a.duration is not None:
        raise ConfigError("give either --num-requests or --duration, not both")
    if sweep_mode and not math.isinf(a.request_rate):
        raise ConfigError("sweep steps concurrency; --request-rate does not apply")
    if a.profile == "trace" and not math.isinf(a.request_rate):
        raise ConfigError("--profile trace replays the trace's timestamps; drop --request-rate")
    duration = parse_duration(a.duration or ("60s" if sweep_mode else "0.001s"), "--duration")
    return LoadConfig(
        a.max_concurrency, a.request_rate, a.arrival, a.burstiness,
        None if (a.duration or sweep_mode) else (a.num_requests or 100),
        duration if (a.duration or sweep_mode) else None, a.warmup,
        parse_duration(a.turn_delay, "--turn-delay") if a.turn_delay else 0.0, a.seed,
        a.scrape_metrics, a.quiet,
    )  # fmt: skip


def _target(a: argparse.Namespace) -> Target:
    if not a.base_url.startswith(("http://", "https://")):
        raise ConfigError(f"--base-url must start with http:// or https://, got {a.base_url!r}")
    endpoint = a.endpoint
    if endpoint == "auto":
        endpoint = "chat" if a.profile in ("mixed", "dataset") else "completions"
    return Target(a.base_url.rstrip("/"), a.model, endpoint, a.api_key, not a.no_ignore_eos,
                  parse_duration(a.request_timeout, "--request-timeout"))  # fmt: skip


def _meta(a: argparse.Namespace, tok: tokens.Tokenizer, target: Target, load: LoadConfig) -> dict:
    return {
        "profile": a.profile, "seed": a.seed, "base_url": target.base_url,
        "endpoint": target.endpoint, "max_concurrency": load.max_concurrency,
        "request_rate": None if math.isinf(load.request_rate) else load.request_rate,
        "arrival": load.arrival, "warmup": load.warmup,
        "cache_warm": f"{load.warmup} warmup requests" if load.warmup else "cold (no warmup)",
        "token_source": f"server usage, else {tok.name}",
        "slos_s": parse_slos(a.slo), "prices": parse_price(a.price),
        "monitor_samples": a.monitor_samples,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }  # fmt: skip


def main(argv: list[str]) -> int:
    mode = argv[0] if argv and argv[0] in ("sweep", "report") else "run"
    a = _parser(mode).parse_args(argv[1:] if mode != "run" else argv)
    if mode == "report":
        path = Path(a.run_dir)
        if (path / "sweep.json").is_file():
            import json

            data = json.loads((path / "sweep.json").read_text())
            print(sweep.write_sweep(path, sweep.summarize(data["levels"], data["knee_threshold"]),
                                    data.get("meta", {})))  # fmt: skip
        else:
            print(outputs.rerender(path))
        return 0
    workload, load, target = _workload(a), _load(a, mode == "sweep"), _target(a)
    tok = tokens.load(a.tokenizer)
    if not tok.exact and not a.quiet:
        print("kvserve bench: no --tokenizer: prompt lengths are approximate; token counts come "
              "from the server's usage", file=sys.stderr)  # fmt: skip
    meta = _meta(a, tok, target, load)
    out = Path(a.out) if a.out else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    if mode == "sweep":
        levels = parse_int_list(a.concurrency, "--concurrency")
        print(sweep.run_sweep(lambda: profiles.make_units(workload, tok), target, tok, load,
                              levels, meta, out, a.knee_threshold))  # fmt: skip
    else:
        open_loop = a.profile == "trace" or not math.isinf(load.request_rate)
        outcome = run(profiles.make_units(workload, tok), target, tok, load, open_loop)
        meta["model"] = outcome.model
        print(outputs.write_run(out, outcome.records, meta, outcome.server))
    print(f"results in {out}/", file=sys.stderr)
    return 0
