"""A model, not a measurement: the real scheduler driven over an H200's KV pool with each
step's time taken from a cost model fitted to measured H200 figures (FP8 weights, Llama-3-8B
shape), to compare running caps and admission rules on the CPU before a GPU measures them.

Step time = fixed part + KV tokens read by decode rows x a per-token cost + prompt tokens /
the prefill rate. Fitted to lowbit_decode's batch 1 and 256 at 1K (349 and 19,512 tok/s: 2.87
ms, and 40 us a row at a mean context of 1,152) and its FP8 prefill (71,229 tok/s); FP8 KV
from batch 512 at 1K (33,401 tok/s). Prefill attention, sampling and host time are left out,
and steps run one at a time (no overlap scheduling), so absolute times come out low; read the
differences between rows, then measure the chosen ones.

Workloads: ``offline`` (lowbit_decode's 1000 x 1024 random in, 1024 out, ignore_eos) and
``chat`` (prompts of 200-2,000 tokens, answers of ``--answers`` tokens (50-1,500) ending at EOS,
max_tokens unset so each may run to the 8K context).

    .venv/bin/python -m benchmarks.admission_model [--kv fp8] [--workload chat]
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from benchmarks.common import random_prompts, write_result
from kvserve.config import SchedulerConfig
from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.core.request import Request
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.core.scheduler import Scheduler
from kvserve.engine.core.scheduler_output import SchedulerOutput

PAGE = 16
CONTEXT = 8192
VOCAB = 128_256  # Llama-3's
EOS = 0


@dataclass(frozen=True)
class Costs:
    pool_tokens: int  # the H200's pool beside FP8 Llama-3-8B weights at the default fraction
    fixed_s: float  # a decode step's weight reads and launch floor
    kv_token_s: float  # per KV token a decode row reads
    prefill_token_s: float

    def step_s(self, plan: SchedulerOutput) -> float:
        t = self.fixed_s if plan.chunks else 0.0
        for c in plan.chunks:
            if c.num_new_tokens == 1:
                t += (c.start + 1) * self.kv_token_s
            else:
                t += c.num_new_tokens * self.prefill_token_s
        return t


COSTS = {
    "bf16": Costs(865_136, 2.87e-3, (13.12e-3 - 2.87e-3) / 256 / 1152, 1 / 71_229),
    "fp8": Costs(1_730_272, 2.87e-3, (15.33e-3 - 2.87e-3) / 512 / 1152, 1 / 71_229),
    # GLM-4.5-Air FP8 blocks + FP8 KV at --mem-fraction-static 0.95 (s65): every expert is read
    # from batch 64 on, so the fixed part is large; the line through batch 128 / 256 at 1K
    # (36.4 / 47.2 ms a step; batch 64's 31.5 ms comes out 31.0) and its prefill (18,813 tok/s).
    # A row's cost is part expert compute, not only KV reads: longer contexts come out a little
    # dear.
    "glm_fp8kv": Costs(
        339_584, 2 * 36.43e-3 - 47.18e-3, (47.18e-3 - 36.43e-3) / 128 / 1152, 1 / 18_813
    ),
}


def offline_requests(n: int) -> list[tuple[list[int], int, int]]:
    return [(prompt, 1024, 1024) for prompt in random_prompts(n, 1024, VOCAB, seed=0)]


def chat_requests(n: int, answers: tuple[int, int]) -> list[tuple[list[int], int, int]]:
    """(prompt, max_tokens, tokens until EOS)."""
    rng = random.Random(1)
    out = []
    for i in range(n):
        (prompt,) = random_prompts(1, rng.randint(200, 2000), VOCAB, seed=i)
        out.append((prompt, CONTEXT - len(prompt), rng.randint(*answers)))
    return out


def simulate(costs: Costs, config: SchedulerConfig, work: list[tuple[list[int], int, int]]) -> dict:
    kv = KVCacheManager(costs.pool_tokens // PAGE, PAGE, enable_prefix_cache=True)
    sched = Scheduler(config.for_pool(costs.pool_tokens), kv)
    ends = {}
    for i, (prompt, max_tokens, answer) in enumerate(work):
        params = SamplingParams(max_tokens=max_tokens)
        sched.add(Request(f"r{i}", prompt, params, 0, 0.0, max_tokens, eos_token_ids=(EOS,)))
        ends[f"r{i}"] = answer
    seconds = computed = decode_rows = decode_steps = 0.0
    while sched.has_unfinished():
        plan = sched.schedule()
        seconds += costs.step_s(plan)
        computed += sum(c.num_new_tokens for c in plan.chunks)
        rows = sum(1 for c in plan.chunks if c.num_new_tokens == 1)
        decode_rows, decode_steps = decode_rows + rows, decode_steps + (rows > 0)
        sched.update(plan, {
            c.request.request_id:
            EOS if c.request.num_output_tokens + 1 >= ends[c.request.request_id] else 7
            for c in plan.chunks if c.sample
        })  # fmt: skip
    outputs = sum(min(a, m) for _, m, a in work)
    prompts = sum(len(p) for p, _, _ in work)
    once = prompts + outputs - len(work)  # each token computed once (the last one never is)
    return {
        "max_running": sched.max_running,
        "conservativeness": config.schedule_conservativeness,
        "model_s": seconds,
        "output_tok_s": outputs / seconds,
        "preemptions": sched.counters.preemptions,
        "recomputed_share": (computed - once) / prompts,  # of the prompt tokens
        "mean_decode_batch": decode_rows / max(decode_steps, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv", choices=tuple(COSTS), default="bf16")
    ap.add_argument("--workload", choices=("offline", "chat"), default="offline")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--caps", default="256,384,512,0", help="0: the pool's (for_pool)")
    ap.add_argument("--conservativeness", default="0,1")
    ap.add_argument("--answers", default="50,1500", help="chat: answer lengths, lo,hi")
    ap.add_argument("--tag", default="cpu")
    args = ap.parse_args()
    lo, hi = (int(a) for a in args.answers.split(","))
    if args.workload == "offline":
        work = offline_requests(args.requests)
    else:
        work = chat_requests(args.requests, (lo, hi))
    rows = []
    for cap in (int(c) for c in args.caps.split(",")):
        for cons in (float(c) for c in args.conservativeness.split(",")):
            config = SchedulerConfig(max_running_requests=cap or None,
                                     schedule_conservativeness=cons)  # fmt: skip
            row = simulate(COSTS[args.kv], config, work)
            rows.append(row)
            print(f"cap {row['max_running']:4d} conservativeness {cons:g}: "
                  f"{row['output_tok_s']:7.0f} out tok/s (model) in {row['model_s']:.1f} s, "
                  f"{row['preemptions']} preemptions, {100 * row['recomputed_share']:.1f}% "
                  f"prompt recomputed, mean decode batch {row['mean_decode_batch']:.0f}",
                  flush=True)  # fmt: skip
    name = f"admission_model_{args.tag}_{args.kv}_{args.workload}"
    if args.workload == "chat":
        name += f"_{lo}-{hi}"
    payload = {"kv": args.kv, "workload": args.workload, "answers": [lo, hi], "rows": rows}
    print(f"wrote {write_result(name, payload)}")


if __name__ == "__main__":
    main()
