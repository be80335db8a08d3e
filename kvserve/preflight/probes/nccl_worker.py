"""A short NCCL all-reduce over every visible GPU, one process per GPU.

Run by ``probes/nccl.py`` in a subprocess with ``NCCL_DEBUG=INFO``; rank 0 prints one line
``KVSERVE_NCCL_RESULT {json}`` with the timing. The NCCL log itself goes to stdout/stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

RESULT_TAG = "KVSERVE_NCCL_RESULT"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, world: int, port: int, size_bytes: int, iters: int) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    check = torch.full((1024,), float(rank + 1), device="cuda")
    dist.all_reduce(check)
    correct = bool((check == world * (world + 1) / 2).all().item())
    data = torch.zeros(size_bytes // 4, dtype=torch.float32, device="cuda")
    for _ in range(3):
        dist.all_reduce(data)
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(data)
    torch.cuda.synchronize()
    elapsed = (time.perf_counter() - start) / iters
    if rank == 0:
        result = {"ranks": world, "correct": correct, "size_bytes": size_bytes, "time_s": elapsed}
        print(f"{RESULT_TAG} {json.dumps(result)}", flush=True)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    import torch
    import torch.multiprocessing as mp

    world = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if world == 0:
        print("no CUDA GPU visible to torch", file=sys.stderr)
        return 3
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp.spawn(_rank, args=(world, _free_port(), args.size_mb * 2**20, args.iters), nprocs=world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
