"""The router over two real `kvserve serve` workers on the bundled model (started once for the
module): every policy routes and streams, greedy outputs equal the direct ones, and a client
that hangs up aborts the request on the worker."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from kvserve.server.launch import ServerProcess, launch_server
from tests.router.test_router_http import sse_events
from tests.server.conftest import wait_idle

pytestmark = pytest.mark.timeout(1800)  # two model servers start at once on 2 shared cores
PROMPTS = ["The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def workers() -> Iterator[list[ServerProcess]]:
    started = [launch_server(), launch_server()]  # both load at once
    try:
        for s in started:
            s.wait_healthy(900)  # two at once on a busy 2-core box can be slow
        yield started
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def direct(workers: list[ServerProcess]) -> dict[str, dict]:
    """Each prompt's greedy output straight from a worker, computed once."""
    return {prompt: greedy(workers[0].url, prompt) for prompt in PROMPTS}


def greedy(url: str, prompt: str, stream: bool = False) -> dict:
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    resp = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    if not stream:
        data = resp.json()
        return {"text": data["choices"][0]["text"], "usage": data["usage"]}
    events = [json.loads(e) for e in sse_events(resp.text)[:-1]]
    text = "".join(c["text"] for e in events for c in e["choices"])
    return {"text": text, "usage": events[-1]["usage"]}


@pytest.mark.parametrize("policy", ["round_robin", "least_outstanding", "cache_aware", "random"])
def test_each_policy_routes_and_streams_greedy_outputs_equal_direct(
    workers: list[ServerProcess], direct: dict[str, dict], router, policy: str
) -> None:
    r = router("--worker-urls", *(w.url for w in workers), "--policy", policy)
    for prompt in PROMPTS:
        assert greedy(r.url, prompt) == direct[prompt]
        assert greedy(r.url, prompt, stream=True) == direct[prompt]
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    chat = httpx.post(r.url + "/v1/chat/completions", timeout=120, json=body)
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"]
    served = [w["requests"] for w in httpx.get(r.url + "/workers").json()["workers"]]
    assert sum(served) == 2 * len(PROMPTS) + 1
    if policy == "round_robin":
        assert served == [3, 2]


def test_passthrough_endpoints_and_an_abort_reaching_the_worker(workers, router) -> None:
    r = router("--worker-urls", *(w.url for w in workers), "--policy", "round_robin")
    models = httpx.get(r.url + "/v1/models", timeout=30).json()
    assert models == httpx.get(workers[0].url + "/v1/models", timeout=30).json()
    tok = httpx.post(r.url + "/tokenize", json={"prompt": PROMPTS[0]}, timeout=30)
    assert tok.json() == httpx.post(workers[0].url + "/tokenize", json={"prompt": PROMPTS[0]},
                                    timeout=30).json()  # fmt: skip
    body = {"prompt": "Tell me a very long story.", "max_tokens": 2000, "stream": True,
            "ignore_eos": True}  # fmt: skip
    with httpx.stream("POST", r.url + "/v1/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        next(resp.iter_raw())  # the first chunk arrived: generation is running; hang up
    for w in workers:  # the worker saw the abort: nothing runs, no KV page is held
        wait_idle(w.url, timeout_s=60)
    text = httpx.get(r.url + "/metrics").text
    assert "kvserve_router:client_disconnects_total 1" in text
    assert 'kvserve_router:worker_outstanding_requests{worker="' in text
    assert all(w["load"] == 0 for w in httpx.get(r.url + "/workers").json()["workers"])
