"""Output tokens/s through the HTTP server (32 concurrent) against the offline ``LLM`` on the
same prompts, in the same run; the ratio is the server's overhead (target >= 0.9).

Both sides: greedy, ``ignore_eos``, the same prompts and output length, one warm-up pass
first. The server side is a real ``kvserve serve`` subprocess driven by async httpx
(non-streaming by default; ``--stream`` for SSE). Writes
benchmarks/results/server_overhead_<date>.json.

    .venv/bin/python -m benchmarks.server_overhead [--num-prompts 64 --max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx

from benchmarks.common import greedy, release_memory, timed_after_warmup, write_result
from kvserve import LLM, SamplingParams
from kvserve.server.launch import launch_server

TOPICS = ["rivers", "bread", "trains", "owls", "glass", "maps", "tea", "bridges", "snow",
          "clocks", "bees", "ships", "paper", "salt", "moons", "violins"]  # fmt: skip


def prompts(n: int) -> list[str]:
    return [f"Question {i}: write a short story about {TOPICS[i % len(TOPICS)]}." for i in range(n)]


def offline(ps: list[str], max_tokens: int, settings: dict) -> float:
    llm = LLM(**settings)
    rate = _offline_rate(llm, ps, greedy(max_tokens))
    del llm
    release_memory()
    return rate


def _offline_rate(llm: LLM, ps: list[str], params: SamplingParams) -> float:
    outs = []
    seconds = timed_after_warmup(
        lambda: outs.extend(llm.generate(ps, params)), lambda: llm.generate(ps[:8], params)
    )
    return sum(len(o.token_ids) for o in outs) / seconds


async def _http_run(url: str, ps: list[str], max_tokens: int, conc: int, stream: bool) -> float:
    queue = list(ps)
    tokens = 0

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        while queue:
            body = {"prompt": queue.pop(), "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": stream,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            if not stream:
                resp = await http.post(url + "/v1/completions", json=body)
                tokens += resp.json()["usage"]["completion_tokens"]
                continue
            async with http.stream("POST", url + "/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith('data: {"') and '"usage": {' in line:
                        tokens += int(line.split('"completion_tokens": ')[1].split(",")[0])

    limits = httpx.Limits(max_connections=conc)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(conc)))
        return tokens / (time.perf_counter() - start)


def through_http(
    ps: list[str], max_tokens: int, conc: int, stream: bool, flags: list[str]
) -> float:
    server = launch_server(*flags)
    url = server.url
    try:
        server.wait_healthy(600)
        asyncio.run(_http_run(url, ps[:8], max_tokens, 8, stream))  # warm-up
        return asyncio.run(_http_run(url, ps, max_tokens, conc, stream))
    finally:
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--device", default="auto")
    a = p.parse_args()
    ps = prompts(a.num_prompts)
    # the offline side batches everything at once; cap it at the same concurrency
    settings = {"device": a.device, "max_running_requests": a.concurrency}
    flags = ["--device", a.device, "--max-running-requests", str(a.concurrency)]
    http_tps = through_http(ps, a.max_tokens, a.concurrency, a.stream, flags)
    offline_tps = offline(ps, a.max_tokens, settings)
    ratio = http_tps / offline_tps
    result = {
        "device": a.device,
        "num_prompts": a.num_prompts, "max_tokens": a.max_tokens, "concurrency": a.concurrency,
        "stream": a.stream, "offline_output_tok_s": round(offline_tps, 2),
        "http_output_tok_s": round(http_tps, 2), "ratio": round(ratio, 3), "target_ratio": 0.9,
        "meets_target": ratio >= 0.9,
    }  # fmt: skip
    path = write_result("server_overhead", result)
    print(
        f"offline {offline_tps:.1f} tok/s, HTTP {http_tps:.1f} tok/s, ratio {ratio:.3f} -> {path}"
    )


if __name__ == "__main__":
    main()
