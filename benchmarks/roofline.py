"""kvserve on a GPU against the machine's own ceilings, measured in the same run.

    python benchmarks/roofline.py --model benchmarks/configs/llama-3-8b --parts all \
        --out-dir benchmarks/results

Parts (``--parts`` takes a comma list or ``all``):
  ceilings  device-to-device copy GB/s (bytes read + written) and bf16 matmul TFLOP/s
  decode    decode tok/s at batch 1..256 x context 1K/4K; rate = tokens between two output
            lengths over the time between them (as vLLM's figures were taken); share of the
            bytes-moved ceiling = (weights + KV read per step) / copy bandwidth
  prefill   prefill tok/s and share of the matmul ceiling for 1K/4K/16K-token prompts
  offline   1000 requests x (1024 random in, 1024 out, ignore_eos): output and total tok/s,
            and the share of a floor built from the ceilings (see ``offline_floor``)
  breakdown wall time per decode step vs the captured graph alone; top host functions
  hf        Hugging Face transformers (static cache) decode at batch 1 and 64, 1K context
Dummy (random) bf16 weights from the config alone. Writes roofline_<date>.json.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(__file__))
from ceilings import copy_bandwidth_gbs, matmul_tflops  # noqa: E402
from results_io import write_result  # noqa: E402

from kvserve.engine.config_builder import build_engine_config  # noqa: E402
from kvserve.engine.engine_core import EngineCore  # noqa: E402
from kvserve.engine.runner.kv_cache_sizing import kv_bytes_per_token  # noqa: E402
from kvserve.engine.core.request import Request  # noqa: E402
from kvserve.engine.core.sampling_params import SamplingParams  # noqa: E402

VLLM_0_26 = {"decode_b1": 202.7, "decode_b64": 8142, "decode_b256": 13726, "offline_out": 8411}


def ceilings() -> dict[str, float]:
    return {"copy_GBps": copy_bandwidth_gbs(), "bf16_matmul_TFLOPs": matmul_tflops()}


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1000, vocab - 1000, (n, length), generator=gen).tolist()


def add_decode_batch(
    core: EngineCore, batch: int, ctx: int, max_tokens: int, seed: int, min_outputs: int = 0
) -> list[Request]:
    """``batch`` greedy requests of ``ctx`` random prompt tokens (``ignore_eos``), stepped
    until each has ``min_outputs`` tokens."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    prompts = random_prompts(batch, ctx, core.model_config.vocab_size, seed)
    for i, p in enumerate(prompts):
        core.add_request(f"b{batch}-c{ctx}-s{seed}-{i}", p, params)
    reqs = list(core.requests.values())
    while min(r.num_output_tokens for r in reqs) < min_outputs:
        core.step()
    return reqs


def decode_rate(core: EngineCore, batch: int, ctx: int, out_lo: int, out_hi: int) -> dict:
    """Tokens decoded between every request having ``out_lo`` and ``out_hi`` outputs."""
    reqs = add_decode_batch(core, batch, ctx, out_hi, seed=batch * 7 + ctx)
    t_lo = None
    while core.has_unfinished():
        core.step()
        if t_lo is None and min(r.num_output_tokens for r in reqs) >= out_lo:
            torch.cuda.synchronize()
            t_lo = time.perf_counter()
    t_hi = time.perf_counter()
    assert t_lo is not None
    tokens = batch * (out_hi - out_lo)
    step_s = (t_hi - t_lo) / (out_hi - out_lo)
    return {"tok_s": tokens / (t_hi - t_lo), "step_ms": step_s * 1e3}


def weight_bytes(core: EngineCore) -> int:
    return sum(p.numel() * p.element_size() for p in core.runner.model.parameters())


def run_decode(core: EngineCore, ceil: dict, batches: list[int], ctxs: list[int]) -> list[dict]:
    rows, wbytes = [], weight_bytes(core)
    kv_tok = kv_bytes_per_token(core.model_config, core.dtype)
    capacity = core.kv.num_pages * core.kv.page_size
    for ctx in ctxs:
        for b in batches:
            lo, hi = 64, 192
            if b * (ctx + hi) > capacity:
                rows.append({"batch": b, "context": ctx, "skipped": "KV does not fit"})
                continue
            r = decode_rate(core, b, ctx, lo, hi)
            mean_ctx = ctx + (lo + hi) / 2
            bytes_step = wbytes + b * mean_ctx * kv_tok
            achieved = bytes_step / (r["step_ms"] / 1e3) / 1e9
            rows.append({"batch": b, "context": ctx, **r, "bytes_per_step": bytes_step,
                         "achieved_GBps": achieved,
                         "share_of_copy_ceiling": achieved / ceil["copy_GBps"]})  # fmt: skip
            print(f"decode b={b} ctx={ctx}: {r['tok_s']:.0f} tok/s, step {r['step_ms']:.2f} ms, "
                  f"{100 * achieved / ceil['copy_GBps']:.0f}% of copy bw", flush=True)  # fmt: skip
            core.kv.reset_prefix_cache()
    return rows


def step_breakdown(core: EngineCore, batch: int, ctx: int, steps: int = 40) -> dict:
    """Where a decode step's time goes: wall time per step, GPU time of the captured graph
    alone (replayed back to back), and the host's top Python functions per step."""
    import cProfile
    import pstats

    add_decode_batch(core, batch, ctx, 3 * steps + 64, seed=11, min_outputs=8)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        core.step()
    step_ms = (time.perf_counter() - t) / steps * 1e3
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        core.step()
    prof.disable()
    stats = pstats.Stats(prof).sort_stats("cumulative")
    top = {}
    for (file, _line, fn), (_, _, _, cum, _) in list(stats.stats.items()):
        if "kvserve" in file:
            top[f"{file.split('kvserve/')[-1]}:{fn}"] = cum / steps * 1e3
    top = dict(sorted(top.items(), key=lambda kv: -kv[1])[:15])
    graphs = core.runner.graphs
    replay_ms = None
    if graphs is not None:
        bs = next(s for s in graphs.sizes if s >= batch)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            graphs.graphs[bs].replay()
        end.record()
        torch.cuda.synchronize()
        replay_ms = start.elapsed_time(end) / steps
    while core.has_unfinished():
        core.step()
    core.kv.reset_prefix_cache()
    host_ms = step_ms - (replay_ms or 0)
    res = {"batch": batch, "context": ctx, "step_ms": step_ms, "graph_replay_ms": replay_ms,
           "host_and_sampling_ms": host_ms, "python_cumulative_ms": top}  # fmt: skip
    print(f"breakdown b={batch}: step {step_ms:.2f} ms, graph {replay_ms} ms", flush=True)
    return res


def prefill_flops(core: EngineCore, length: int) -> float:
    cfg = core.model_config
    params = sum(p.numel() for n, p in core.runner.model.named_parameters() if "embed" not in n)
    attn = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * length * length / 2
    return 2 * params * length + attn


def run_prefill(core: EngineCore, ceil: dict, lengths: list[int], budget: int) -> list[dict]:
    rows = []
    vocab = core.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    for length in lengths:
        n = max(1, budget // length)
        for warm in (True, False):
            for i, p in enumerate(random_prompts(n, length, vocab, seed=length + warm)):
                core.add_request(f"p{length}-{warm}-{i}", p, params)
            torch.cuda.synchronize()
            t = time.perf_counter()
            while core.has_unfinished():
                core.step()
            dt = time.perf_counter() - t
            core.kv.reset_prefix_cache()
        flops = n * prefill_flops(core, length)
        tflops = flops / dt / 1e12
        share = tflops / ceil["bf16_matmul_TFLOPs"]
        rows.append({"prompt_len": length, "prompts_per_step": n, "tok_s": n * length / dt,
                     "TFLOPs": tflops, "share_of_matmul_ceiling": share})  # fmt: skip
        print(f"prefill {n}x{length}: {n * length / dt:.0f} tok/s, {tflops:.0f} TFLOP/s "
              f"({100 * share:.0f}%)", flush=True)  # fmt: skip
    return rows


def offline_floor(core: EngineCore, ceil: dict, num: int, in_len: int, out_len: int) -> dict:
    """A lower bound on the offline run's time from this run's ceilings: every prompt token's
    matmul FLOPs at the matmul ceiling, every output token's matmul FLOPs at the same ceiling
    (or, when fewer rows than that share per step, one weight read per step at copy bandwidth),
    and every output token's read of its whole context's KV at copy bandwidth. Attention FLOPs
    and everything else count zero, so the bound is low."""
    scheduler = core.scheduler.config
    params = sum(p.numel() for n, p in core.runner.model.named_parameters() if "embed" not in n)
    flop_s = ceil["bf16_matmul_TFLOPs"] * 1e12
    copy_bps = ceil["copy_GBps"] * 1e9
    steps = out_len * -(-num // scheduler.max_running_requests)
    kv_tok = kv_bytes_per_token(core.model_config, core.dtype)
    context_tokens = num * (out_len * in_len + out_len * (out_len - 1) / 2)
    parts = {
        "prefill_matmul": num * in_len * 2 * params / flop_s,
        "decode_matmul": max(num * out_len * 2 * params / flop_s,
                             steps * weight_bytes(core) / copy_bps),
        "decode_kv_read": context_tokens * kv_tok / copy_bps,
    }  # fmt: skip
    return {"floor_s": sum(parts.values()), "floor_parts_s": parts}


def run_offline(core: EngineCore, ceil: dict, num: int, in_len: int, out_len: int) -> dict:
    vocab = core.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
    prompts = random_prompts(num, in_len, vocab, seed=1)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i, p in enumerate(prompts):
        core.add_request(f"o{i}", p, params)
    produced, next_report = 0, t + 15
    while core.has_unfinished():
        produced += sum(len(o.new_token_ids) for o in core.step())
        if time.perf_counter() > next_report:  # a run cut short still shows its rate
            elapsed = time.perf_counter() - t
            print(f"offline: {produced} tokens in {elapsed:.0f} s", flush=True)
            next_report += 15
    wall = time.perf_counter() - t
    assert produced == num * out_len
    res = {"requests": num, "input_len": in_len, "output_len": out_len, "wall_s": wall,
           "output_tok_s": produced / wall, "total_tok_s": (produced + num * in_len) / wall,
           "preemptions": core.scheduler.counters.preemptions,
           **offline_floor(core, ceil, num, in_len, out_len)}  # fmt: skip
    res["share_of_floor"] = res["floor_s"] / wall
    print(f"offline: {res['output_tok_s']:.0f} output tok/s in {wall:.1f} s, floor "
          f"{res['floor_s']:.1f} s ({100 * res['share_of_floor']:.0f}%)", flush=True)  # fmt: skip
    return res


def run_hf(model_dir: str, batches: list[int], ctx: int, compile_forward: bool) -> list[dict]:
    """transformers' generate with a static cache. With a static cache transformers compiles
    the forward by itself, which takes minutes per batch size on an 8B model; that is off
    unless ``compile_forward`` (``--hf-compile``)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    rows = []
    for b in batches:
        ids = torch.tensor(random_prompts(b, ctx, config.vocab_size, seed=3), device="cuda")
        times = {}
        for n in (32, 96):
            kwargs = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          cache_implementation="static", pad_token_id=0,
                          disable_compile=not compile_forward)  # fmt: skip
            with torch.no_grad():
                model.generate(ids, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})
                torch.cuda.synchronize()
                t = time.perf_counter()
                model.generate(ids, **kwargs)
                torch.cuda.synchronize()
            times[n] = time.perf_counter() - t
        rate = b * 64 / (times[96] - times[32])
        rows.append({"batch": b, "context": ctx, "tok_s": rate, "compiled": compile_forward})
        print(f"transformers b={b}: {rate:.0f} tok/s", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="benchmarks/configs/llama-3-8b")
    ap.add_argument("--parts", default="all")
    ap.add_argument("--batches", default="1,8,32,64,128,256")
    ap.add_argument("--contexts", default="1024,4096")
    ap.add_argument("--prefill-lengths", default="1024,4096,16384")
    ap.add_argument("--offline-requests", type=int, default=1000)
    ap.add_argument("--max-running", type=int, default=256, help="most requests in one step")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--tag", default="h200")
    ap.add_argument("--hf-compile", action="store_true", help="let transformers compile")
    args = ap.parse_args()
    parts = {"ceilings", "decode", "prefill", "breakdown", "offline", "hf"}
    parts = parts if args.parts == "all" else set(args.parts.split(","))
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    result: dict[str, Any] = {"model": args.model, "dtype": "bfloat16", "weights": "dummy",
                              "vllm_0_26_same_h200": VLLM_0_26}  # fmt: skip
    out_dir = None if args.out_dir is None else Path(args.out_dir)

    def save() -> None:  # after every part, so a run cut short keeps what it measured
        print(f"wrote {write_result(f'roofline_{args.tag}', result, out_dir)}", flush=True)

    ceil = ceilings()
    result["ceilings"] = ceil
    print(f"ceilings: {ceil}", flush=True)
    if parts & {"decode", "prefill", "breakdown", "offline"}:
        budget = 16384
        t = time.perf_counter()
        core = EngineCore(build_engine_config(
            args.model, load_format="dummy", device="cuda", dtype="bfloat16",
            max_num_batched_tokens=budget, chunked_prefill_size=budget,
            max_running_requests=args.max_running,
            context_length=32768,  # the 16K prefill point exceeds the config's 8K
        ))  # fmt: skip
        result["engine"] = {"startup_s": time.perf_counter() - t, "kv_pages": core.kv.num_pages,
                            "kv_tokens": core.kv.num_pages * core.kv.page_size,
                            "weights_GB": weight_bytes(core) / 1e9}  # fmt: skip
        print(f"engine: {result['engine']}", flush=True)
        if "prefill" in parts:
            result["prefill"] = run_prefill(core, ceil, ints(args.prefill_lengths), budget)
            save()
        if "decode" in parts:
            result["decode"] = run_decode(core, ceil, ints(args.batches), ints(args.contexts))
            save()
        if "breakdown" in parts:
            result["breakdown"] = [step_breakdown(core, b, 1024) for b in (1, 64, 256)]
            save()
        if "offline" in parts:
            result["offline"] = run_offline(core, ceil, args.offline_requests, 1024, 1024)
            save()
        del core
        gc.collect()
        torch.cuda.empty_cache()
    if "hf" in parts:
        result["transformers"] = run_hf(args.model, [1, 64], 1024, args.hf_compile)
        save()


if __name__ == "__main__":
    main()
