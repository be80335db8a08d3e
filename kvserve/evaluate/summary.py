"""Per-type and overall summary of the item rows: scores, deltas with paired-bootstrap
intervals, ROUGE-L and agreement against the baseline, and a verdict per type. All figures
are in points (0-100)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from kvserve.evaluate.bootstrap import interval
from kvserve.evaluate.verdict import rouge_verdict, verdict

OVERALL = "overall"


@dataclass(frozen=True)
class Judging:
    threshold: float = 2.0  # points of task score
    rouge_floor: float | None = None  # points of ROUGE-L, for types with no answer
    resamples: int = 2000


def _mean(xs: list[float]) -> float:
    return 100.0 * sum(xs) / len(xs) if xs else math.nan


def _ci(groups: list[list[float]], resamples: int) -> list[float]:
    lo, hi = interval(groups, resamples=resamples)
    return [100.0 * lo, 100.0 * hi]


def _macro(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def _candidate(groups: list[list[dict]], base: str, cand: str, judging: Judging) -> dict:
    """One candidate over one type (one group) or overall (one group per type)."""
    scored = [[r for r in g if r["scorer"] is not None] for g in groups]
    diffs = [[r["scores"][cand] - r["scores"][base] for r in g] for g in scored]
    rouge = [[r["rouge_l"][cand] for r in g] for g in groups]
    delta = _macro([_mean(d) for d in diffs])
    ci = _ci(diffs, judging.resamples)
    rouge_mean = _macro([_mean(x) for x in rouge])
    rouge_ci = _ci(rouge, judging.resamples)
    judged = any(scored)
    return {
        "score": _macro([_mean([r["scores"][cand] for r in g]) for g in scored]),
        "delta": delta,
        "ci": ci,
        "rouge_l": rouge_mean,
        "rouge_l_ci": rouge_ci,
        "agreement": _macro([_mean([float(r["agree"][cand]) for r in g]) for g in groups]),
        "errors": sum(1 for g in groups for r in g if cand in r["errors"]),
        "verdict": verdict(delta, *ci, judging.threshold) if judged
        else rouge_verdict(rouge_mean, rouge_ci[1], judging.rouge_floor),
    }  # fmt: skip


def _row(name: str, groups: list[list[dict]], base: str, cands: list[str], judging: Judging
         ) -> dict[str, Any]:  # fmt: skip
    scored = [[r for r in g if r["scorer"] is not None] for g in groups]
    scorers = sorted({r["scorer"] for g in scored for r in g})
    return {
        "type": name,
        "n": sum(len(g) for g in groups),
        "n_scored": sum(len(g) for g in scored),
        "scorer": scorers[0] if len(scorers) == 1 else ("mixed" if scorers else None),
        "baseline": {
            "score": _macro([_mean([r["scores"][base] for r in g]) for g in scored]),
            "errors": sum(1 for g in groups for r in g if base in r["errors"]),
        },
        "candidates": {c: _candidate(groups, base, c, judging) for c in cands},
    }


def summarize(rows: list[dict], base: str, cands: list[str], judging: Judging) -> list[dict]:
    """One entry per type (in first-seen order), then ``overall``: the mean over types, each
    type weighing the same, with an interval from resampling within every type."""
    by_type: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_type[r["type"]].append(r)
    table = [_row(t, [g], base, cands, judging) for t, g in by_type.items()]
    table.append(_row(OVERALL, list(by_type.values()), base, cands, judging))
    return table
