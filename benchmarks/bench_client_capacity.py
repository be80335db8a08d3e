"""How much load the bench client sustains on one core, and the timing error it adds.

The client (this process, pinned to one core) runs against the load sink (kvserve/bench/
load_sink.py, another process on another core when there is one), which answers instantly:
- capacity: requests/s and content chunks/s at rising concurrency (random profile, short prompts);
- timing error: the sink logs each chunk's send time on the system-wide monotonic clock; the
  client's recorded arrival minus that is the delay the client adds (network stack included).
Writes benchmarks/results/bench_client_capacity_<date>.json.

    .venv/bin/python -m benchmarks.bench_client_capacity
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import write_result
from kvserve.bench import metrics, tokens
from kvserve.bench.client import Target
from kvserve.bench.load_sink import running_sink
from kvserve.bench.profiles import WorkloadConfig, make_units
from kvserve.bench.runner import LoadConfig, run


def _pin() -> str:
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[0]})
    return f"client on core {cores[0]} of {len(cores)}"


def capacity(url: str, concurrency: int, output_len: int, n: int) -> dict:
    tok = tokens.load(None)
    units = make_units(WorkloadConfig("random", seed=0, input_len=64, output_len=output_len), tok)
    load = LoadConfig(max_concurrency=concurrency, num_requests=n, quiet=True)
    t = time.perf_counter()
    out = run(units, Target(url), tok, load, open_loop=False)
    wall = time.perf_counter() - t
    r = metrics.compute(out.records)
    chunks = sum(len(rec.chunk_times) for rec in out.records)
    return {"concurrency": concurrency, "output_len": output_len, "requests": n,
            "failed": r["failed"], "requests_per_s": r["request_throughput"],
            "chunks_per_s": chunks / r["duration"], "wall_s": wall}  # fmt: skip


def timing_error(concurrency: int, delay_s: float = 0.005, n: int = 200) -> dict:
    """Client-recorded chunk arrival minus the sink's send time, per chunk."""
    log = Path(tempfile.mkdtemp()) / "sent.jsonl"
    tok = tokens.load(None)
    with running_sink("--log", str(log), "--token-delay", str(delay_s)) as url:
        units = make_units(WorkloadConfig("random", seed=0, input_len=64, output_len=20), tok)
        load = LoadConfig(max_concurrency=concurrency, num_requests=n, quiet=True)
        out = run(units, Target(url), tok, load, open_loop=False)
    sent = {}
    for line in log.read_text().splitlines():
        row = json.loads(line)
        sent[row["tag"]] = row["sent"]
    errors = []
    for rec in out.records:  # random-profile prompts carry "request <index>:" = record order
        for arrival, t_sent in zip(rec.chunk_times, sent.get(rec.request_id, []), strict=False):
            errors.append((out.clock_origin + arrival - t_sent) * 1e6)
    arr = np.asarray(errors)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    added = {"median": float(p50), "p90": float(p90), "p99": float(p99), "max": float(arr.max())}
    return {"concurrency": concurrency, "token_delay_s": delay_s, "chunks": int(arr.size),
            "added_error_us": added}  # fmt: skip


def main() -> None:
    where = _pin()
    with running_sink() as url:
        cap = [capacity(url, c, 1, 2000) for c in (1, 16, 64)]
        cap += [capacity(url, c, 256, 200) for c in (16, 64)]
    err = [timing_error(c) for c in (1, 16, 64)]
    result = {"device": f"{where}; sink in a separate process",
              "client": "httpx AsyncClient, HTTP/1.1 keep-alive, SSE over aiter_raw",
              "capacity": cap, "timing_error": err}  # fmt: skip
    path = write_result("bench_client_capacity", result)
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
