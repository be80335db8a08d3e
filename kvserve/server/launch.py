"""Start and stop a ``kvserve serve`` subprocess: one helper for the demo, the tests and the
benchmarks, so that each does not keep its own copy of the port, health-wait and stop logic."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from kvserve.errors import KVServeError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (the server drains), then SIGKILL after ``timeout_s``; the exit code."""
        return stop_process(self.proc, timeout_s)

    def wait_healthy(self, timeout_s: float = 300.0) -> str:
        wait_healthy(self.url, self.proc, timeout_s)
        return self.url

    def engine_pid(self) -> int:
        """The engine-core child of the API process (Linux)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return int(children.split()[0])


def stop_process(proc: subprocess.Popen, timeout_s: float = 60.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise KVServeError(f"the server exited with code {proc.returncode} while starting")
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise KVServeError(f"the server did not become healthy within {timeout_s:.0f} s")


def launch_server(
    *flags: str,
    env: dict[str, str] | None = None,
    port: int | None = None,
    log_level: str = "warning",
    cwd: str | Path | None = None,
    stderr: IO[str] | None = None,
) -> ServerProcess:
    """``kvserve serve --port P <flags>`` in a subprocess, returned at once (not yet healthy);
    its log goes to ``stderr`` when given."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "kvserve.cli", "serve", "--port", str(port),
           "--log-level", log_level, *flags]  # fmt: skip
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return ServerProcess(subprocess.Popen(cmd, env=full_env, cwd=cwd, stderr=stderr), port)


def start_server(*flags: str, timeout_s: float = 300.0, **launch_kwargs: object) -> ServerProcess:
    """``launch_server`` and wait until ``/health`` is 200; stops it and raises if it exits
    or does not become healthy in time."""
    server = launch_server(*flags, **launch_kwargs)  # type: ignore[arg-type]
    try:
        server.wait_healthy(timeout_s)
    except BaseException:
        server.stop()
        raise
    return server
