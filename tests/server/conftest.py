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


def assert_invariants(
    url: str, timeout_s: float = 60, headers: dict[str, str] | None = None
) -> None:
    """After a fault: the engine goes idle with every KV page back (the engine checks KV
    integrity itself as it goes idle, and dies if it fails), and the admission ledger
    agrees with the engine once no message is in transit: admitted = running + waiting +
    in preparation, all zero when idle."""
    m = wait_idle(url, timeout_s, headers)
    deadline = time.monotonic() + timeout_s
    while m["kvserve:num_messages_in_transit"] != 0 or m["kvserve:num_requests_admitted"] != 0:
        assert time.monotonic() < deadline, f"admission ledger not settled: {m}"
        time.sleep(0.2)
        m = metrics(url, headers)
    assert admission_agrees(m) is True
    assert httpx.get(url + "/health", timeout=10).status_code == 200


def admission_agrees(m: dict[str, float]) -> bool | None:
    """None while messages are in transit; else whether admitted = running + waiting + in
    preparation (exact at such a moment: the engine's last snapshot saw every message)."""
    if m["kvserve:num_messages_in_transit"] != 0:
        return None
    in_engine = m["kvserve:num_requests_running"] + m["kvserve:num_requests_waiting"]
    return m["kvserve:num_requests_admitted"] == in_engine + m["kvserve:num_requests_preparing"]
