"""The printed result block, in vLLM's layout (50-wide titles, 40/10 columns) with SGLang's
P90/P95 rows and our cache, goodput, failure and revenue sections."""

from __future__ import annotations

LATENCIES = (
    ("ttft", "Time to First Token", "TTFT"),
    ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
    ("itl", "Inter-token Latency", "ITL"),
    ("e2el", "End-to-end Latency", "E2EL"),
)


def _title(text: str, fill: str = "-") -> str:
    return "{s:{c}^{n}}".format(s=text, n=50, c=fill)


def _row(label: str, value: object) -> str:
    if isinstance(value, float):
        return f"{label:<40} {value:<10.2f}"
    return f"{label:<40} {value!s:<10}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _cache_rows(r: dict) -> list[str]:
    rows = [
        _title("Prefix Cache"),
        _row("Cache hit rate (server usage):", _pct(r.get("cache_hit_rate"))),
        _row("Ideal cache hit rate (workload):", _pct(r.get("ideal_cache_hit_rate"))),
    ]
    server = r.get("server_metrics") or {}
    if server.get("available"):
        rows.append(
            _row("Cache hit rate (server /metrics):", _pct(server.get("server_cache_hit_rate")))
        )
        for name, value in sorted(server.get("peak_gauges", {}).items()):
            rows.append(_row(f"Peak {name}:", value))
        for name, value in sorted(server.get("mean_gauges", {}).items()):
            if "usage" in name:  # the KV occupancy over the run
                rows.append(_row(f"Mean {name}:", f"{value:.3f}"))
    for cls, c in r.get("per_class", {}).items():
        label = f"  {cls}: {c['completed']} req ({_pct(c['share'])}), hit/ideal:"
        rows.append(_row(label, f"{_pct(c['cache_hit_rate'])}/{_pct(c['ideal_cache_hit_rate'])}"))
    return rows


def _optional_rows(r: dict) -> list[str]:
    rows: list[str] = []
    if r.get("failed"):
        rows.append(_title("Failures"))
        rows += [_row(f"Failed ({kind}):", n) for kind, n in r["failures_by_kind"].items()]
    if "goodput" in r:
        g = r["goodput"]
        slos = ", ".join(f"{k}<={v * 1000:g}ms" for k, v in g["slos_s"].items())
        rows += [_title("Goodput"), _row("SLOs:", slos),
                 _row("Request goodput (req/s):", g["request_goodput"]),
                 _row("Token goodput (tok/s):", g["token_goodput"]),
                 _row("SLO attainment:", _pct(g["slo_attainment"]))]  # fmt: skip
    if "revenue" in r:
        v = r["revenue"]
        rows += [_title("Revenue (list price per 1M tokens)"),
                 _row("Revenue per second:", f"{v['revenue_per_s']:.6f}"),
                 _row("Revenue per hour:", v["revenue_per_hour"]),
                 _row("Revenue per day (24h at this rate):", v["revenue_per_day"])]  # fmt: skip
    return rows


def render(r: dict) -> str:
    meta = r.get("meta", {})
    rows = [_title(" Serving Benchmark Result ", "="),
            _row("Profile:", meta.get("profile", "?")),
            _row("Token counts from:", meta.get("token_source", "?")),
            _row("Successful requests:", r["completed"]),
            _row("Failed requests:", r["failed"]),
            _row("Warmup requests (excluded):", r["warmup_requests"]),
            _row("Benchmark duration (s):", r["duration"]),
            _row("Total input tokens:", r["total_input_tokens"]),
            _row("Total generated tokens:", r["total_output_tokens"]),
            _row("Request throughput (req/s):", r["request_throughput"]),
            _row("Input token throughput (tok/s):", r["input_throughput"]),
            _row("Output token throughput (tok/s):", r["output_throughput"]),
            _row("Peak output token throughput (tok/s):", r["max_output_tokens_per_s"]),
            _row("Total Token throughput (tok/s):", r["total_token_throughput"]),
            _row("Mean concurrency (Little's law):", r["mean_concurrency"]),
            _row("Peak concurrent requests:", r["max_concurrent_requests"])]  # fmt: skip
    for key, title, short in LATENCIES:
        rows.append(_title(title))
        for stat in ("mean", "median", "p90", "p95", "p99") + (("max",) if key == "itl" else ()):
            label = stat.capitalize() if stat in ("mean", "median", "max") else stat.upper()
            rows.append(_row(f"{label} {short} (ms):", r[f"{stat}_{key}_ms"]))
    rows += _cache_rows(r) + _optional_rows(r)
    rows.append("=" * 50)
    return "\n".join(rows)
