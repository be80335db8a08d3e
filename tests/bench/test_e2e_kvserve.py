"""End to end against a real `kvserve serve` on the bundled model (WORKLOADS.md acceptance)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("kvserve.server.serve_cli", reason="the kvserve server has not landed yet")

from kvserve.bench import metrics, tokens  # noqa: E402
from kvserve.bench.client import Target  # noqa: E402
from kvserve.bench.profiles import WorkloadConfig, make_units  # noqa: E402
from kvserve.bench.runner import LoadConfig, run  # noqa: E402

pytestmark = pytest.mark.slow


def _serve(*flags: str) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "kvserve.cli", "serve", "--port", str(port),
                             *flags])  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    yield from _serve()


def _bench(url: str, tok, profile: str, n: int) -> tuple[list, dict | None]:
    cfg = WorkloadConfig(profile, seed=0, input_len=200, output_len=8, groups=2, prefix_len=256,
                         questions=4, question_len=32)  # fmt: skip
    load = LoadConfig(max_concurrency=2, num_requests=n, quiet=True, scrape_metrics=True)
    out = run(make_units(cfg, tok), Target(url), tok, load, open_loop=False)
    return out.records, out.server


def test_counts_and_hit_rate_match_server(server: str, bundled_tok) -> None:
    recs, srv = _bench(server, bundled_tok, "shared-prefix", 8)
    assert all(r.ok for r in recs)
    assert sum(r.prompt_tokens for r in recs) == srv["deltas"]["prompt_tokens_total"]
    assert sum(r.completion_tokens for r in recs) == srv["deltas"]["generation_tokens_total"]
    client = metrics.cache_stats(recs)
    assert client["cache_hit_rate"] == pytest.approx(srv["server_cache_hit_rate"], abs=0.01)
    assert client["cache_hit_rate"] >= 0.8 * client["ideal_cache_hit_rate"]


def test_prefix_cache_off_gives_zero_hits(bundled_tok) -> None:
    for url in _serve("--disable-prefix-cache"):
        recs, _ = _bench(url, bundled_tok, "shared-prefix", 8)
        assert metrics.cache_stats(recs)["cache_hit_rate"] == 0.0


def test_client_prompt_counts_equal_usage(server: str) -> None:
    tok = tokens.load("bundled")
    recs, _ = _bench(server, tok, "random", 4)
    assert all(abs(r.prompt_tokens - 200) <= 3 for r in recs)
