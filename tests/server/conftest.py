"""A real ``kvserve serve`` subprocess on a free port, shared by the tests that need no
special flags; tests that need other flags start their own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvserve.server.launch import ServerProcess as Server
from kvserve.server.launch import start_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    s = start_server("--tool-call-parser", "hermes", "--reasoning-parser", "think")
    yield s
    assert s.stop() == 0


def metrics(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    """Sample name (labels dropped, values summed) -> value, via prometheus_client's parser."""
    text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def wait_idle(url: str, timeout_s: float = 60, headers: dict[str, str] | None = None) -> dict:
    """Poll /metrics until nothing runs or waits and no KV page is held by a request."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = metrics(url, headers)
        busy = m["kvserve:num_requests_running"] + m["kvserve:num_requests_waiting"]
        if busy == 0 and m["kvserve:kv_cache_usage_perc"] == 0:
            return m
        assert time.monotonic() < deadline, f"engine still busy: {m}"
        time.sleep(0.2)
