"""Bootstrap intervals of a mean (paired: pass per-item differences), stratified by group so
that an average over task types keeps each type's weight in every resample."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RESAMPLES = 2000


def interval(
    groups: Sequence[Sequence[float]],
    level: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile interval of the mean over groups of each group's mean; items are resampled
    with replacement within their group. One group: the plain bootstrap of a mean. For a paired
    comparison pass ``candidate_i - baseline_i``: both sides of an item move together."""
    arrays = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not arrays:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = np.zeros(resamples)
    for a in arrays:
        idx = rng.integers(0, len(a), size=(resamples, len(a)))
        means += a[idx].mean(axis=1)
    means /= len(arrays)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(means, [tail, 100.0 - tail])
    return (float(lo), float(hi))
