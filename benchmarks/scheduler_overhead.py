"""Host cost of the scheduler's bookkeeping alone (no model): the offline workload of the GPU
roofline (1000 requests x 1024 random prompt tokens x 1024 outputs, 256 running) on the H200's
KV pool (54,071 pages of 16), driven as the engine drives it with overlap scheduling. Once the
first wave ends, every new page must come from evicting cached pages, so this is where the
prefix cache's eviction cost shows. Also timed apart: the host half of each step's model inputs
(``build_host_inputs``), the other host work that grows with the running batch.

    .venv/bin/python -m benchmarks.scheduler_overhead [--requests 1000] [--max-running 416]
        [--kv-pages 108142]   # the FP8-KV pool
"""

from __future__ import annotations

import argparse
import random
import time

from benchmarks.common import greedy, write_result
from kvserve.config import SchedulerConfig
from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.core.request import Request
from kvserve.engine.core.scheduler import Scheduler
from kvserve.engine.core.scheduler_output import SchedulerOutput
from kvserve.engine.runner.input_batch import build_host_inputs

H200_PAGES, PAGE = 54_071, 16


def make_requests(n: int, in_len: int, out_len: int) -> list[Request]:
    rng = random.Random(0)
    params = greedy(out_len)
    return [
        Request(
            f"r{i}", [rng.randrange(1000, 120_000) for _ in range(in_len)], params, 0, 0.0, out_len
        )  # fmt: skip
        for i in range(n)
    ]


def sampled(plan: SchedulerOutput) -> dict[str, int]:
    return {c.request.request_id: 7 for c in plan.chunks if c.sample}


def run(args: argparse.Namespace) -> dict:
    kv = KVCacheManager(args.kv_pages, PAGE, enable_prefix_cache=True)
    sched = Scheduler(
        SchedulerConfig(max_running_requests=args.max_running, max_num_batched_tokens=16384,
                        chunked_prefill_size=16384), kv,
    )  # fmt: skip
    for r in make_requests(args.requests, args.input_len, args.output_len):
        sched.add(r)
    in_flight, steps, window, inputs_s = None, 0, [], 0.0
    t0 = last = time.perf_counter()
    while sched.has_unfinished() or in_flight is not None:
        plan = sched.schedule()
        if in_flight is not None:
            sched.update(in_flight, sampled(in_flight))
        in_flight = None if plan.is_empty else plan
        steps += 1
        now = time.perf_counter()
        window.append(now - last)
        if not plan.is_empty:
            build_host_inputs(plan, PAGE)
        last = time.perf_counter()
        inputs_s += last - now
    total = time.perf_counter() - t0 - inputs_s
    window.sort()
    res = {"requests": args.requests, "input_len": args.input_len, "output_len": args.output_len,
           "kv_pages": args.kv_pages, "max_running": args.max_running,
           "preemptions": sched.counters.preemptions, "steps": steps, "host_s": total,
           "inputs_mean_step_ms": 1e3 * inputs_s / steps,
           "mean_step_ms": 1e3 * total / steps, "p50_step_ms": 1e3 * window[len(window) // 2],
           "p99_step_ms": 1e3 * window[int(len(window) * 0.99)],
           "max_step_ms": 1e3 * window[-1]}  # fmt: skip
    print(f"{steps} steps in {total:.1f} s: mean {res['mean_step_ms']:.2f} ms, "
          f"p50 {res['p50_step_ms']:.2f}, p99 {res['p99_step_ms']:.2f}, "
          f"max {res['max_step_ms']:.1f} ms per step; inputs {res['inputs_mean_step_ms']:.2f} "
          f"ms per step", flush=True)  # fmt: skip
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=1024)
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--kv-pages", type=int, default=H200_PAGES)
    ap.add_argument("--tag", default="cpu")
    args = ap.parse_args()
    print(f"wrote {write_result(f'scheduler_overhead_{args.tag}', run(args))}")


if __name__ == "__main__":
    main()
