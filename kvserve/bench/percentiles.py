"""Summary statistics in vLLM's convention (numpy linear-interpolated percentiles)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PERCENTILES = (50, 90, 95, 99)


def summarize(values: Sequence[float], scale: float = 1.0) -> dict[str, float]:
    """mean, median, std, p90/p95/p99 and max of ``values`` times ``scale`` (0.0 when empty)."""
    if len(values) == 0:
        return {"mean": 0.0, "median": 0.0, "std": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0,
                "max": 0.0}  # fmt: skip
    arr = np.asarray(values, dtype=np.float64) * scale
    p50, p90, p95, p99 = np.percentile(arr, PERCENTILES)
    return {
        "mean": float(arr.mean()),
        "median": float(p50),
        "std": float(arr.std()),
        "p90": float(p90),
        "p95": float(p95),
        "p99": float(p99),
        "max": float(arr.max()),
    }
