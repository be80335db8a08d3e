"""Retries (off unless --retry-max-retries > 0): only before any byte reached the client, on a
connection failure, a timeout before the response started, or HTTP 429/502/503/504."""

from __future__ import annotations

import random

from kvserve.router.config import RetryConfig

RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})


_RNG = random.Random()


def backoff_s(config: RetryConfig, attempt: int, rng: random.Random = _RNG) -> float:
    """Exponential: initial x multiplier^attempt, capped, then +-jitter (a fraction)."""
    base = min(config.initial_backoff_s * config.multiplier**attempt, config.max_backoff_s)
    return max(0.0, base * (1.0 + config.jitter * rng.uniform(-1.0, 1.0)))
