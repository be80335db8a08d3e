"""The verdict for one task type (or overall): is a candidate's drop real and large enough?"""

from __future__ import annotations

import math

REGRESSED, IMPROVED, OK, NOT_JUDGED = "regressed", "improved", "ok", "n/a"


def verdict(delta: float, lo: float, hi: float, threshold: float) -> str:
    """``delta`` (candidate - baseline, points) and its interval ``[lo, hi]``. Regressed when
    the drop exceeds ``threshold`` AND the interval lies below zero: a small type's noise has a
    wide interval and is not flagged, while a real drop that the average hides still is."""
    if math.isnan(delta):
        return NOT_JUDGED
    if delta < -threshold and hi < 0:
        return REGRESSED
    if delta > threshold and lo > 0:
        return IMPROVED
    return OK


def rouge_verdict(mean: float, hi: float, floor: float | None) -> str:
    """Types with no checkable answer are judged only when a ROUGE-L floor (points) is given:
    regressed when the mean and the interval's top both lie under it."""
    if floor is None or math.isnan(mean):
        return NOT_JUDGED
    return REGRESSED if mean < floor and hi < floor else OK
