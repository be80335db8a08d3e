"""A server with an API key (from KVSERVE_API_KEY), one running slot, a one-slot queue, a small
body limit and small per-request limits; a burst of streaming requests admits exactly what the
limits allow; at the end SIGTERM drains its in-flight request and it exits 0."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import signal
from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import (
    Server,
    admission_agrees,
    assert_invariants,
    metrics,
    start_server,
    wait_idle,
)

KEY = {"Authorization": "Bearer s3cret"}


@pytest.fixture(scope="module")
def limited() -> Iterator[Server]:
    s = start_server("--max-queued-requests", "1", "--max-running-requests", "1",
                     "--max-request-bytes", "4096", "--max-n", "2", "--max-stop-strings", "2",
                     "--default-max-tokens", "5", env={"KVSERVE_API_KEY": "s3cret"})  # fmt: skip
    yield s
    s.stop()


def test_auth(limited: Server) -> None:
    assert httpx.get(limited.url + "/health").status_code == 200  # open for probes
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        resp = httpx.get(limited.url + "/v1/models", headers=headers)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == 401
    assert httpx.get(limited.url + "/metrics").status_code == 401
    assert httpx.get(limited.url + "/v1/models", headers=KEY).status_code == 200
    twice = [("Authorization", KEY["Authorization"])] * 2
    resp = httpx.get(limited.url + "/v1/models", headers=twice)
    assert resp.status_code == 400 and "Authorization" in resp.json()["error"]["message"]


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


def test_request_limits(limited: Server) -> None:
    url = limited.url + "/v1/completions"
    for body, param in (({"prompt": "hi", "n": 3}, "n"),
                        ({"prompt": "hi", "stop": ["a", "b", "c"]}, "stop")):  # fmt: skip
        err = httpx.post(url, json=body, headers=KEY).json()["error"]
        assert err["code"] == 400 and err["param"] == param and "--max-" in err["message"]
    body = {"prompt": "hi", "max_tokens": None, "ignore_eos": True}
    assert (
        httpx.post(url, json=body, headers=KEY, timeout=120).json()["usage"]["completion_tokens"]
        == 5
    )  # --default-max-tokens
    chat = {"messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
    resp = httpx.post(limited.url + "/v1/chat/completions", json=chat, headers=KEY, timeout=120)
    assert resp.json()["usage"]["completion_tokens"] == 5


async def _burst(url: str, n: int) -> tuple[list[int], dict[str, float]]:
    """n streaming requests at once; each holds its stream open until every status line is
    in (so none finishes and frees a slot), then hangs up."""
    body = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True,
            "stream": True}  # fmt: skip
    codes: list[int] = []
    all_in = asyncio.Event()
    sample: dict[str, float] = {}

    async def one(http: httpx.AsyncClient) -> None:
        async with http.stream("POST", url + "/v1/completions", json=body, headers=KEY) as r:
            codes.append(r.status_code)
            if r.status_code == 429:
                assert json.loads(await r.aread())["error"]["code"] == 429
            if len(codes) == n and not sample:  # once: the 429s' reads interleave here
                sample["taken"] = 1.0
                sample.update(await asyncio.to_thread(metrics, url, KEY))
                all_in.set()
            await all_in.wait()

    limits = httpx.Limits(max_connections=n + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        await asyncio.gather(*(one(http) for _ in range(n)))
    return codes, sample


def test_burst_of_streams_respects_queue_limit(limited: Server) -> None:
    codes, sample = asyncio.run(_burst(limited.url, 40))
    accepted = codes.count(200)
    assert 1 <= accepted <= 2 and codes.count(429) == 40 - accepted, codes  # 1 running + 1 queued
    assert sample["kvserve:num_requests_admitted"] == accepted
    assert admission_agrees(sample) is not False, sample
    assert_invariants(limited.url, headers=KEY)
    codes, _ = asyncio.run(_burst(limited.url, 8))  # nothing leaked: the same room again
    assert 1 <= codes.count(200) <= 2, codes
    assert_invariants(limited.url, headers=KEY)


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
