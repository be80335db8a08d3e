"""kvserve on a GPU against the machine's own ceilings, measured in the same run.

    python -m benchmarks.roofline --model benchmarks/configs/llama-3-8b --parts all \
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
  longctx   attention at long context (one layer): decode at 32K x 32 and 128K x 8 against the
            bytes ceiling, prefill of 32K and of a 16K chunk ending a 128K prompt against the
            matmul ceiling; the engine at 32K-128K is benchmarks/long_context.py
Dummy (random) bf16 weights from the config alone. Writes roofline_<date>.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from benchmarks.common import (
    LLAMA_8B,
    add_decode_batch,
    allow_longer_context,
    build_engine,
    decode_graphs,
    decode_rate,
    drain,
    gpu_ceilings,
    greedy,
    kv_bytes_per_token,
    kv_capacity_tokens,
    kv_pages,
    matmul_params,
    max_running_requests,
    preemptions,
    prefill_flops,
    prefill_matmul_flops,
    random_prompts,
    release_memory,
    reset_prefix_cache,
    step_weight_bytes,
    timed_after_warmup,
    weight_bytes,
    write_result,
)
from kvserve.engine.engine_core import EngineCore

VLLM_0_26 = {"decode_b1": 202.7, "decode_b64": 8142, "decode_b256": 13726, "offline_out": 8411}


def run_decode(core: EngineCore, ceil: dict, batches: list[int], ctxs: list[int]) -> list[dict]:
    rows, wbytes, kv_tok = [], step_weight_bytes(core), kv_bytes_per_token(core)
    for ctx in ctxs:
        for b in batches:
            lo, hi = 64, 192
            if b * (ctx + hi) > kv_capacity_tokens(core):
                rows.append({"batch": b, "context": ctx, "skipped": "KV does not fit"})
                continue
            if b > max_running_requests(core):
                rows.append({"batch": b, "context": ctx, "skipped": "over the running cap"})
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
    return rows


def host_profile_ms(core: EngineCore, steps: int) -> dict[str, float]:
    """The top kvserve Python functions by cumulative host time per step (cProfile)."""
    import cProfile
    import pstats

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
    return dict(sorted(top.items(), key=lambda kv: -kv[1])[:15])


def step_breakdown(core: EngineCore, batch: int, ctx: int, steps: int = 40) -> dict:
    """Where a decode step's time goes: wall time per step, GPU time of the captured graph
    alone (replayed back to back), and the host's top Python functions per step."""
    add_decode_batch(core, batch, ctx, 3 * steps + 64, seed=11, min_outputs=8)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        core.step()
    step_ms = (time.perf_counter() - t) / steps * 1e3
    top = host_profile_ms(core, steps)
    graphs = decode_graphs(core)
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
    drain(core)
    reset_prefix_cache(core)
    host_ms = step_ms - (replay_ms or 0)
    res = {"batch": batch, "context": ctx, "step_ms": step_ms, "graph_replay_ms": replay_ms,
           "host_and_sampling_ms": host_ms, "python_cumulative_ms": top}  # fmt: skip
    print(f"breakdown b={batch}: step {step_ms:.2f} ms, graph {replay_ms} ms", flush=True)
    return res


def run_prefill(
    core: EngineCore, ceil: dict, lengths: list[int], matmul_tflops: float | None = None,
    repeats: int = 3,
) -> list[dict]:  # fmt: skip
    """Prefill of ``lengths``-token prompts, as many a step as the engine's token budget takes;
    its share of ``matmul_tflops`` (bf16's ceiling by default). After one warm-up the step is
    timed ``repeats`` times and the median reported, with every sample: one step's time varied
    by up to 14% within a run on the H200 (moe_decode_h200_s37_qwen_ab_tuned0_2026-12-02.json)."""
    budget = core.config.scheduler.max_num_batched_tokens
    rows = []
    vocab = core.model_config.vocab_size
    for length in lengths:
        n = max(1, budget // length)
        times = [_prefill_step_s(core, n, length, vocab, seed) for seed in range(repeats + 1)]
        dt = statistics.median(times[1:])  # the first is the warm-up
        flops = n * prefill_flops(core, length)
        tflops = flops / dt / 1e12
        share = tflops / (matmul_tflops or ceil["bf16_matmul_TFLOPs"])
        rows.append({"prompt_len": length, "prompts_per_step": n, "tok_s": n * length / dt,
                     "TFLOPs": tflops, "share_of_matmul_ceiling": share,
                     "samples_tok_s": [n * length / t for t in times[1:]]})  # fmt: skip
        print(f"prefill {n}x{length}: {n * length / dt:.0f} tok/s, {tflops:.0f} TFLOP/s "
              f"({100 * share:.0f}%), median of {repeats}", flush=True)  # fmt: skip
    return rows


def _prefill_step_s(core: EngineCore, n: int, length: int, vocab: int, seed: int) -> float:
    """Seconds to prefill ``n`` fresh random prompts (the prefix cache is emptied after)."""
    for i, p in enumerate(random_prompts(n, length, vocab, seed=length * 1000 + seed)):
        core.add_request(f"p{length}-{seed}-{i}", p, greedy(1))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    drain(core)
    dt = time.perf_counter() - t
    reset_prefix_cache(core)
    return dt


def context_token_steps(num: int, in_len: int, out_len: int) -> int:
    """The KV tokens ``num`` requests' decode steps read (or hold) in all: each request's
    context, ``in_len`` + the tokens so far, summed over its ``out_len`` steps."""
    return num * (out_len * in_len + out_len * (out_len - 1) // 2)


def decode_steps_floor(core: EngineCore, num: int, in_len: int, out_len: int) -> int:
    """The fewest decode steps ``num`` requests of ``in_len`` + ``out_len`` tokens can take on
    this engine: a wave of at most ``max_running_requests`` rows per ``out_len`` steps, and no
    step holding more context than the KV pool (a step's rows together hold at most the pool's
    tokens, so the steps are at least the requests' context-token-steps over the pool)."""
    waves = -(-num // max_running_requests(core))
    held = context_token_steps(num, in_len, out_len)
    return max(out_len * waves, -(-held // kv_capacity_tokens(core)))


def offline_floor(
    core: EngineCore, ceil: dict, num: int, in_len: int, out_len: int,
    step_bytes: float | None = None, matmul_tflops: float | None = None,
) -> dict:  # fmt: skip
    """A lower bound on the offline run's time from this run's ceilings: every prompt token's
    matmul FLOPs at the matmul ceiling (``matmul_tflops``, bf16's by default), then the decode
    steps (``decode_steps_floor``) at whichever is slower, their matmul FLOPs at that ceiling or
    their bytes at copy bandwidth (one weight read per step: ``step_bytes``, by default every
    weight a step reads; and every output token's read of its whole context's KV). Attention
    FLOPs and everything else count zero, so the bound is low."""
    params = matmul_params(core)
    step_bytes = step_weight_bytes(core) if step_bytes is None else step_bytes
    flop_s = (matmul_tflops or ceil["bf16_matmul_TFLOPs"]) * 1e12
    copy_bps = ceil["copy_GBps"] * 1e9
    steps = decode_steps_floor(core, num, in_len, out_len)
    context_tokens = context_token_steps(num, in_len, out_len)
    parts = {
        "prefill_matmul": num * prefill_matmul_flops(core, in_len) / flop_s,
        "decode_matmul": num * out_len * 2 * params / flop_s,
        "decode_weight_read": steps * step_bytes / copy_bps,
        "decode_kv_read": context_tokens * kv_bytes_per_token(core) / copy_bps,
    }
    decode = max(parts["decode_matmul"], parts["decode_weight_read"] + parts["decode_kv_read"])
    return {"floor_s": parts["prefill_matmul"] + decode, "floor_parts_s": parts,
            "floor_decode_steps": steps, "floor_matmul_TFLOPs": flop_s / 1e12}  # fmt: skip


def run_offline(
    core: EngineCore, ceil: dict, num: int, in_len: int, out_len: int,
    matmul_tflops: float | None = None, floor: dict | None = None,
) -> dict:  # fmt: skip
    """``num`` random prompts at once, to the end; the share of ``floor`` (``offline_floor``'s
    result; by default the dense one, every weight read each step)."""
    prompts = random_prompts(num, in_len, core.model_config.vocab_size, seed=1)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i, p in enumerate(prompts):
        core.add_request(f"o{i}", p, greedy(out_len))
    produced, next_report = 0, t + 15
    while core.has_unfinished():
        produced += sum(len(o.new_token_ids) for o in core.step())
        if time.perf_counter() > next_report:  # a run cut short still shows its rate
            elapsed = time.perf_counter() - t
            print(f"offline: {produced} tokens in {elapsed:.0f} s", flush=True)
            next_report += 15
    wall = time.perf_counter() - t
    assert produced == num * out_len
    res = {
        "requests": num,
        "input_len": in_len,
        "output_len": out_len,
        "wall_s": wall,
        "output_tok_s": produced / wall,
        "total_tok_s": (produced + num * in_len) / wall,
        "preemptions": preemptions(core),
        **(floor or offline_floor(core, ceil, num, in_len, out_len, None, matmul_tflops)),
    }
    res["share_of_floor"] = res["floor_s"] / wall
    print(f"offline: {res['output_tok_s']:.0f} output tok/s in {wall:.1f} s, floor "
          f"{res['floor_s']:.1f} s ({100 * res['share_of_floor']:.0f}%)", flush=True)  # fmt: skip
    return res


def hf_generate_s(model: Any, ids: torch.Tensor, n: int, compile_forward: bool) -> float:  # noqa: ANN401
    """Seconds for transformers to generate ``n`` tokens, after a 4-token warm-up."""
    kwargs = dict(do_sample=False, cache_implementation="static", pad_token_id=0,
                  disable_compile=not compile_forward)  # fmt: skip
    with torch.no_grad():
        return timed_after_warmup(
            lambda: model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kwargs),
            lambda: model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kwargs),
        )


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
        times = {n: hf_generate_s(model, ids, n, compile_forward) for n in (32, 96)}
        rate = b * 64 / (times[96] - times[32])
        rows.append({"batch": b, "context": ctx, "tok_s": rate, "compiled": compile_forward})
        print(f"transformers b={b}: {rate:.0f} tok/s", flush=True)
    return rows


# The engine the prefill figures run on: 16K-token steps and chunks, a 32K context (past
# Llama-3-8B's 8K config: allow_longer_context)
PREFILL_ENGINE = {"max_num_batched_tokens": 16384, "chunked_prefill_size": 16384,
                  "context_length": 32768}  # fmt: skip


def run_engine_parts(args: argparse.Namespace, parts: set[str], ceil: dict, result: dict,
                     save: Any) -> None:  # fmt: skip
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    allow_longer_context()  # the 16K prefill point exceeds the config's 8K
    t = time.perf_counter()
    core = build_engine(args.model, max_running_requests=args.max_running, **PREFILL_ENGINE)
    result["engine"] = {"startup_s": time.perf_counter() - t, "kv_pages": kv_pages(core),
                        "kv_tokens": kv_capacity_tokens(core),
                        "weights_GB": weight_bytes(core) / 1e9}  # fmt: skip
    print(f"engine: {result['engine']}", flush=True)
    if "prefill" in parts:
        result["prefill"] = run_prefill(core, ceil, ints(args.prefill_lengths))
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
    release_memory()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=LLAMA_8B)
    ap.add_argument("--parts", default="all")
    ap.add_argument("--batches", default="1,8,32,64,128,256")
    ap.add_argument("--contexts", default="1024,4096")
    ap.add_argument("--prefill-lengths", default="1024,4096,16384")
    ap.add_argument("--offline-requests", type=int, default=1000)
    ap.add_argument(
        "--max-running", type=int, default=None,
        help="most requests in a step (default: the engine's, from its KV pool)",
    )  # fmt: skip
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--tag", default="h200")
    ap.add_argument("--hf-compile", action="store_true", help="let transformers compile")
    args = ap.parse_args()
    parts = {"ceilings", "decode", "prefill", "breakdown", "offline", "hf", "longctx"}
    parts = parts if args.parts == "all" else set(args.parts.split(","))
    result: dict[str, Any] = {"model": args.model, "dtype": "bfloat16", "weights": "dummy",
                              "vllm_0_26_same_h200": VLLM_0_26}  # fmt: skip

    def save() -> None:  # after every part, so a run cut short keeps what it measured
        print(f"wrote {write_result(f'roofline_{args.tag}', result, args.out_dir)}", flush=True)

    ceil = gpu_ceilings()
    result["ceilings"] = ceil
    print(f"ceilings: {ceil}", flush=True)
    if parts & {"decode", "prefill", "breakdown", "offline"}:
        run_engine_parts(args, parts, ceil, result, save)
    if "longctx" in parts:
        from benchmarks.long_context import run_kernels

        result["long_context_kernels"] = run_kernels(ceil)
        save()
    if "hf" in parts:
        result["transformers"] = run_hf(args.model, [1, 64], 1024, args.hf_compile)
        save()


if __name__ == "__main__":
    main()
