"""Every figure of WORKLOADS.md, computed from per-request records only (so reports recompute)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from kvserve.bench.percentiles import summarize
from kvserve.bench.records import RequestRecord
from kvserve.bench.revenue import revenue
from kvserve.bench.slo import goodput, tpot


def ttfts(records: list[RequestRecord]) -> list[float]:
    return [r.ttft for r in records if r.ttft is not None]


def tpots(records: list[RequestRecord]) -> list[float]:
    return [t for t in map(tpot, records) if t is not None]


def itls(records: list[RequestRecord]) -> list[float]:
    """Every gap between consecutive content chunks, pooled over requests."""
    gaps: list[float] = []
    for r in records:
        gaps.extend(b - a for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False))
    return gaps


def e2es(records: list[RequestRecord]) -> list[float]:
    return [r.e2e for r in records]


def duration(records: list[RequestRecord]) -> float:
    if not records:
        return 0.0
    return max(r.end for r in records) - min(r.start for r in records)


def peak_output_rate(records: list[RequestRecord]) -> float:
    """Max output tokens in any 1-second bucket (from the first start) of chunk arrivals; a chunk
    carrying several tokens (speculative decoding) weighs completion_tokens / chunks."""
    if not records:
        return 0.0
    t0 = min(r.start for r in records)
    buckets: dict[int, float] = defaultdict(float)
    for r in records:
        if not r.chunk_times:
            continue
        weight = (r.completion_tokens or len(r.chunk_times)) / len(r.chunk_times)
        for t in r.chunk_times:
            buckets[math.floor(t - t0)] += weight
    return max(buckets.values(), default=0.0)


def peak_concurrency(records: list[RequestRecord]) -> int:
    """Max requests in flight; an end at the same instant as a start is counted first."""
    events = sorted([(r.start, 1) for r in records] + [(r.end, -1) for r in records])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def cache_stats(records: list[RequestRecord]) -> dict:
    """Measured hit rate (server usage) beside the workload's ideal one (client token ids)."""
    reported = [r for r in records if r.cached_tokens is not None and r.prompt_tokens]
    ideal = [r for r in records if r.ideal_cached_tokens is not None and r.prompt_tokens]
    prompt_rep = sum(r.prompt_tokens or 0 for r in reported)
    prompt_ideal = sum(r.prompt_tokens or 0 for r in ideal)
    return {
        "cached_tokens": sum(r.cached_tokens or 0 for r in reported),
        "cache_hit_rate": (
            sum(r.cached_tokens or 0 for r in reported) / prompt_rep if prompt_rep else None
        ),
        "ideal_cache_hit_rate": (
            min(1.0, sum(r.ideal_cached_tokens or 0 for r in ideal) / prompt_ideal)
            if prompt_ideal
            else None
        ),
    }


def _latency_keys(ok: list[RequestRecord]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, values in (("ttft", ttfts(ok)), ("tpot", tpots(ok)), ("itl", itls(ok)),
                         ("e2el", e2es(ok))):  # fmt: skip
        for stat, value in summarize(values, scale=1000.0).items():
            out[f"{stat}_{name}_ms"] = value
    return out


def _class_breakdown(ok: list[RequestRecord], span: float) -> dict[str, dict]:
    by_cls: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in ok:
        by_cls[r.cls].append(r)
    if len(by_cls) < 2:
        return {}
    total = len(ok)
    out = {}
    for cls, recs in sorted(by_cls.items()):
        ttft = summarize(ttfts(recs), 1000.0)
        e2e = summarize(e2es(recs), 1000.0)
        out[cls] = {
            "completed": len(recs),
            "share": len(recs) / total,
            "input_tokens": sum(r.prompt_tokens or 0 for r in recs),
            "output_tokens": sum(r.completion_tokens or 0 for r in recs),
            "request_throughput": len(recs) / span if span > 0 else 0.0,
            "mean_ttft_ms": ttft["mean"],
            "p99_ttft_ms": ttft["p99"],
            "mean_tpot_ms": summarize(tpots(recs), 1000.0)["mean"],
            "p99_e2el_ms": e2e["p99"],
            **cache_stats(recs),
        }
    return out


def compute(
    records: list[RequestRecord],
    slos: dict[str, float] | None = None,
    prices: dict[str, float] | None = None,
) -> dict:
    """The result dictionary: vLLM's key names where they exist, plus ours."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    span = duration(measured)
    n_in = sum(r.prompt_tokens or 0 for r in ok)
    n_out = sum(r.completion_tokens or 0 for r in ok)
    failures = Counter(r.error_kind or "error" for r in measured if not r.ok)
    cache = cache_stats(ok)
    result: dict = {
        "duration": span,
        "completed": len(ok),
        "failed": len(measured) - len(ok),
        "failure_rate": (len(measured) - len(ok)) / len(measured) if measured else 0.0,
        "failures_by_kind": dict(sorted(failures.items())),
        "warmup_requests": len(records) - len(measured),
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "request_throughput": len(ok) / span if span > 0 else 0.0,
        "input_throughput": n_in / span if span > 0 else 0.0,
        "output_throughput": n_out / span if span > 0 else 0.0,
        "total_token_throughput": (n_in + n_out) / span if span > 0 else 0.0,
        "max_output_tokens_per_s": peak_output_rate(ok),
        "mean_concurrency": sum(e2es(measured)) / span if span > 0 else 0.0,
        "max_concurrent_requests": peak_concurrency(measured),
        "token_sources": dict(Counter(r.token_source for r in ok)),
        **_latency_keys(ok),
        **cache,
        "per_class": _class_breakdown(ok, span),
    }
    if slos:
        result["goodput"] = goodput(measured, slos, span)
    if prices:
        result["revenue"] = revenue(prices, n_in, cache["cached_tokens"], n_out, span)
    return result
