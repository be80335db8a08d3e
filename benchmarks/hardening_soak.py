"""The long version of the server's hardening suite (not in CI): a schema-driven fuzz of every
endpoint, a 10x overload, /health latency while a maximal prompt is prepared, and a soak with
cancellations. Reports 5xx count, lost requests (no complete answer and no clean error),
leaked KV pages, the admission ledger, and API/engine memory at the start and end. Writes
benchmarks/results/hardening_soak_<date>.json.

    .venv/bin/python -m benchmarks.hardening_soak                       # 10,000 cases, 1 h soak
    .venv/bin/python -m benchmarks.hardening_soak --fuzz-cases 10000 --soak-seconds 240

The fuzz strategies come from tests/server/schema_fuzz.py (run from the repo root).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil
from hypothesis import HealthCheck, given, seed, settings
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import write_result
from kvserve.server.launch import ServerProcess, start_server
from tests.server.schema_fuzz import SchemaStrategies, check_response, encode, endpoints

RUNNING, QUEUED = 8, 8  # the server's --max-running-requests / --max-queued-requests


def scrape(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def memory_mb(server: ServerProcess) -> dict[str, float]:
    api = psutil.Process(server.proc.pid)
    engine = psutil.Process(server.engine_pid())
    return {"api_rss_mb": api.memory_info().rss / 2**20,
            "engine_rss_mb": engine.memory_info().rss / 2**20}  # fmt: skip


def settle(url: str, timeout_s: float = 120) -> dict[str, Any]:
    """Wait until idle; the leaked pages and the admission ledger then."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = scrape(url)
        busy = m["kvserve:num_requests_running"] + m["kvserve:num_requests_waiting"]
        quiet = m["kvserve:num_messages_in_transit"] == 0
        idle = busy == 0 and quiet and m["kvserve:num_requests_admitted"] == 0
        if (idle and m["kvserve:kv_cache_usage_perc"] == 0) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return {"kv_cache_usage_after": m["kvserve:kv_cache_usage_perc"],
            "admitted_after": m["kvserve:num_requests_admitted"],
            "running_after": m["kvserve:num_requests_running"],
            "waiting_after": m["kvserve:num_requests_waiting"],
            "healthy_after": httpx.get(url + "/health", timeout=10).status_code == 200}  # fmt: skip


# -- fuzz ------------------------------------------------------------------------------------
def fuzz_bodies(schema: dict, cases: int, rng_seed: int) -> list[tuple[str, str, Any]]:
    strategies, out = SchemaStrategies(schema), []
    with_body = [e for e in endpoints(schema) if e.body_schema]
    for ep in with_body:
        _collect(strategies, ep, cases // len(with_body), rng_seed, out)
    return out


def _collect(strategies: SchemaStrategies, ep: Any, n: int, rng_seed: int, out: list) -> None:
    @seed(rng_seed)
    @settings(max_examples=n, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(body=strategies.body(ep.body_schema))
    def collect(body: Any) -> None:
        out.append((ep.method, ep.path, body))

    collect()


async def _send_one(http: httpx.AsyncClient, method: str, path: str, body: Any) -> str:
    headers = {"content-type": "application/json"}
    try:
        async with http.stream(method, path, content=encode(body), headers=headers) as resp:
            lines = [line async for line in resp.aiter_lines()]
    except httpx.TransportError as exc:
        return f"transport:{type(exc).__name__}"
    if resp.status_code >= 500:
        return "5xx"
    stream = isinstance(body, dict) and body.get("stream") is True and resp.status_code == 200
    try:
        body_bytes = "\n".join(lines).encode()
        fake = httpx.Response(resp.status_code, content=body_bytes, request=resp.request)
        check_response(fake, [x for x in lines if x.startswith("data: ")] if stream else None)
    except (AssertionError, ValueError, KeyError):
        return "bad_shape"
    if stream and (not lines or "data: [DONE]" not in lines):
        return "stream_cut"
    return str(resp.status_code)


async def run_fuzz(url: str, bodies: list, concurrency: int) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    queue = list(bodies)

    async def worker(http: httpx.AsyncClient) -> None:
        while queue:
            method, path, body = queue.pop()
            outcomes[await _send_one(http, method, path, body)] += 1

    start = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    bad = sum(v for k, v in outcomes.items() if not k.isdigit() or k.startswith("5"))
    return {"cases": len(bodies), "seconds": time.monotonic() - start,
            "outcomes": dict(outcomes), "5xx": outcomes["5xx"], "failures": bad}  # fmt: skip


# -- overload and soak ----------------------------------------------------------------------
MAX_TOKENS = [48]  # --max-tokens: the longest generation a load request asks for


async def _generate(http: httpx.AsyncClient, rng: random.Random, cancel_p: float) -> str:
    """One request; 'ok', a clean error status, 'cancelled', or a failure kind."""
    chat = rng.random() < 0.5
    body: dict[str, Any] = {"max_tokens": rng.randint(1, MAX_TOKENS[0]),
                            "stream": rng.random() < 0.6,
                            "temperature": rng.choice([0, 0.8])}  # fmt: skip
    if chat:
        body["messages"] = [{"role": "user", "content": f"Tell me about topic {rng.random()}"}]
    else:
        body["prompt"] = f"Story number {rng.randint(0, 10**6)}:"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    cancel_after = rng.randint(1, 10) if rng.random() < cancel_p else None
    try:
        async with http.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return "5xx" if resp.status_code >= 500 else str(resp.status_code)
            n, done = 0, False
            async for line in resp.aiter_lines():
                n += 1
                if cancel_after is not None and n >= cancel_after:
                    return "cancelled"
                if '"error"' in line[:20] and '"code": 5' in line:
                    return "5xx_in_stream"
                done = done or line == "data: [DONE]" or line.startswith('{"id"')
            return "ok" if done else "lost"
    except httpx.TransportError as exc:
        return f"lost:{type(exc).__name__}"


async def run_load(url: str, concurrency: int, seconds: float, per_worker: int | None,
                   cancel_p: float, seed: int) -> dict[str, Any]:  # fmt: skip
    outcomes: Counter[str] = Counter()
    deadline = time.monotonic() + seconds

    async def worker(i: int, http: httpx.AsyncClient) -> None:
        rng, done = random.Random(seed * 1000 + i), 0
        while time.monotonic() < deadline and (per_worker is None or done < per_worker):
            outcomes[await _generate(http, rng, cancel_p)] += 1
            done += 1

    limits = httpx.Limits(max_connections=concurrency + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        await asyncio.gather(*(worker(i, http) for i in range(concurrency)))
    lost = sum(v for k, v in outcomes.items() if k.startswith("lost"))
    fivexx = sum(v for k, v in outcomes.items() if k.startswith("5"))
    return {"outcomes": dict(outcomes), "lost": lost, "5xx": fivexx}


async def health_during_big_prompt(url: str, prompt_bytes: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        big = asyncio.ensure_future(
            http.post(
                "/v1/completions", json={"prompt": "word " * (prompt_bytes // 5), "max_tokens": 1}
            )  # fmt: skip
        )
        latencies = []
        while not big.done():
            t = time.perf_counter()
            await http.get("/health")
            latencies.append(time.perf_counter() - t)
            await asyncio.sleep(0.02)
        status = (await big).status_code
    latencies.sort()
    return {"prompt_bytes": prompt_bytes, "big_request_status": status, "probes": len(latencies),
            "health_max_ms": 1e3 * latencies[-1] if latencies else None,
            "health_p99_ms": 1e3 * latencies[int(0.99 * (len(latencies) - 1))]
            if latencies else None}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hardening_soak", description=__doc__)
    p.add_argument("--fuzz-cases", type=int, default=10_000)
    p.add_argument("--fuzz-concurrency", type=int, default=8)
    p.add_argument("--overload-factor", type=int, default=10)
    p.add_argument("--soak-seconds", type=float, default=3600)
    p.add_argument("--soak-concurrency", type=int, default=12)
    p.add_argument("--cancel-probability", type=float, default=0.3)
    p.add_argument("--big-prompt-bytes", type=int, default=8 << 20)
    p.add_argument("--max-tokens", type=int, default=48, help="longest load request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=None)
    a = p.parse_args(argv)
    MAX_TOKENS[0] = a.max_tokens
    server = start_server("--max-running-requests", str(RUNNING),
                          "--max-queued-requests", str(QUEUED))  # fmt: skip
    url, result = server.url, {"parameters": vars(a), "finished": False}

    def save() -> Path:  # after every phase: a run stopped part-way keeps what it measured
        return write_result("hardening_soak", result, a.out_dir)

    try:
        result["memory_start"] = memory_mb(server)
        schema = httpx.get(url + "/openapi.json", timeout=30).json()
        bodies = fuzz_bodies(schema, a.fuzz_cases, a.seed)
        result["fuzz"] = asyncio.run(run_fuzz(url, bodies, a.fuzz_concurrency))
        result["fuzz"]["settled"] = settle(url)
        save()
        result["health_during_big_prompt"] = asyncio.run(
            health_during_big_prompt(url, a.big_prompt_bytes)
        )
        n = a.overload_factor * (RUNNING + QUEUED)
        result["overload"] = {
            "concurrent": n,
            **asyncio.run(run_load(url, n, 3600, 1, 0.0, a.seed)),
        }
        result["overload"]["settled"] = settle(url)
        result["memory_before_soak"] = memory_mb(server)
        save()
        soak = asyncio.run(run_load(url, a.soak_concurrency, a.soak_seconds, None,
                                    a.cancel_probability, a.seed))  # fmt: skip
        result["soak"] = {"seconds": a.soak_seconds, **soak, "settled": settle(url)}
        result["memory_end"] = memory_mb(server)
        result["finished"] = True
    finally:
        result["server_exit_code"] = server.stop()
        path = save()
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
