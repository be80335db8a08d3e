"""A prefill/decode pair behind `kvserve route --pd-disaggregation`: greedy outputs equal a
single worker's (completions and chat, streaming and not), usage and cached_tokens are honest
end to end, and bad or unreachable KV handles fail cleanly on the decode worker."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from tests.disagg.conftest import PDWorkers
from tests.router.conftest import router_metrics
from tests.router.test_router_http import sse_events
from tests.server.conftest import wait_idle

pytestmark = [pytest.mark.timeout(1800), pytest.mark.usefixtures("kv_integrity")]
PROMPT = "The capital of France is a city that"
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]


def pd_router(router, pd: PDWorkers, *flags: str):  # noqa: ANN001, ANN201
    return router("--pd-disaggregation", "--prefill", pd.prefill.url, str(pd.bootstrap_port),
                  "--decode", pd.decode.url, "--health-check-interval-secs", "0.5",
                  *flags)  # fmt: skip


def call(url: str, path: str, body: dict) -> dict:
    """The answer's text, finish reason and usage, streamed or not."""
    resp = httpx.post(url + path, json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    chat = path.endswith("chat/completions")
    if not body.get("stream"):
        data = resp.json()
        c = data["choices"][0]
        text = c["message"]["content"] if chat else c["text"]
        return {"text": text, "finish": c["finish_reason"], "usage": data["usage"]}
    events = [json.loads(e) for e in sse_events(resp.text)[:-1]]
    assert all("error" not in e for e in events), events
    pieces = [(c["delta"].get("content") or "") if chat else c["text"]
              for e in events for c in e["choices"]]  # fmt: skip
    finish = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    return {"text": "".join(pieces), "finish": finish[-1], "usage": events[-1]["usage"]}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_pd_pair_greedy_output_equals_a_single_worker(router, pd: PDWorkers, path: str,
                                                      stream: bool) -> None:  # fmt: skip
    r = pd_router(router, pd)
    body: dict = {"max_tokens": 12, "temperature": 0, "stream": stream}
    body.update({"messages": MESSAGES} if "chat" in path else {"prompt": PROMPT})
    if stream:
        body["stream_options"] = {"include_usage": True}
    # the spare decode worker answers as a normal worker when no kv_transfer_params come
    single = call(pd.spare_decode.url, path, body)
    through_pd = call(r.url, path, body)
    assert through_pd["text"] == single["text"] and through_pd["text"]
    assert through_pd["finish"] == single["finish"]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert through_pd["usage"][key] == single["usage"][key]


def test_cached_tokens_come_from_the_prefill_side(router, pd: PDWorkers) -> None:
    r = pd_router(router, pd)
    prompt = (
        "Paris has many bridges, islands and old markets. The river divides the city into "
        "a left bank and a right bank, and the oldest bridge of them all is"
    )  # > 2 pages
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0}
    first = call(r.url, "/v1/completions", body)
    second = call(r.url, "/v1/completions", body)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second["usage"]["prompt_tokens"]
    assert cached % 16 == 0  # whole pages of the prefill worker's radix cache
    assert second["text"] == first["text"]
    assert second["usage"]["completion_tokens"] == 4


def test_prefill_worker_answers_with_a_kv_handle_and_refuses_streams(pd: PDWorkers) -> None:
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0}
    resp = httpx.post(pd.prefill.url + "/v1/completions", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    params = data["kv_transfer_params"]
    assert params["remote_port"] == pd.bootstrap_port and params["remote_backend"] == "tcp"
    assert data["usage"]["completion_tokens"] == 1
    # fetch it through a decode worker so nothing stays held
    body["kv_transfer_params"] = params
    resp = httpx.post(pd.decode.url + "/v1/completions", json=body, timeout=300)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 5
    # the same room again: already fetched, so a clean 503 from the decode worker
    again = httpx.post(pd.decode.url + "/v1/completions", json=body, timeout=300)
    assert again.status_code == 503 and "no KV held" in again.json()["error"]["message"]
    streamed = httpx.post(pd.prefill.url + "/v1/completions", json={**body, "stream": True,
                          "kv_transfer_params": None}, timeout=60)  # fmt: skip
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "stream"


def test_bad_kv_transfer_params_are_a_400(pd: PDWorkers) -> None:
    body = {"prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": {"remote_host": "x"}}
    resp = httpx.post(pd.decode.url + "/v1/completions", json=body, timeout=60)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "kv_transfer_params"


def test_decode_worker_gives_up_on_kv_that_never_comes(pd: PDWorkers) -> None:
    """A bootstrap port that accepts (its listen backlog does) and then says nothing: the
    decode worker answers 503 after its bounded wait (--disaggregation-transfer-timeout),
    holding no page."""
    silent = socket.create_server(("127.0.0.1", 0))
    params = {"remote_host": "127.0.0.1", "remote_port": silent.getsockname()[1],
              "remote_room": "never", "remote_backend": "tcp"}  # fmt: skip
    try:
        for stream in (False, True):
            body = {"prompt": PROMPT, "max_tokens": 3, "stream": stream,
                    "kv_transfer_params": params}  # fmt: skip
            resp = httpx.post(pd.decode.url + "/v1/completions", json=body, timeout=120)
            text = resp.text if stream else resp.json()["error"]["message"]
            assert (resp.status_code == 200) == stream and "timed out" in text, text
    finally:
        silent.close()
    dead_port = {**params, "remote_port": 9}  # nothing listens there: refused at once
    resp = httpx.post(pd.decode.url + "/v1/completions", json={"prompt": PROMPT,
                      "kv_transfer_params": dead_port}, timeout=60)  # fmt: skip
    assert resp.status_code == 503, resp.text


def test_a_failing_prefill_worker_is_retried_on_another_pair(router, sinks, pd: PDWorkers) -> None:
    """With retries on, a prefill worker answering 500 (a load sink) costs a retry on the
    other prefill worker, never the request: nothing had reached the client yet."""
    failing = sinks("--fail-every", "1")
    r = router("--pd-disaggregation", "--prefill", failing, "--prefill", pd.prefill.url,
               "--decode", pd.decode.url, "--health-check-endpoint", "/v1/models",
               "--retry-max-retries", "2", "--retry-initial-backoff-ms", "1")  # fmt: skip
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0}
    for _ in range(2):  # round robin puts the failing worker first once
        assert call(r.url, "/v1/completions", body)["usage"]["completion_tokens"] == 3
    assert router_metrics(r.url)["kvserve_router:retries_total"] >= 1


def test_client_hanging_up_aborts_the_decode_side(router, pd: PDWorkers) -> None:
    r = pd_router(router, pd)
    body = {"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", r.url + "/v1/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        first = next(line for line in resp.iter_lines() if line.startswith("data: "))
        assert json.loads(first[6:])["choices"]
    # closed after one chunk: the decode worker aborts (kv_integrity waits for it to go idle,
    # long before 2000 tokens could be decoded)
    assert wait_idle(pd.decode.url, timeout_s=60)["kvserve:kv_cache_usage_perc"] == 0
