"""The KV transfer seam alone: one process, a bootstrap server and a fetching client on
loopback, for each backend that runs here and a few transfer sizes. Seconds per transfer
(median of --repeats, connection and handshake included, as a decode worker pays them) and
GB/s, against a plain host memory copy of the same bytes.

    python -m benchmarks.pd_transfer [--sizes-mb 1,64,256] [--repeats 5]
Writes benchmarks/results/pd_transfer_<date>.json (or under --out-dir).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from benchmarks.common import write_result
from kvserve.disagg.blob import KVHeader, PrefilledKV
from kvserve.disagg.bootstrap import BootstrapServer, fetch
from kvserve.disagg.store import HeldKV
from kvserve.disagg.transfer import BACKENDS, make_transport, probe
from kvserve.server.launch import free_port


def _blob(room: str, size_mb: int) -> PrefilledKV:
    pages = torch.randn(size_mb * (1 << 20) // 4)
    header = KVHeader(room=room, prompt_token_ids=[0], first_token_id=0, first_logprob=None,
                      num_cached_tokens=0, dtype="float32", shape=[pages.numel()],
                      k_scales=[], v_scales=[], nbytes=pages.numel() * 4)  # fmt: skip
    return PrefilledKV(header, pages)


def measure(backend: str, size_mb: int, repeats: int) -> dict[str, float]:
    held, port = HeldKV(60.0), free_port()
    server = BootstrapServer("127.0.0.1", port, held, make_transport(backend), 60.0)
    client = make_transport(backend)
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
    finally:
        server.close()
    s = statistics.median(seconds)
    return {"size_mb": size_mb, "median_s": s, "gb_per_s": size_mb * (1 << 20) / s / 1e9}


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
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    rows, skipped = {}, {}
    for backend in BACKENDS:
        why = probe(backend)
        if why is not None:
            skipped[backend] = why
            continue
        rows[backend] = [measure(backend, size, args.repeats) for size in sizes]
        print(backend, rows[backend], flush=True)
    payload = {"backends": rows, "skipped": skipped,
               "memcpy_gb_per_s": {s: memcpy_gb_per_s(s) for s in sizes}}  # fmt: skip
    print(f"wrote {write_result('pd_transfer', payload, args.out_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
