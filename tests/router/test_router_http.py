"""`kvserve route` over load sinks (real processes, real HTTP): pass-through, keys, bad input,
metrics, the queue, the breaker, the worker API."""

from __future__ import annotations

import asyncio
import json

import httpx

from kvserve.bench.load_sink import running_sink
from kvserve.server.launch import free_port
from tests.cli_runner import run_kvserve
from tests.router.conftest import SINK_HEALTH, complete, router_metrics


def sse_events(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_streams_and_usage_pass_through_untouched(sinks, router) -> None:
    sink = sinks()
    r = router("--worker-urls", sink, "--policy", "round_robin", *SINK_HEALTH)
    body = {"stream": True, "stream_options": {"include_usage": True}, "max_tokens": 5}
    direct, routed = complete(sink, **body), complete(r.url, **body)
    assert routed.status_code == 200
    assert routed.headers["content-type"].startswith("text/event-stream")
    assert sse_events(routed.text) == sse_events(direct.text)
    assert json.loads(sse_events(routed.text)[-2])["usage"]["completion_tokens"] == 5
    messages = [{"role": "user", "content": "hi"}]
    chat_body = {"messages": messages, "max_tokens": 2, "stream": True}
    chat = httpx.post(r.url + "/v1/chat/completions", timeout=30, json=chat_body)
    assert sse_events(chat.text)[-1] == "[DONE]"
    models = httpx.get(r.url + "/v1/models", timeout=30).json()
    assert models["data"][0]["id"] == "load-sink"


def test_api_keys_router_checks_clients_and_sends_the_workers_own(sinks, router) -> None:
    sink = sinks("--api-key", "worker-secret")
    r = router("--worker-urls", sink, "--worker-api-key", "worker-secret", "--api-key",
               "router-secret", *SINK_HEALTH)  # fmt: skip
    good = {"Authorization": "Bearer router-secret"}
    assert complete(r.url).status_code == 401
    bad = complete(r.url, {"Authorization": "Bearer worker-secret"})
    assert bad.status_code == 401 and bad.json()["error"]["message"] == "invalid API key"
    assert complete(r.url, good, stream=True).status_code == 200
    assert httpx.get(r.url + "/health").status_code == 200  # open, for load balancers
    assert httpx.get(r.url + "/metrics").status_code == 401
    assert httpx.get(r.url + "/workers", headers=good).json()["workers"][0]["has_api_key"]


def test_bad_input_gets_openai_errors_never_5xx(sinks, router) -> None:
    r = router("--worker-urls", sinks(), "--max-payload-size", "4096", *SINK_HEALTH)
    url = r.url + "/v1/completions"
    cases = [
        (httpx.post(url, content=b"{not json"), 400),
        (httpx.post(url, content=b"\xff\xfe"), 400),
        (httpx.post(url, json=[1, 2]), 400),
        (httpx.post(url, json={"prompt": "x", "stream": "yes"}), 400),
        (httpx.post(url, json={"prompt": "x" * 10_000}), 413),
        (httpx.get(url), 405),
        (httpx.get(r.url + "/v2/nothing"), 404),
        (httpx.post(r.url + "/tokenize", content=b"[]"), 400),
    ]
    for resp, status in cases:
        assert resp.status_code == status, resp.text
        error = resp.json()["error"]
        assert error["code"] == status and error["message"]


def test_metrics_have_router_names(sinks, router) -> None:
    r = router("--worker-urls", sinks(), *SINK_HEALTH)
    complete(r.url, stream=True)
    m = router_metrics(r.url)
    names = {key.split("{")[0] for key in m}
    for name in ("requests_total", "retries_total", "queue_depth", "queue_wait_seconds_count",
                 "worker_outstanding_requests", "worker_breaker_state", "worker_healthy",
                 "running_requests", "rejected_total", "worker_requests_total"):  # fmt: skip
        assert f"kvserve_router:{name}" in names, name
    assert m["kvserve_router:requests_total{path=/v1/completions,status=200}"] == 1


async def _hold_and_overflow(url: str) -> tuple[list[int], int]:
    """One request runs, one waits in the queue, the third finds it full."""
    async with httpx.AsyncClient(timeout=60) as client:
        body = {"prompt": "x", "max_tokens": 10, "stream": True}
        first = asyncio.create_task(client.post(url + "/v1/completions", json=body))
        await _until(client, url, "kvserve_router:running_requests", 1)
        second = asyncio.create_task(client.post(url + "/v1/completions", json=body))
        await _until(client, url, "kvserve_router:queue_depth", 1)
        third = await client.post(url + "/v1/completions", json=body)
        done = await asyncio.gather(first, second)
        return [d.status_code for d in done], third.status_code


async def _until(client: httpx.AsyncClient, url: str, name: str, value: float) -> None:
    for _ in range(500):
        text = (await client.get(url + "/metrics")).text
        if f"{name} {value}" in text or f"{name} {int(value)}" in text:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{name} never reached {value}")


def test_full_queue_is_429_and_a_queue_timeout_503(sinks, router) -> None:
    sink = sinks("--token-delay", "0.2")
    r = router("--worker-urls", sink, "--max-concurrent-requests", "1", "--queue-size", "1",
               *SINK_HEALTH)  # fmt: skip
    statuses, third = asyncio.run(_hold_and_overflow(r.url))
    assert statuses == [200, 200] and third == 429
    assert router_metrics(r.url)["kvserve_router:rejected_total{reason=queue_full}"] == 1
    r2 = router("--worker-urls", sink, "--max-concurrent-requests", "1",
                "--queue-timeout-secs", "0.2", *SINK_HEALTH)  # fmt: skip

    async def overflow() -> int:
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"prompt": "x", "max_tokens": 10, "stream": True}
            held = asyncio.create_task(client.post(r2.url + "/v1/completions", json=body))
            await _until(client, r2.url, "kvserve_router:running_requests", 1)
            late = await client.post(r2.url + "/v1/completions", json=body)
            await held
            return late.status_code

    assert asyncio.run(overflow()) == 503


def test_breaker_opens_on_failures_and_closes_after_recovery(router) -> None:
    port = free_port()
    flags = ("--cb-failure-threshold", "2", "--cb-success-threshold", "1",
             "--cb-timeout-duration-secs", "3", "--health-check-interval-secs", "60")  # fmt: skip
    with running_sink("--port", str(port), "--fail-every", "1") as sink:
        r = router("--worker-urls", sink, *flags, *SINK_HEALTH)
        assert [complete(r.url).status_code for _ in range(2)] == [500, 500]
        state = f"kvserve_router:worker_breaker_state{{role=regular,worker={sink}}}"
        assert router_metrics(r.url)[state] == 1  # open
        refused = complete(r.url)
        assert refused.status_code == 503 and "no healthy worker" in refused.text
    with running_sink("--port", str(port)):  # the worker comes back, healthy
        for _ in range(400):  # half-open after 3 s: the next request is the trial
            if complete(r.url, stream=True).status_code == 200:
                break
            asyncio.run(asyncio.sleep(0.05))
        assert router_metrics(r.url)[state] == 0  # closed again
        assert complete(r.url, stream=True).status_code == 200


def test_a_stream_broken_by_the_worker_ends_with_an_error_event(sinks, router) -> None:
    r = router("--worker-urls", sinks("--break-after", "2"), *SINK_HEALTH)
    resp = complete(r.url, stream=True, max_tokens=10)
    events = sse_events(resp.text)
    assert resp.status_code == 200 and len(events) == 4
    assert json.loads(events[2])["error"]["code"] == 502 and events[3] == "[DONE]"


def test_workers_api_adds_drains_and_removes(sinks, router) -> None:
    a, b = sinks(), sinks()
    r = router("--worker-urls", a, "--policy", "round_robin", *SINK_HEALTH)
    added = httpx.post(r.url + "/workers", json={"url": b})
    assert added.status_code == 201 and added.json()["source"] == "api"
    assert httpx.post(r.url + "/workers", json={"url": "nope://x"}).status_code == 400
    assert httpx.post(r.url + "/workers", content=b"[").status_code == 400
    _wait_healthy(r.url, 2)
    for _ in range(4):
        assert complete(r.url, stream=True).status_code == 200
    counts = {w["url"]: w["requests"] for w in _workers(r.url)}
    assert counts == {a: 2, b: 2}
    assert httpx.post(r.url + "/workers", json={"url": b, "draining": True}).status_code == 200
    for _ in range(2):
        complete(r.url, stream=True)
    assert {w["url"]: w["requests"] for w in _workers(r.url)} == {a: 4, b: 2}
    assert httpx.delete(r.url + "/workers", params={"url": b}).status_code == 200
    assert httpx.delete(r.url + "/workers", params={"url": b}).status_code == 404
    assert [w["url"] for w in _workers(r.url)] == [a]


def _workers(url: str) -> list[dict]:
    return httpx.get(url + "/workers", timeout=10).json()["workers"]


def _wait_healthy(url: str, n: int, timeout_s: float = 30) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if sum(w["is_healthy"] for w in _workers(url)) == n:
            return
        asyncio.run(asyncio.sleep(0.05))
    raise AssertionError(f"not {n} healthy workers: {_workers(url)}")


def test_bad_flags_are_one_line_errors() -> None:
    for args, message in [((), "--worker-urls or --worker-file"),
                          (("--worker-urls", "x:1", "--policy", "best"), "invalid choice"),
                          (("--worker-urls", "ftp://x:1"), "not http"),
                          (("--worker-urls", "x:1", "--queue-size", "-1"), "--queue-size"),
                          (("--worker-file", "/nonexistent.json"), "cannot read")]:  # fmt: skip
        out = run_kvserve("route", *args, timeout=60)
        assert out.returncode == 2, out.stderr
        assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
