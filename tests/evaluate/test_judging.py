"""Paired bootstrap intervals and verdicts on constructed data: a real drop on one type is
flagged even when the average hides it; noise on a small type and identical outputs are not."""

from __future__ import annotations

import math

import pytest

from kvserve.evaluate.bootstrap import interval
from kvserve.evaluate.summary import Judging, summarize
from kvserve.evaluate.verdict import verdict


def test_interval_basics() -> None:
    assert interval([[0.0] * 10]) == (0.0, 0.0)
    assert interval([[-1.0] * 5]) == (-1.0, -1.0)
    lo, hi = interval([[0.0, 1.0] * 50])
    assert lo < 0.5 < hi and hi - lo < 0.25
    assert interval([[0.3, 0.7]], seed=1) == interval([[0.3, 0.7]], seed=1)  # seeded
    assert all(math.isnan(x) for x in interval([[]]))


def test_stratified_keeps_each_group_weight() -> None:
    # group means 0 and 1 -> the mean over groups is always 0.5, whatever the resample
    assert interval([[0.0] * 3, [1.0] * 30]) == pytest.approx((0.5, 0.5))


@pytest.mark.parametrize(
    ("delta", "lo", "hi", "want"),
    [
        (-5.0, -9.0, -1.0, "regressed"),
        (-5.0, -12.0, 2.0, "ok"),  # interval crosses zero: noise
        (-1.5, -2.0, -1.0, "ok"),  # real but under the threshold
        (0.0, 0.0, 0.0, "ok"),
        (6.0, 1.0, 11.0, "improved"),
        (math.nan, math.nan, math.nan, "n/a"),
    ],
)
def test_verdict(delta: float, lo: float, hi: float, want: str) -> None:
    assert verdict(delta, lo, hi, threshold=2.0) == want


def _rows(kind: str, base: list[float], cand: list[float], scorer: str | None = "exact"
          ) -> list[dict]:  # fmt: skip
    return [
        {"type": kind, "scorer": scorer, "scores": {"b": b, "c": c}, "errors": {},
         "rouge_l": {"c": 1.0 if b == c else 0.5}, "agree": {"c": b == c}}
        for b, c in zip(base, cand, strict=True)
    ]  # fmt: skip


def _by_type(table: list[dict]) -> dict[str, dict]:
    return {row["type"]: row["candidates"]["c"] for row in table}


def test_hidden_drop_on_one_type_is_flagged() -> None:
    rows = (_rows("table", [1.0] * 20, [1.0] * 15 + [0.0] * 5)  # -25 points, every pair <= 0
            + _rows("math", [0.0] * 20, [0.0] * 18 + [1.0] * 2)  # +10, noisy
            + _rows("choice", [1.0] * 20, [1.0] * 20)
            + _rows("summary", [0.0] * 20, [0.0] * 20, scorer=None))  # fmt: skip
    for r in rows:
        if r["scorer"] is None:
            r["scores"] = {"b": None, "c": None}
    table = summarize(rows, "b", ["c"], Judging(threshold=2.0))
    got = _by_type(table)
    assert got["table"]["verdict"] == "regressed"
    assert got["table"]["delta"] == pytest.approx(-25.0)
    assert got["table"]["ci"][1] < 0
    assert got["math"]["verdict"] == "ok"  # 2 of 20 flips up: interval includes 0
    assert got["choice"]["verdict"] == "ok" and got["choice"]["agreement"] == 100.0
    assert got["summary"]["verdict"] == "n/a" and got["summary"]["delta"] is not None
    assert math.isnan(got["summary"]["delta"])
    # overall: mean over the 3 scored types of (-25, +10, 0) = -5, not flagged
    assert got["overall"]["delta"] == pytest.approx(-5.0)
    assert got["overall"]["verdict"] == "ok"


def test_small_noisy_type_is_not_flagged() -> None:
    rows = _rows("tiny", [1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0])  # -25 on 4 items
    got = _by_type(summarize(rows, "b", ["c"], Judging(threshold=2.0)))
    assert got["tiny"]["delta"] == pytest.approx(-25.0)
    assert got["tiny"]["ci"][0] < 0 < got["tiny"]["ci"][1]
    assert got["tiny"]["verdict"] == "ok"


def test_identical_outputs_flag_nothing() -> None:
    rows = _rows("a", [1.0, 0.0, 1.0], [1.0, 0.0, 1.0]) + _rows("b", [0.0, 1.0], [0.0, 1.0])
    table = summarize(rows, "b", ["c"], Judging())
    assert all(row["candidates"]["c"]["verdict"] == "ok" for row in table)
    assert all(row["candidates"]["c"]["ci"] == [0.0, 0.0] for row in table)


def test_rouge_floor_judges_answerless_types() -> None:
    rows = _rows("rewrite", [0.0] * 10, [1.0] * 10, scorer=None)  # rouge 0.5 everywhere
    assert (
        _by_type(summarize(rows, "b", ["c"], Judging(rouge_floor=80.0)))["rewrite"]["verdict"]
        == "regressed"
    )
    assert (
        _by_type(summarize(rows, "b", ["c"], Judging(rouge_floor=40.0)))["rewrite"]["verdict"]
        == "ok"
    )
