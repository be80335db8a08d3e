"""Tensor parallelism: TP1 against TP2 decode in the same run, on dummy bf16 weights.

    python -m benchmarks.tp_decode --batches 1,64,256 --offline 1000 --big-model
    python -m benchmarks.tp_decode --quick        # b1 and b64 only, no offline, no 70B

Needs 2 GPUs (TP2's rank 1 on cuda:1). Per TP size: decode tok/s at each batch at 1K context
(benchmarks/roofline.py's method: tokens between output lengths 64 and 192) with the
weight-bytes ceiling of one rank (its weight shard + its KV heads, read once per step at the
measured copy bandwidth), the all-reduce time per decode step from a torch.profiler trace of
rank 0 (NCCL kernels' device time / steps), and optionally offline 1000 x (1024 in, 1024 out)
with roofline.py's floor. ``--big-model``: Llama-3-70B's shape (does not fit one GPU) at TP2,
batch 1 against its ceiling. Writes tp_decode_<tag>_<date>.json.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from benchmarks.common import (
    LLAMA_8B,
    add_decode_batch,
    build_engine,
    gpu_ceilings,
    release_memory,
    reset_prefix_cache,
    weight_bytes,
    write_result,
)
from benchmarks.roofline import run_decode, run_offline
from kvserve.engine.engine_core import EngineCore

LLAMA_70B = "benchmarks/configs/llama-3-70b"


def allreduce_ms_per_step(core: EngineCore, batch: int, ctx: int = 1024, steps: int = 20) -> dict:
    """Device time of rank 0's NCCL kernels per decode step, and of all kernels, from a trace
    of ``steps`` decode steps at ``batch``."""
    from torch.profiler import ProfilerActivity, profile

    add_decode_batch(core, batch, ctx, max_tokens=steps + 40, seed=99, min_outputs=8)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            core.step()
        torch.cuda.synchronize()
    while core.has_unfinished():
        core.step()
    reset_prefix_cache(core)
    nccl = total = 0.0
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", 0.0) or getattr(ev, "cuda_time_total", 0.0)
        total += t
        if "nccl" in ev.key.lower():
            nccl += t
    return {"batch": batch, "steps": steps, "allreduce_ms_per_step": nccl / steps / 1e3,
            "kernel_ms_per_step": total / steps / 1e3}  # fmt: skip


def run_tp(model: str, tp: int, args: argparse.Namespace, ceil: dict, batches: list[int]) -> dict:
    core = build_engine(model, tp=tp, max_running_requests=args.max_running)
    try:
        wbytes = weight_bytes(core)  # rank 0's shard
        rows = run_decode(core, ceil, batches, [args.context])
        for r in rows:
            if "tok_s" in r:
                r["ceiling_tok_s"] = r["batch"] * ceil["copy_GBps"] * 1e9 / r["bytes_per_step"]
                r["share_of_ceiling"] = r["tok_s"] / r["ceiling_tok_s"]
        out: dict[str, Any] = {"tp": tp, "weight_bytes_per_rank": wbytes, "decode": rows}
        if tp > 1:
            out["allreduce"] = [allreduce_ms_per_step(core, b) for b in (1, 64)]
            print(f"tp{tp} all-reduce: {out['allreduce']}", flush=True)
        if args.offline:
            out["offline"] = run_offline(core, ceil, args.offline, 1024, 1024)
        return out
    finally:
        core.close()
        del core
        release_memory()


def ratios(one: dict, two: dict) -> list[dict]:
    rows = []
    for a, b in zip(one["decode"], two["decode"]):
        if "tok_s" in a and "tok_s" in b:
            rows.append({"batch": a["batch"], "speedup": b["tok_s"] / a["tok_s"],
                         "ceiling_ratio": b["ceiling_tok_s"] / a["ceiling_tok_s"]})  # fmt: skip
    if "offline" in one and "offline" in two:
        speedup = two["offline"]["output_tok_s"] / one["offline"]["output_tok_s"]
        rows.append({"offline": True, "speedup": speedup})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=LLAMA_8B)
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--max-running", type=int, default=None,
                    help="the running cap (default: the engine's, from its KV pool)")  # fmt: skip
    ap.add_argument("--offline", type=int, default=0, help="offline requests (0: skip)")
    ap.add_argument("--big-model", action="store_true", help="also Llama-3-70B shape, TP2 b1")
    ap.add_argument("--quick", action="store_true", help="b1 and b64, no offline, no 70B")
    ap.add_argument("--tag", default="h200x2")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit("tp_decode needs 2 GPUs")
    if args.quick:
        args.batches, args.offline, args.big_model = "1,64", 0, False
    batches = [int(b) for b in args.batches.split(",")]
    ceil = gpu_ceilings()
    result: dict[str, Any] = {"model": args.model, "weights": "dummy", "context": args.context,
                              "ceilings": ceil}  # fmt: skip
    print(f"ceilings: {ceil}", flush=True)
    for tp in (1, 2):
        result[f"tp{tp}"] = run_tp(args.model, tp, args, ceil, batches)
        write_result(f"tp_decode_{args.tag}", result, args.out_dir)
    result["tp2_vs_tp1"] = ratios(result["tp1"], result["tp2"])
    print(f"TP2 / TP1: {result['tp2_vs_tp1']}", flush=True)
    if args.big_model:
        big = argparse.Namespace(**{**vars(args), "offline": 0})
        result["llama70b_tp2"] = run_tp(LLAMA_70B, 2, big, ceil, [1])
    path = write_result(f"tp_decode_{args.tag}", result, args.out_dir)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
