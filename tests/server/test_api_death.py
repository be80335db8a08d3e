"""The API process is killed (SIGKILL, as the OOM killer does) under load: its clients see a
closed connection, not a hang; the engine process exits on its own (parent-death signal and
pid poll) and removes the socket folder; a stale folder of an earlier dead server is removed
at the next start."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from tests.server.conftest import metrics, start_server


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie has exited; its new parent may not reap it


def _stream(url: str) -> str:
    body = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    lines = []
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as resp:
            lines.extend(resp.iter_lines())
    except httpx.TransportError as exc:
        return f"closed: {type(exc).__name__}"
    return "completed" if "data: [DONE]" in lines else "cut short"


def test_api_killed_under_load(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"kvserve-{dead.pid}-stale"
    stale.mkdir()
    (stale / "in").touch()
    server = start_server(env={"TMPDIR": str(tmp_path)})
    engine = server.engine_pid()
    try:
        assert not stale.exists(), "a stale socket folder survived the next start"
        with cf.ThreadPoolExecutor(4) as pool:
            clients = [pool.submit(_stream, server.url) for _ in range(4)]
            deadline = time.monotonic() + 120
            while metrics(server.url)["kvserve:num_requests_running"] < 4:
                assert time.monotonic() < deadline, "the load never got running"
                time.sleep(0.1)
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait(30)
            seen = [f.result(timeout=60) for f in clients]
        assert all(s.startswith("closed") or s == "cut short" for s in seen), seen
        deadline = time.monotonic() + 30
        while not _gone(engine):
            assert time.monotonic() < deadline, "the engine outlived its API process"
            time.sleep(0.05)
        assert not list(tmp_path.glob("kvserve-*")), "socket folder left behind"
    finally:
        server.stop()
        if not _gone(engine):
            os.kill(engine, signal.SIGKILL)
