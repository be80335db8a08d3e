"""The engine process dies: /health turns 503 at once, the in-flight stream gets an error
event (not a hang) and the server exits non-zero."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx

from tests.server.conftest import start_server


def test_engine_killed() -> None:
    server = start_server()
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True,
                "stream": True}  # fmt: skip
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as resp:
            lines = resp.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            os.kill(server.engine_pid(), signal.SIGKILL)
            killed = time.monotonic()
            while httpx.get(server.url + "/health", timeout=5).status_code != 503:
                assert time.monotonic() - killed < 1.0
                time.sleep(0.02)
            events = [line for line in lines if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["error"]["code"] == 503
        assert server.proc.wait(30) != 0
    finally:
        server.stop()
