"""PNG plots (matplotlib, Agg): latency CDFs, output tokens/s over time, sweep curves."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kvserve.bench import metrics  # noqa: E402
from kvserve.bench.records import RequestRecord  # noqa: E402


def latency_cdfs(records: list[RequestRecord], path: Path) -> Path:
    ok = [r for r in records if r.ok and not r.warmup]
    series = {"TTFT": metrics.ttfts(ok), "TPOT": metrics.tpots(ok), "ITL": metrics.itls(ok),
              "E2E": metrics.e2es(ok)}  # fmt: skip
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, (name, values) in zip(axes, series.items(), strict=True):
        ms = sorted(v * 1000 for v in values)
        if ms:
            ax.plot(ms, [(i + 1) / len(ms) for i in range(len(ms))])
        ax.set_title(f"{name} CDF")
        ax.set_xlabel("ms")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of requests")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def tokens_over_time(records: list[RequestRecord], path: Path) -> Path:
    measured = [r for r in records if r.ok and not r.warmup]
    t0 = min((r.start for r in measured), default=0.0)
    buckets: dict[int, float] = defaultdict(float)
    for r in measured:
        weight = (r.completion_tokens or len(r.chunk_times)) / max(len(r.chunk_times), 1)
        for t in r.chunk_times:
            buckets[math.floor(t - t0)] += weight
    xs = list(range(max(buckets, default=-1) + 1))
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(xs, [buckets.get(x, 0.0) for x in xs], drawstyle="steps-post")
    ax.set_xlabel("seconds since first request")
    ax.set_ylabel("output tok/s")
    ax.set_title("Output tokens per second")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def sweep_curves(levels: list[dict], knee: int | None, path: Path) -> Path:
    conc = [lv["concurrency"] for lv in levels]
    fig, ax1 = plt.subplots(figsize=(8, 4))
    ax1.plot(conc, [lv["output_throughput"] for lv in levels], "o-", label="output tok/s")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("concurrency")
    ax1.set_ylabel("output tok/s")
    ax2 = ax1.twinx()
    ax2.plot(conc, [lv["p99_ttft_ms"] for lv in levels], "s--", color="tab:red", label="P99 TTFT")
    ax2.set_ylabel("P99 TTFT (ms)")
    if knee is not None:
        ax1.axvline(knee, color="gray", linestyle=":", label=f"knee at {knee}")
    fig.legend(loc="upper left")
    ax1.set_title("Throughput and P99 TTFT against concurrency")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
