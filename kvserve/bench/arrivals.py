"""Open-loop arrival processes: gaps between request starts (WORKLOADS.md: Poisson, gamma with
burstiness, constant)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

from kvserve.errors import ConfigError

ARRIVALS = ("poisson", "gamma", "constant")


def gaps(rng: random.Random, rate: float, kind: str = "poisson", burstiness: float = 1.0
         ) -> Iterator[float]:  # fmt: skip
    """Seconds between consecutive arrivals at ``rate`` requests/s (``inf``: all at once).
    Gamma with shape ``burstiness`` keeps the mean rate; < 1 is burstier, > 1 more regular."""
    if kind not in ARRIVALS:
        raise ConfigError(f"--arrival: unknown {kind!r} (one of {', '.join(ARRIVALS)})")
    if rate <= 0 or burstiness <= 0:
        raise ConfigError("--request-rate and --burstiness must be positive")
    while True:
        if math.isinf(rate):
            yield 0.0
        elif kind == "constant":
            yield 1.0 / rate
        elif kind == "gamma":
            yield rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        else:
            yield rng.expovariate(rate)
