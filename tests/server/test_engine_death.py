"""Engine faults under load, through a real server: a stalled engine turns /health 503 and
back; a killed engine turns /health 503 at once, every open stream gets a 503 error event (not
a hang), every waiting non-streaming request a 503, and the server exits 1 leaving no socket
folder behind."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import Server, assert_invariants, metrics, start_server

LONG = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True}


@pytest.fixture(scope="module")
def tmpdir_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sockets")


@pytest.fixture(scope="module")
def fragile(tmpdir_env: Path) -> Iterator[Server]:
    s = start_server("--engine-stall-timeout", "2", env={"TMPDIR": str(tmpdir_env)})
    yield s
    s.stop()


def _wait_health(url: str, status: int, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        resp = httpx.get(url + "/health", timeout=10)
        if resp.status_code == status:
            return resp.json() if resp.content else {}
        assert time.monotonic() < deadline, f"/health stayed {resp.status_code}"
        time.sleep(0.1)


def test_stalled_engine_fails_health_then_recovers(fragile: Server) -> None:
    engine = fragile.engine_pid()
    os.kill(engine, signal.SIGSTOP)
    try:
        err = _wait_health(fragile.url, 503)["error"]
        assert "stuck" in err["message"] and err["code"] == 503
    finally:
        os.kill(engine, signal.SIGCONT)
    _wait_health(fragile.url, 200)
    assert_invariants(fragile.url)


def _stream(url: str) -> list[str]:
    with httpx.stream("POST", url + "/v1/completions", json={**LONG, "stream": True},
                      timeout=120) as resp:  # fmt: skip
        return [line for line in resp.iter_lines() if line.startswith("data: ")]


def test_engine_killed_under_load(fragile: Server, tmpdir_env: Path) -> None:
    assert list(tmpdir_env.glob("kvserve-*")), "the server keeps its sockets in TMPDIR"
    with cf.ThreadPoolExecutor(6) as pool:
        streams = [pool.submit(_stream, fragile.url) for _ in range(3)]
        plain = [pool.submit(httpx.post, fragile.url + "/v1/completions", json=LONG,
                             timeout=120) for _ in range(3)]  # fmt: skip
        deadline = time.monotonic() + 120
        while metrics(fragile.url)["kvserve:num_requests_running"] < 6:
            assert time.monotonic() < deadline, "the load never got running"
            time.sleep(0.1)
        os.kill(fragile.engine_pid(), signal.SIGKILL)
        killed = time.monotonic()
        while httpx.get(fragile.url + "/health", timeout=5).status_code != 503:
            assert time.monotonic() - killed < 5.0
            time.sleep(0.02)
        for f in streams:
            events = f.result(timeout=60)
            assert events[-1] == "data: [DONE]"
            assert json.loads(events[-2][6:])["error"]["code"] == 503
        for f in plain:
            resp = f.result(timeout=60)
            assert resp.status_code == 503 and resp.json()["error"]["code"] == 503
    assert fragile.proc.wait(30) == 1
    assert not list(tmpdir_env.glob("kvserve-*")), "socket folder left behind"
