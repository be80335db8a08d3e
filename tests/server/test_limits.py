"""A server with an API key (from KVSERVE_API_KEY), a one-slot queue and a small body limit;
at the end SIGTERM drains its in-flight request and it exits 0."""

from __future__ import annotations

import concurrent.futures as cf
import json
import signal
from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import Server, start_server, wait_idle

KEY = {"Authorization": "Bearer s3cret"}


@pytest.fixture(scope="module")
def limited() -> Iterator[Server]:
    s = start_server("--max-queued-requests", "1", "--max-running-requests", "1",
                     "--max-request-bytes", "4096", env={"KVSERVE_API_KEY": "s3cret"})  # fmt: skip
    yield s
    s.stop()


def test_auth(limited: Server) -> None:
    assert httpx.get(limited.url + "/health").status_code == 200  # open for probes
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        resp = httpx.get(limited.url + "/v1/models", headers=headers)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == 401
    assert httpx.get(limited.url + "/metrics").status_code == 401
    assert httpx.get(limited.url + "/v1/models", headers=KEY).status_code == 200


def test_body_too_large(limited: Server) -> None:
    body = {"prompt": "x" * 5000, "max_tokens": 1}
    resp = httpx.post(limited.url + "/v1/completions", json=body, headers=KEY)
    assert resp.status_code == 413 and "4096" in resp.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while it arrives
        yield json.dumps(body).encode()

    resp = httpx.post(limited.url + "/v1/completions", content=chunks(),
                      headers={**KEY, "content-type": "application/json"})  # fmt: skip
    assert resp.status_code == 413


def test_queue_full_gets_429(limited: Server) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 48, "ignore_eos": True}

    def post(_: int) -> int:
        return httpx.post(limited.url + "/v1/completions", json=body, headers=KEY,
                          timeout=300).status_code  # fmt: skip

    with cf.ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(post, range(6)))
    assert 429 in codes and 200 in codes and set(codes) <= {200, 429}
    wait_idle(limited.url, headers=KEY)


def test_sigterm_drains_then_exits_0(limited: Server) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", limited.url + "/v1/completions", json=body, headers=KEY,
                      timeout=300) as resp:  # fmt: skip
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        limited.proc.send_signal(signal.SIGTERM)
        late = httpx.post(limited.url + "/v1/completions", headers=KEY, timeout=30,
                          json={"prompt": "hi", "max_tokens": 1})  # fmt: skip
        assert late.status_code == 503
        events = [first] + [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    texts = [json.loads(e[6:])["choices"][0] for e in events[:-1]]
    assert texts[-1]["finish_reason"] == "length"
    assert limited.proc.wait(60) == 0
