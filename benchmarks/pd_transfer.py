"""The KV transfer seam alone: one process, a bootstrap server and a fetching client on
loopback, for each backend that runs here and a few transfer sizes. Seconds per transfer
(median of --repeats, connection and handshake included, as a decode worker pays them) and
GB/s, against a plain host memory copy of the same bytes. The receiving side stages pages in a
``HostStaging`` pool of --staging-gb, as a decode worker does (0: a fresh buffer per transfer).
--engine-busy runs a pure-Python thread alongside (a busy engine thread holding the GIL, as in a
worker process). The load average before and after goes in the JSON: the box may be shared.

    python -m benchmarks.pd_transfer [--sizes-mb 1,64,256] [--repeats 5] [--engine-busy]
Writes benchmarks/results/pd_transfer_<date>.json (or under --out-dir).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import torch

from benchmarks.common import write_result
from kvserve.disagg.blob import KVHeader, PrefilledKV
from kvserve.disagg.bootstrap import BootstrapServer, fetch
from kvserve.disagg.staging import HostStaging
from kvserve.disagg.store import HeldKV
from kvserve.disagg.transfer import BACKENDS, make_transport, probe
from kvserve.server.launch import free_port


def _blob(room: str, size_mb: int) -> PrefilledKV:
    pages = torch.randn(size_mb * (1 << 20) // 4)
    header = KVHeader(room=room, prompt_token_ids=[0], first_token_id=0, first_logprob=None,
                      num_cached_tokens=0, dtype="float32", shape=[pages.numel()],
                      k_scales=[], v_scales=[], nbytes=pages.numel() * 4)  # fmt: skip
    return PrefilledKV(header, pages)


def measure(backend: str, size_mb: int, repeats: int, staging_gb: float) -> dict:
    held, port = HeldKV(60.0), free_port()
    server = BootstrapServer("127.0.0.1", port, held, make_transport(backend), 60.0)
    client = make_transport(backend, HostStaging(int(staging_gb * 2**30), pin=False))
    seconds = []
    try:
        for i in range(repeats + 1):  # the first one warms the connection path up
            blob = _blob(f"r{i}", size_mb)
            server.put(blob)
            started = time.perf_counter()
            got = fetch("127.0.0.1", port, f"r{i}", client, 60.0)
            if i:
                seconds.append(time.perf_counter() - started)
            assert torch.equal(got.pages, blob.pages)
            got.release()
    finally:
        server.close()
    s = statistics.median(seconds)
    return {"size_mb": size_mb, "median_s": s, "gb_per_s": size_mb * (1 << 20) / s / 1e9,
            "seconds": seconds}  # fmt: skip


def busy_engine(stop: threading.Event) -> None:
    """Pure Python, as an engine loop between its kernels: holds the GIL until preempted."""
    x = 0
    while not stop.is_set():
        for i in range(10000):
            x += i


def memcpy_gb_per_s(size_mb: int) -> float:
    x = torch.randn(size_mb * (1 << 20) // 4)
    y = torch.empty_like(x)
    y.copy_(x)
    started = time.perf_counter()
    y.copy_(x)
    return x.numel() * 4 / (time.perf_counter() - started) / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pd_transfer")
    ap.add_argument("--sizes-mb", default="1,64,256")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--staging-gb", type=float, default=8.0)
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--engine-busy", action="store_true", help="a GIL-holding thread alongside")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    rows, skipped = {}, {}
    load_before, stop = os.getloadavg(), threading.Event()
    if args.engine_busy:
        threading.Thread(target=busy_engine, args=(stop,), daemon=True).start()
    for backend in args.backends.split(","):
        why = probe(backend)
        if why is not None:
            skipped[backend] = why
            continue
        rows[backend] = [measure(backend, size, args.repeats, args.staging_gb) for size in sizes]
        print(backend, rows[backend], flush=True)
    stop.set()
    payload = {"backends": rows, "skipped": skipped, "staging_gb": args.staging_gb,
               "engine_busy": args.engine_busy, "cpu_count": os.cpu_count(),
               "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
               "memcpy_gb_per_s": {s: memcpy_gb_per_s(s) for s in sizes}}  # fmt: skip
    print(f"wrote {write_result('pd_transfer', payload, args.out_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
