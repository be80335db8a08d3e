"""A real ``kvserve serve`` subprocess on a free port, shared by the tests that need no
special flags; tests that need other flags start their own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvserve.server.demo_cli import free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Server:
    proc: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def engine_pid(self) -> int:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return int(children.split()[0])


def start_server(*flags: str, env: dict[str, str] | None = None, timeout_s: float = 300) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "kvserve.cli", "serve", "--port", str(port),
           "--log-level", "warning", *flags]  # fmt: skip
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env)
    server = Server(proc, port)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"server exited with {proc.returncode} while starting"
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.stop()
    raise AssertionError("server did not become healthy")


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
