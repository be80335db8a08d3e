"""Revenue at list price (`--price input=4,cached=1,output=16`, per million tokens)."""

from __future__ import annotations

from kvserve.bench.units import parse_key_values
from kvserve.errors import ConfigError

PRICE_KEYS = ("input", "cached", "output")


def parse_price(items: list[str]) -> dict[str, float]:
    raw = parse_key_values(items, "--price")
    unknown = set(raw) - set(PRICE_KEYS)
    if unknown:
        raise ConfigError(f"--price: unknown key {sorted(unknown)[0]!r} (input, cached, output)")
    try:
        prices = {key: float(value) for key, value in raw.items()}
    except ValueError:
        raise ConfigError(f"--price: prices must be numbers, got {items!r}") from None
    if any(p < 0 for p in prices.values()):
        raise ConfigError("--price: prices must not be negative")
    if prices and "input" not in prices:
        raise ConfigError("--price: give at least input=X (per million tokens)")
    return prices


def revenue(
    prices: dict[str, float], input_tokens: int, cached_tokens: int, output_tokens: int,
    duration: float,
) -> dict[str, float]:  # fmt: skip
    """Cached prompt tokens are billed at the cached price (the input price if none is given)."""
    cached_price = prices.get("cached", prices["input"])
    total = (
        (input_tokens - cached_tokens) * prices["input"]
        + cached_tokens * cached_price
        + output_tokens * prices.get("output", 0.0)
    ) / 1e6
    per_s = total / duration if duration > 0 else 0.0
    return {
        "prices_per_million": dict(prices),
        "revenue_total": total,
        "revenue_per_s": per_s,
        "revenue_per_hour": per_s * 3600,
        "revenue_per_day": per_s * 86400,
    }
