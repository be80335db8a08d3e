"""Workers of a PD pair that die mid-request (this file runs after the others: it kills the
package's prefill worker and its spare decode worker). The client gets an OpenAI error, never
a hang; the survivor holds no page; the router ejects the dead worker."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest

from tests.disagg.conftest import PDWorkers
from tests.router.test_router_http import _workers
from tests.server.conftest import metrics

pytestmark = [pytest.mark.timeout(1800), pytest.mark.usefixtures("kv_integrity")]
# ~2,600 tokens: a prefill long enough (six chunks on the prefill worker, seconds on a CPU) that
# the kill below lands while the prompt is in the engine; at ~500 tokens a quiet machine
# sometimes finished it between two /metrics polls and the request succeeded
LONG_PROMPT = "The river runs through the old city, past bridges and markets. " * 200


def _ejected(router_url: str, worker_url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(w["is_healthy"] for w in _workers(router_url) if w["url"] == worker_url):
            return
        time.sleep(0.1)
    raise AssertionError(f"{worker_url} still healthy: {_workers(router_url)}")


def test_decode_worker_killed_mid_stream(router, pd: PDWorkers) -> None:
    r = router("--pd-disaggregation", "--prefill", pd.prefill.url, "--decode",
               pd.spare_decode.url, "--health-check-interval-secs", "0.5")  # fmt: skip
    body = {"prompt": "Count slowly:", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", r.url + "/v1/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert "choices" in json.loads(first[6:])
        os.kill(pd.spare_decode.proc.pid, signal.SIGKILL)  # its engine exits with it
        rest = [line for line in lines if line.startswith("data: ")]
    errors = [json.loads(line[6:])["error"] for line in rest if '"error"' in line]
    assert errors and errors[-1]["code"] == 502, rest[-3:]
    _ejected(r.url, pd.spare_decode.url)
    after = httpx.post(r.url + "/v1/completions", json={"prompt": "x"}, timeout=60)
    assert after.status_code == 503 and after.json()["error"]["message"]
    # the prefill side: every page back (the autouse check), and no KV copy left behind
    assert metrics(pd.prefill.url)["kvserve:kv_cache_usage_perc"] == 0


def test_prefill_worker_killed_mid_request(router, pd: PDWorkers) -> None:
    r = router("--pd-disaggregation", "--prefill", pd.prefill.url, "--decode", pd.decode.url,
               "--health-check-interval-secs", "0.5")  # fmt: skip
    answers: list[httpx.Response] = []
    body = {"prompt": LONG_PROMPT, "max_tokens": 8}
    worker = threading.Thread(target=lambda: answers.append(
        httpx.post(r.url + "/v1/completions", json=body, timeout=120)))  # fmt: skip
    worker.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # kill it once the prompt is in its engine
        m = metrics(pd.prefill.url)
        if m["kvserve:num_requests_running"] + m["kvserve:num_requests_waiting"] > 0:
            break
        time.sleep(0.02)
    os.kill(pd.prefill.proc.pid, signal.SIGKILL)
    worker.join(120)
    assert not worker.is_alive(), "the request hung"
    resp = answers[0]
    assert resp.status_code in (502, 503), resp.text
    assert resp.json()["error"]["message"]
    _ejected(r.url, pd.prefill.url)
    after = httpx.post(r.url + "/v1/completions", json=body, timeout=60)
    assert after.status_code == 503  # no healthy pair left
    # the decode worker holds no page (the autouse check waits for it to go idle)
