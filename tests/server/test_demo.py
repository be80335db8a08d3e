"""`kvserve demo` end to end with a short load: server up, mixed load, result block, sample
answer, clean shutdown."""

from __future__ import annotations

import os

from cli_runner import run_kvserve

from tests.server.conftest import ROOT


def test_demo_short(tmp_path) -> None:
    proc = run_kvserve(
        "demo", "--num-requests", "4", "--concurrency", "2", "--answer-tokens", "8",
        cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for expected in ("Serving Benchmark Result", "Successful requests:", "TTFT", "TPOT",
                     "Cache hit rate", "Sample answer", "server stopped cleanly"):  # fmt: skip
        assert expected in out, out
