"""Service-level objectives (`--slo ttft=2s --slo tpot=100ms --slo e2e=10s`) and goodput."""

from __future__ import annotations

from kvserve.bench.records import RequestRecord
from kvserve.bench.units import parse_duration, parse_key_values
from kvserve.errors import ConfigError

SLO_KEYS = ("ttft", "tpot", "e2e")


def parse_slos(items: list[str]) -> dict[str, float]:
    """SLO limits in seconds by metric name."""
    raw = parse_key_values(items, "--slo")
    unknown = set(raw) - set(SLO_KEYS)
    if unknown:
        raise ConfigError(f"--slo: unknown metric {sorted(unknown)[0]!r} (use ttft, tpot, e2e)")
    return {key: parse_duration(value, f"--slo {key}") for key, value in raw.items()}


def tpot(rec: RequestRecord) -> float | None:
    """Time per output token excluding the first: (e2e - ttft) / (completion_tokens - 1)."""
    if rec.ttft is None or not rec.completion_tokens or rec.completion_tokens < 2:
        return None
    return (rec.e2e - rec.ttft) / (rec.completion_tokens - 1)


def meets(rec: RequestRecord, slos: dict[str, float]) -> bool:
    """A failed request never meets; a request with one output token has no TPOT to violate."""
    if not rec.ok:
        return False
    values = {"ttft": rec.ttft, "tpot": tpot(rec), "e2e": rec.e2e}
    for key, limit in slos.items():
        value = values[key]
        if value is None:
            if key == "tpot":
                continue
            return False
        if value > limit:
            return False
    return True


def goodput(records: list[RequestRecord], slos: dict[str, float], duration: float) -> dict:
    """Requests/s and output tokens/s of requests meeting every SLO; attainment over all requests
    (failed ones count as misses)."""
    good = [r for r in records if meets(r, slos)]
    tokens = sum(r.completion_tokens or 0 for r in good)
    return {
        "slos_s": dict(slos),
        "good_requests": len(good),
        "request_goodput": len(good) / duration if duration > 0 else 0.0,
        "token_goodput": tokens / duration if duration > 0 else 0.0,
        "slo_attainment": len(good) / len(records) if records else 0.0,
    }
