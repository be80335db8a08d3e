"""Real processes for the router tests: load sinks (`kvserve bench`'s fake OpenAI server,
cheap) as workers where a model is not the point, and `kvserve route` subprocesses."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvserve.bench.load_sink import running_sink
from kvserve.router.launch import RouterProcess, start_router

SINK_HEALTH = ("--health-check-endpoint", "/v1/models")  # the sink has no /health


@pytest.fixture
def sinks() -> Iterator[Callable[..., str]]:
    """sinks(*flags) -> URL of a new load sink, stopped after the test."""
    with contextlib.ExitStack() as stack:
        yield lambda *flags: stack.enter_context(running_sink(*flags))


@pytest.fixture
def router() -> Iterator[Callable[..., RouterProcess]]:
    """router(*flags, ready=True) -> a `kvserve route` process, stopped after the test."""
    started: list[RouterProcess] = []

    def start(*flags: str, ready: bool = True, headers: dict[str, str] | None = None
              ) -> RouterProcess:  # fmt: skip
        r = start_router(*flags)
        started.append(r)
        if ready:
            r.wait_ready(headers=headers)
        return r

    yield start
    for r in started:
        assert r.stop() == 0


def router_metrics(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    """name{labels} -> value, from the router's /metrics through prometheus_client's parser."""
    text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def complete(url: str, headers: dict[str, str] | None = None, **body: object) -> httpx.Response:
    payload = {"model": "m", "prompt": "hello", "max_tokens": 4, **body}
    return httpx.post(url + "/v1/completions", json=payload, headers=headers, timeout=60)
