"""End to end against a real `kvserve serve` on the bundled model (WORKLOADS.md acceptance).

Two servers, one per prefix-cache setting, started together at module set-up (their start-up
overlaps) and stopped at tear-down. The prefix-cache-on run is the real `kvserve bench` CLI in a
subprocess; the others go through `kvserve.bench.cli.main` in-process, as `kvserve demo` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvserve.bench import cli, tokens
from kvserve.bench.profiles import WorkloadConfig, make_units
from kvserve.bench.records import RequestRecord, read_records
from kvserve.server.launch import launch_server
from tests.server.conftest import Server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
# 2 groups x 160-token prefixes x 3 questions of 32 tokens, 8 output tokens: ~200-token prompts
SHARED = WorkloadConfig("shared-prefix", seed=0, output_len=8, groups=2, prefix_len=160,
                        questions=3, question_len=32)  # fmt: skip
SHARED_FLAGS = ["--profile", "shared-prefix", "--seed", "0", "--output-len", "8", "--groups", "2",
                "--prefix-len", "160", "--questions", "3", "--question-len", "32",
                "--tokenizer", "bundled", "--max-concurrency", "2", "--scrape-metrics",
                "--quiet"]  # fmt: skip
N_ON, N_OFF = 6, 4
PLOTS = ("latency_cdfs.png", "tokens_over_time.png")


def _launch(*flags: str) -> Server:
    return launch_server(*flags, env=ENV)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Server]]:
    launched = {"on": _launch(), "off": _launch("--disable-prefix-cache")}
    try:
        yield launched
    finally:
        codes = {name: s.stop() for name, s in launched.items()}
    assert codes == {"on": 0, "off": 0}


def _ready(s: Server) -> str:
    return s.wait_healthy(timeout_s=300)


@pytest.fixture(scope="module")
def url_on(servers: dict[str, Server]) -> str:
    return _ready(servers["on"])


@pytest.fixture(scope="module")
def url_off(servers: dict[str, Server]) -> str:
    return _ready(servers["off"])


@pytest.fixture(scope="module")
def run_on(url_on: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`kvserve bench` exactly as a user types it, against the prefix-cache-on server."""
    out = tmp_path_factory.mktemp("bench_on")
    cmd = [sys.executable, "-m", "kvserve.cli", "bench", "--base-url", url_on, *SHARED_FLAGS,
           "--num-requests", str(N_ON), "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr
    assert "Serving Benchmark Result" in proc.stdout
    return out


def _result(out: Path) -> tuple[dict, list[RequestRecord]]:
    return json.loads((out / "result.json").read_text()), read_records(out / "requests.jsonl")


def test_counts_equal_server_usage_and_metrics(run_on: Path, bundled_tok: tokens.Tokenizer
                                               ) -> None:  # fmt: skip
    result, recs = _result(run_on)
    assert len(recs) == N_ON and all(r.ok for r in recs) and result["failed"] == 0
    assert all(r.token_source == "usage" for r in recs)
    assert all(r.completion_tokens == 8 == len(r.chunk_times) for r in recs)
    # the client's own tokenizer counts what it sent exactly as the server's usage does
    units = make_units(SHARED, bundled_tok)
    for rec in recs:  # closed loop of single-turn units: record i is unit i
        unit = next(units)
        sent = f"{unit.system}\n\n{unit.turns[0].user}"
        assert len(bundled_tok.encode(sent)) == rec.prompt_tokens
    srv = result["server_metrics"]
    assert srv["available"]
    deltas = srv["deltas"]
    assert deltas["request_success_total"] == N_ON
    assert deltas["prompt_tokens_total"] == result["total_input_tokens"]
    assert deltas["prompt_tokens_total"] == sum(r.prompt_tokens for r in recs)
    assert deltas["generation_tokens_total"] == result["total_output_tokens"] == 8 * N_ON
    assert deltas["prefix_cache_queries_total"] == result["total_input_tokens"]
    peak, mean = srv["peak_gauges"], srv["mean_gauges"]  # KV occupancy sampled each second
    assert 0.0 <= mean["kv_cache_usage_perc"] <= peak["kv_cache_usage_perc"] <= 1.0


def test_hit_rate_matches_prometheus_and_is_near_ideal(run_on: Path) -> None:
    result, recs = _result(run_on)
    srv = result["server_metrics"]
    hit, ideal = result["cache_hit_rate"], result["ideal_cache_hit_rate"]
    assert hit == pytest.approx(srv["server_cache_hit_rate"], abs=0.01)
    assert result["cached_tokens"] == pytest.approx(srv["deltas"]["prefix_cache_hits_total"],
                                                    rel=0.01)  # fmt: skip
    # 4 of 6 prompts can reuse a ~160-token prefix; a paged cache loses < 1 page per hit
    assert ideal > 0.4
    assert 0.85 * ideal <= hit <= ideal + 1e-9
    assert all(r.cached_tokens is not None for r in recs)
    assert sum(r.cached_tokens > 0 for r in recs) >= 3


def test_report_rerenders_same_numbers_with_plots_and_html(run_on: Path) -> None:
    before = json.loads((run_on / "result.json").read_text())
    for name in (*PLOTS, "report.html", "result.json"):
        (run_on / name).unlink()
    (run_on / "result.json").write_text(
        json.dumps({"meta": before["meta"], "server_metrics": before["server_metrics"]})
    )
    assert cli.main(["report", str(run_on)]) == 0
    after = json.loads((run_on / "result.json").read_text())
    assert after == before
    page = (run_on / "report.html").read_text()
    for name in PLOTS:
        assert (run_on / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'alt="{Path(name).stem}" src="data:image/png;base64,' in page
    assert "Serving Benchmark Result" in page and "Cache hit rate" in page


def test_random_prompts_have_exact_lengths_and_no_sharing(url_on: str, tmp_path: Path,
                                                          bundled_tok: tokens.Tokenizer
                                                          ) -> None:  # fmt: skip
    argv = ["--base-url", url_on, "--profile", "random", "--seed", "7", "--input-len", "100",
            "--output-len", "8", "--tokenizer", "bundled", "--max-concurrency", "2",
            "--num-requests", "2", "--quiet", "--out", str(tmp_path)]  # fmt: skip
    assert cli.main(argv) == 0
    result, recs = _result(tmp_path)
    assert len(recs) == 2
    units = make_units(WorkloadConfig("random", seed=7, input_len=100, output_len=8), bundled_tok)
    for rec in recs:
        assert rec.ok and rec.prompt_tokens == len(next(units).ids)
        assert abs(rec.prompt_tokens - 100) <= 3
    assert result["cached_tokens"] == 0 and result["ideal_cache_hit_rate"] < 0.02


def test_prefix_cache_off_gives_zero_hits(url_off: str, tmp_path: Path) -> None:
    argv = ["--base-url", url_off, *SHARED_FLAGS, "--num-requests", str(N_OFF),
            "--out", str(tmp_path)]  # fmt: skip
    assert cli.main(argv) == 0
    result, recs = _result(tmp_path)
    assert len(recs) == N_OFF and all(r.ok and r.cached_tokens == 0 for r in recs)
    assert result["cache_hit_rate"] == 0.0
    srv = result["server_metrics"]
    assert srv["deltas"]["prefix_cache_hits_total"] == 0 and srv["server_cache_hit_rate"] == 0.0
    assert srv["deltas"]["prompt_tokens_total"] == result["total_input_tokens"]
    assert result["ideal_cache_hit_rate"] > 0.3  # the same workload could have shared prefixes
