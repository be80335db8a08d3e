"""The scheduler alone (no model, no GPU) on the 32 x 32K x 256 run with an H200-sized KV pool:
how many preemptions, and how many prompt tokens it computes for the 1.05M it must.

32 x 32K tokens of Llama-3.1-8B bf16 KV is 137 GB, more than an H200 holds beside the weights
(the pool is about 860K-900K tokens), so the run cannot keep every prompt resident. Each step
plays the runner's part with a fixed sampled token.

    python -m benchmarks.long_prompt_admission --out-dir benchmarks/results
"""

from __future__ import annotations

import argparse
import random
import time

from benchmarks.common import write_result
from kvserve.config import SchedulerConfig
from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.core.request import Request
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.core.scheduler import Scheduler

PAGE = 16


def run(pool_tokens: int, n: int, prompt: int, out: int) -> dict:
    kv = KVCacheManager(pool_tokens // PAGE, PAGE, enable_prefix_cache=False)
    sched = Scheduler(SchedulerConfig(), kv)  # the engine's defaults: 8192 budget, 2K chunks
    rng = random.Random(0)
    for i in range(n):
        ids = [rng.randrange(1000, 100000) for _ in range(prompt)]
        params = SamplingParams(max_tokens=out, ignore_eos=True)
        sched.add(Request(f"r{i}", ids, params, seed=0, arrival_time=0.0, max_tokens=out,
                          eos_token_ids=(0,)))  # fmt: skip
    steps = prompt_rows = 0
    t = time.perf_counter()
    while sched.has_unfinished():
        plan = sched.schedule()
        prompt_rows += sum(c.num_new_tokens for c in plan.chunks if c.num_new_tokens > 1)
        sched.update(plan, {c.request.request_id: 9 for c in plan.chunks if c.sample})
        steps += 1
    row = {"pool_tokens": pool_tokens, "steps": steps, "preemptions": sched.counters.preemptions,
           "prompt_tokens_computed": prompt_rows, "prompt_tokens_needed": n * prompt,
           "host_s": time.perf_counter() - t}  # fmt: skip
    print(row, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pools", default="860000,900000,1100000", help="pool sizes in tokens")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    rows = [run(int(p), 32, 32768, 256) for p in args.pools.split(",")]
    write_result("long_prompt_admission_cpu", {"requests": 32, "prompt": 32768, "output": 256,
                                               "rows": rows}, args.out_dir)  # fmt: skip


if __name__ == "__main__":
    main()
