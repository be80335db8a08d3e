"""Start and stop a `kvserve route` subprocess (tests and benchmarks): it prints
`listening on URL` on stdout once it accepts connections."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from kvserve.errors import KVServeError
from kvserve.server.launch import stop_process


@dataclass
class RouterProcess:
    proc: subprocess.Popen
    url: str

    def stop(self, timeout_s: float = 30.0) -> int:
        return stop_process(self.proc, timeout_s)

    def wait_ready(self, timeout_s: float = 120.0, headers: dict[str, str] | None = None) -> None:
        """Until /health is 200 (at least one worker routable)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if httpx.get(self.url + "/health", timeout=5, headers=headers).status_code == 200:
                return
            time.sleep(0.1)
        raise KVServeError(f"the router had no healthy worker within {timeout_s:.0f} s")


def start_router(*flags: str, cpus: Iterable[int] | None = None,
                 stderr: int | None = None) -> RouterProcess:  # fmt: skip
    """`kvserve route --port 0 <flags>`; returns once it listens (not yet once workers are up)."""
    cmd = [sys.executable, "-m", "kvserve.cli", "route", "--port", "0", "--log-level",
           "warning", *flags]  # fmt: skip
    cpu_set = set(cpus) if cpus is not None else None

    def pin() -> None:
        if cpu_set:
            os.sched_setaffinity(0, cpu_set)

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True,
                            preexec_fn=pin if cpu_set else None)  # fmt: skip
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("listening on "):
        stop_process(proc, 5)
        raise KVServeError(f"the router did not start (exit {proc.returncode}): {line!r}")
    return RouterProcess(proc, line.split()[-1])
