"""`--scrape-metrics`: the target's Prometheus /metrics before and after a run (and its queue
gauges every second during it), read for kvserve:, vllm: and sglang: metric names."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import defaultdict

import httpx

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([^\s]+)")
PREFIXES = ("kvserve:", "vllm:", "sglang:")
COUNTERS = ("prefix_cache_queries_total", "prefix_cache_hits_total", "prompt_tokens_total",
            "generation_tokens_total", "request_success_total")  # fmt: skip
# KV occupancy (0-1): kvserve's and vLLM's kv_cache_usage_perc, older vLLM's
# gpu_cache_usage_perc, SGLang's token_usage
GAUGES = ("num_requests_running", "num_requests_waiting", "num_queue_reqs", "num_running_reqs",
          "cache_hit_rate", "kv_cache_usage_perc", "gpu_cache_usage_perc",
          "token_usage")  # fmt: skip


def parse_metrics(text: str) -> dict[str, float]:
    """Metric name (prefix stripped: kvserve:/vllm:/sglang:) -> value summed over label sets."""
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            continue
        name = match.group(1)
        for prefix in PREFIXES:
            if name.startswith(prefix):
                with contextlib.suppress(ValueError):
                    out[name[len(prefix) :]] += float(match.group(3))
    return dict(out)


async def fetch(http: httpx.AsyncClient, base_url: str) -> dict[str, float] | None:
    try:
        resp = await http.get(base_url + "/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    return parse_metrics(resp.text) if resp.status_code == 200 else None


class Scraper:
    """Before/after snapshots plus the max and the mean of each gauge sampled during the run."""

    def __init__(self, http: httpx.AsyncClient, base_url: str) -> None:
        self.http, self.base_url = http, base_url
        self.before: dict[str, float] | None = None
        self.after: dict[str, float] | None = None
        self.peaks: dict[str, float] = {}
        self.sums: dict[str, float] = {}
        self.samples = 0

    async def sample_gauges(self, period_s: float = 1.0) -> None:
        while True:
            snap = await fetch(self.http, self.base_url)
            if snap is not None:
                self.samples += 1
                for name in GAUGES:
                    if name in snap:
                        self.peaks[name] = max(self.peaks.get(name, 0.0), snap[name])
                        self.sums[name] = self.sums.get(name, 0.0) + snap[name]
            await asyncio.sleep(period_s)

    def summary(self) -> dict:
        out = server_summary(self.before, self.after, self.peaks)
        if out["available"] and self.samples:
            out["mean_gauges"] = {n: v / self.samples for n, v in self.sums.items()}
        return out


def server_summary(before: dict | None, after: dict | None, peaks: dict[str, float]) -> dict:
    if before is None or after is None:
        return {"available": False, "note": "no Prometheus /metrics at the target"}
    deltas = {n: after[n] - before.get(n, 0.0) for n in COUNTERS if n in after}
    out: dict = {"available": True, "deltas": deltas, "peak_gauges": dict(peaks)}
    queries, hits = deltas.get("prefix_cache_queries_total"), deltas.get("prefix_cache_hits_total")
    if queries:
        out["server_cache_hit_rate"] = (hits or 0.0) / queries
    elif "cache_hit_rate" in after:  # SGLang exposes only a gauge
        out["server_cache_hit_rate"] = after["cache_hit_rate"]
    return out
