from __future__ import annotations

import pytest

from kvserve.bench import metrics
from kvserve.bench.ideal import PrefixTracker, ideal_hit_rate
from kvserve.bench.percentiles import summarize
from kvserve.bench.records import RequestRecord
from kvserve.bench.revenue import parse_price
from kvserve.bench.slo import parse_slos
from kvserve.errors import ConfigError


def _rec(i: int, start: float, chunks: list[float], n_out: int, **kw) -> RequestRecord:
    return RequestRecord(i, start=start, ttft=chunks[0] - start, chunk_times=chunks,
                         end=chunks[-1], completion_tokens=n_out, **kw)  # fmt: skip


@pytest.fixture
def records() -> list[RequestRecord]:
    # A: start 0, chunks at 0.5, 0.6, 0.8 (3 tokens) -> ttft .5, tpot (.8-.5)/2=.15, e2e .8
    # B: start 1, chunks at 1.2, 1.3, 1.4, 2.2 (4 tokens) -> ttft .2, tpot 1.0/3, e2e 1.2
    # C: failed at 0.4..0.9
    return [
        _rec(0, 0.0, [0.5, 0.6, 0.8], 3, prompt_tokens=100, cached_tokens=40, cls="chat",
             ideal_cached_tokens=50),
        _rec(1, 1.0, [1.2, 1.3, 1.4, 2.2], 4, prompt_tokens=300, cached_tokens=60, cls="qa",
             ideal_cached_tokens=150),
        RequestRecord(2, start=0.4, end=0.9, error="HTTP 500: x", error_kind="http_500"),
    ]  # fmt: skip


def test_latencies_follow_vllm_definitions(records: list[RequestRecord]) -> None:
    r = metrics.compute(records)
    assert r["completed"] == 2 and r["failed"] == 1
    assert r["failures_by_kind"] == {"http_500": 1}
    assert r["mean_ttft_ms"] == pytest.approx(350.0)
    assert r["mean_tpot_ms"] == pytest.approx((150.0 + 1000.0 / 3) / 2)
    # pooled ITL gaps: .1,.2 and .1,.1,.8
    assert r["mean_itl_ms"] == pytest.approx(1300.0 / 5)
    assert r["max_itl_ms"] == pytest.approx(800.0)
    assert r["median_itl_ms"] == pytest.approx(100.0)
    assert r["mean_e2el_ms"] == pytest.approx(1000.0)


def test_throughput_concurrency_and_peak(records: list[RequestRecord]) -> None:
    r = metrics.compute(records)
    assert r["duration"] == pytest.approx(2.2)  # first start 0.0 -> last end 2.2
    assert r["request_throughput"] == pytest.approx(2 / 2.2)
    assert r["output_throughput"] == pytest.approx(7 / 2.2)
    assert r["total_token_throughput"] == pytest.approx(407 / 2.2)
    # Little's law over all measured requests: (0.8 + 1.2 + 0.5) / 2.2
    assert r["mean_concurrency"] == pytest.approx(2.5 / 2.2)
    assert r["max_concurrent_requests"] == 2  # A and C overlap; B starts after A ends
    # 1-second buckets: [0,1): 3 chunks of A; [1,2): 3 chunks of B; [2,3): 1
    assert r["max_output_tokens_per_s"] == pytest.approx(3.0)


def test_cache_rates_and_per_class(records: list[RequestRecord]) -> None:
    r = metrics.compute(records)
    assert r["cache_hit_rate"] == pytest.approx(100 / 400)
    assert r["ideal_cache_hit_rate"] == pytest.approx(200 / 400)
    assert r["per_class"]["chat"]["cache_hit_rate"] == pytest.approx(0.4)
    assert r["per_class"]["qa"]["ideal_cache_hit_rate"] == pytest.approx(0.5)


def test_unreported_cached_tokens_give_no_hit_rate() -> None:
    rec = _rec(0, 0.0, [0.1, 0.2], 2, prompt_tokens=10)
    assert metrics.compute([rec])["cache_hit_rate"] is None


def test_warmup_is_excluded(records: list[RequestRecord]) -> None:
    records.append(_rec(3, 5.0, [9.0, 9.5], 2, warmup=True))
    r = metrics.compute(records)
    assert r["warmup_requests"] == 1 and r["completed"] == 2 and r["duration"] == pytest.approx(2.2)


def test_percentiles_known_values() -> None:
    s = summarize(list(range(1, 101)))
    assert s["mean"] == 50.5 and s["median"] == 50.5
    assert s["p90"] == pytest.approx(90.1) and s["p99"] == pytest.approx(99.01)
    assert s["max"] == 100
    assert summarize([])["p99"] == 0.0


def test_goodput_and_attainment(records: list[RequestRecord]) -> None:
    # A: ttft .5 tpot .15 ; B: ttft .2 tpot .333 ; C failed
    r = metrics.compute(records, slos=parse_slos(["ttft=400ms", "tpot=0.5s"]))
    assert r["goodput"]["good_requests"] == 1
    assert r["goodput"]["request_goodput"] == pytest.approx(1 / 2.2)
    assert r["goodput"]["token_goodput"] == pytest.approx(4 / 2.2)
    assert r["goodput"]["slo_attainment"] == pytest.approx(1 / 3)


def test_revenue(records: list[RequestRecord]) -> None:
    r = metrics.compute(records, prices=parse_price(["input=4,cached=1", "output=16"]))
    total = (300 * 4 + 100 * 1 + 7 * 16) / 1e6
    assert r["revenue"]["revenue_total"] == pytest.approx(total)
    assert r["revenue"]["revenue_per_s"] == pytest.approx(total / 2.2)
    assert r["revenue"]["revenue_per_day"] == pytest.approx(total / 2.2 * 86400)


@pytest.mark.parametrize(
    ("flag", "parse"),
    [(["ttft=fast"], parse_slos), (["speed=1s"], parse_slos), (["input=x"], parse_price),
     (["cached=1"], parse_price), (["input"], parse_price)],
)  # fmt: skip
def test_bad_slo_and_price_flags(flag: list[str], parse) -> None:
    with pytest.raises(ConfigError):
        parse(flag)


def test_ideal_is_longest_prefix_against_all_earlier() -> None:
    t = PrefixTracker()
    assert t.observe([1, 2, 3, 4]) == 0
    assert t.observe([1, 2, 9]) == 2
    assert t.observe([1, 2, 3, 7, 7]) == 3  # best match is the first prompt, not the latest
    assert t.observe([1, 2, 3, 4]) == 3  # a repeat still computes its last token
    assert t.observe([5]) == 0
    assert ideal_hit_rate([[1, 2, 3, 4], [1, 2, 3, 4, 5, 6]]) == pytest.approx(4 / 10)
