"""Long context on the GPU against the machine's ceilings, measured in the same run.

    python -m benchmarks.long_context --parts all --out-dir benchmarks/results

Llama-3.1-8B shape (llama3 rope scaling, 128K positions), bf16, dummy weights, prefix cache off.
Parts (``--parts``: a comma list or ``all``):
  kernels  decode attention alone (one layer) at 32K x 32 and 128K x 8 against the bytes ceiling
           (K/V read once at copy bandwidth); prefill attention of a 32K prompt and of a chunk at
           the end of a 128K prompt against the matmul ceiling (causal FLOPs)
  run32k   32 requests x 32K-token prompts x 256 output tokens (``--outputs``): wall time
           against its floor (the prefill FLOPs at the matmul ceiling plus every later output
           token's KV read at copy bandwidth, whichever step it rides in); the decode rate
           while all are decoding against its ceiling (weights + every resident sequence's KV
           read once per step at copy bandwidth); how many sequences the KV pool held
  prefill  one 32K and one 128K prompt, each after an untimed one of its length: time against
           the FLOP floor (matmuls + causal attention at the matmul ceiling)
  cold     the first batch of 1K prompts at batch 1/64/256 against the same batch again
  short    decode at 1K context, batch 1/64/256, in the same 128K-context engine (regression)
  mixed    short requests' time per output token while a 128K prompt is prefilled beside them
  skewed   decode of one 128K-context request beside 31 of 1K context (``--skewed-short``; a
           long document among chats): tokens/s and step time against the ceiling (weights +
           every sequence's KV read once per step); ``KVSERVE_DECODE_BALANCED=0`` gives the
           even splits to compare
The engine's start time (weights, KV pool, warm-up and graph capture) is recorded too.
Writes long_context_<tag>_<date>.json.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    add_decode_batch,
    build_engine,
    decode_rate,
    drain,
    gpu_ceilings,
    greedy,
    kv_bytes_per_token,
    kv_capacity_tokens,
    prefill_flops,
    random_prompts,
    release_memory,
    reset_prefix_cache,
    step_weight_bytes,
    sync_device,
    weight_bytes,
    write_result,
)
from kvserve.engine.engine_core import EngineCore
from kvserve.kernels.decode_attention import BALANCED_ENV

LLAMA_31_8B = "benchmarks/configs/llama-3.1-8b"
CONTEXT = 131072
LONG_PROMPT = CONTEXT - 1024  # "128K": room left for outputs
VLLM_0_26 = {"run32k_wall_s": 48.4, "prefill_32x32k_s": 38.0, "decode_32k_b32_tok_s": 791}
BEFORE = {
    "commit": "f3c4956",
    "run32k_wall_s": 65.4,
    "prefill_32x32k_s": 44.7,
    "decode_32k_b32_tok_s": 453,
    "decode_1k_tok_s": {1: 212, 64: 8616, 256: 15083},
}


def decode_ceiling_tok_s(core: EngineCore, ceil: dict, batch: int, ctx: float) -> float:
    step_bytes = step_weight_bytes(core) + batch * ctx * kv_bytes_per_token(core)
    return batch / (step_bytes / (ceil["copy_GBps"] * 1e9))


def run_32k(core: EngineCore, ceil: dict, n: int, ctx: int, out: int) -> dict:
    """All ``n`` requests at once. The decode rate counts decode-only steps: no request is
    waiting and every unfinished one has its first token (a pool that cannot hold all ``n``
    runs them in waves; the rate and its ceiling are those of the batch actually resident)."""
    prompts = random_prompts(n, ctx, core.model_config.vocab_size, seed=32)
    sync_device()
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        core.add_request(f"long-{i}", p, greedy(out))
    reqs = list(core.requests.values())
    t_first = None
    resident, dec = 0, {"s": 0.0, "tokens": 0, "rows": 0, "steps": 0, "context": 0}
    while core.has_unfinished():
        live = [r for r in reqs if not r.is_finished]
        decoding = core.stats().num_waiting == 0 and all(r.num_output_tokens for r in live)
        t = time.perf_counter()
        produced = sum(len(o.new_token_ids) for o in core.step())
        if decoding and live:
            dec["s"] += time.perf_counter() - t
            dec["tokens"] += produced
            dec["rows"] += len(live)
            dec["steps"] += 1
            dec["context"] += sum(r.num_tokens for r in live)
        resident = max(resident, core.stats().num_running)
        if t_first is None and min(r.num_output_tokens for r in reqs) >= 1:
            t_first = time.perf_counter()
    wall = time.perf_counter() - t0
    preempted = core.stats().num_preemptions
    reset_prefix_cache(core)
    assert t_first is not None and dec["steps"] > 0
    batch, mean_ctx = dec["rows"] / dec["steps"], dec["context"] / max(1, dec["rows"])
    tok_s = dec["tokens"] / dec["s"]
    ceiling = decode_ceiling_tok_s(core, ceil, batch, mean_ctx)
    prefill_floor = n * prefill_flops(core, ctx) / (ceil["bf16_matmul_TFLOPs"] * 1e12)
    # every output token after the first reads its sequence's KV once, whichever step it is in
    decode_kv_bytes = n * (out - 1) * (ctx + out / 2) * kv_bytes_per_token(core)
    decode_kv_floor = decode_kv_bytes / (ceil["copy_GBps"] * 1e9)
    res = {"requests": n, "prompt": ctx, "output": out, "wall_s": wall,
           "all_first_token_s": t_first - t0, "prefill_floor_s": prefill_floor,
           "decode_kv_floor_s": decode_kv_floor,
           "floor_s": prefill_floor + decode_kv_floor,
           "decode_steps": dec["steps"], "decode_mean_batch": batch,
           "decode_mean_context": mean_ctx,
           "decode_tok_s": tok_s, "decode_ceiling_tok_s": ceiling,
           "decode_share_of_ceiling": tok_s / ceiling, "max_running": resident,
           "preemptions_total": preempted, "vllm_0_26": VLLM_0_26, "before": BEFORE}  # fmt: skip
    print(f"run32k: {n} x {ctx} x {out}: {wall:.1f} s (all first tokens {t_first - t0:.1f} s, "
          f"prefill floor {prefill_floor:.1f} s, decode KV reads {decode_kv_floor:.1f} s); "
          f"decode-only steps {dec['steps']} at mean batch "
          f"{batch:.1f}: {tok_s:.0f} tok/s = {100 * tok_s / ceiling:.0f}% of {ceiling:.0f}; "
          f"max running {resident}, preemptions so far {preempted}", flush=True)  # fmt: skip
    return res


def run_whole_prompts(core: EngineCore, ceil: dict, lengths: list[int]) -> list[dict]:
    """One whole prompt of each length through the engine (not roofline's ``run_prefill``, which
    times one step of many prompts), twice, timing the second: the first pays one-time costs (cuDNN
    builds a graph for each new shape bucket a long prompt's chunks reach, 50-90 ms each)."""
    rows = []
    vocab = core.model_config.vocab_size
    for length in lengths:
        times = []
        for warm in (True, False):
            (prompt,) = random_prompts(1, length, vocab, seed=length + warm)
            sync_device()
            t = time.perf_counter()
            core.add_request(f"prefill-{length}-{warm}", prompt, greedy(1))
            drain(core)
            times.append(time.perf_counter() - t)
            reset_prefix_cache(core)
        first_s, dt = times
        floor = prefill_flops(core, length) / (ceil["bf16_matmul_TFLOPs"] * 1e12)
        rows.append({"prompt": length, "s": dt, "first_s": first_s, "floor_s": floor,
                     "share_of_floor": floor / dt})  # fmt: skip
        print(f"prefill {length}: {dt:.2f} s, floor {floor:.2f} s ({100 * floor / dt:.0f}%)",
              flush=True)  # fmt: skip
    return rows


def run_short(core: EngineCore, ceil: dict, batches: list[int]) -> list[dict]:
    rows = []
    for b in batches:
        r = decode_rate(core, b, 1024, 64, 192)
        ceiling = decode_ceiling_tok_s(core, ceil, b, 1024 + 128)
        rows.append({"batch": b, "context": 1024, **r, "ceiling_tok_s": ceiling,
                     "before_tok_s": BEFORE["decode_1k_tok_s"].get(b)})  # fmt: skip
        print(f"short b={b}: {r['tok_s']:.0f} tok/s (before {BEFORE['decode_1k_tok_s'].get(b)})",
              flush=True)  # fmt: skip
    return rows


def run_mixed(core: EngineCore, n_short: int) -> dict:
    """``n_short`` 1K-prompt requests decoding; then one 128K prompt arrives. Time per output
    token of the short ones while it is prefilled, against before it arrived."""
    short = add_decode_batch(core, n_short, 1024, 2048, seed=5, min_outputs=16)
    t, before = time.perf_counter(), short[0].num_output_tokens
    for _ in range(32):
        core.step()
    tpot_alone = (time.perf_counter() - t) / (short[0].num_output_tokens - before)
    (prompt,) = random_prompts(1, LONG_PROMPT, core.model_config.vocab_size, seed=9)
    core.add_request("mixed-long", prompt, greedy(1))
    long_req = core.requests["mixed-long"]
    t, before = time.perf_counter(), short[0].num_output_tokens
    while long_req.num_output_tokens == 0:
        core.step()
    dt = time.perf_counter() - t
    tpot = dt / max(1, short[0].num_output_tokens - before)
    for r in short:
        core.abort_request(r.request_id)
    drain(core)
    reset_prefix_cache(core)
    res = {
        "short_requests": n_short,
        "long_prompt": LONG_PROMPT,
        "long_prefill_s": dt,
        "short_tpot_ms_alone": tpot_alone * 1e3,
        "short_tpot_ms_beside_long": tpot * 1e3,
    }
    print(f"mixed: {n_short} short requests, TPOT {tpot_alone * 1e3:.1f} ms alone, "
          f"{tpot * 1e3:.1f} ms while a {LONG_PROMPT}-token prompt prefills ({dt:.1f} s)",
          flush=True)  # fmt: skip
    return res


def run_skewed(core: EngineCore, ceil: dict, n_short: int, out_lo: int, out_hi: int) -> dict:
    """One LONG_PROMPT request and ``n_short`` 1K ones, all decoding: output tokens between
    every request having ``out_lo`` and ``out_hi`` of them."""
    vocab = core.model_config.vocab_size
    prompts = random_prompts(1, LONG_PROMPT, vocab, seed=11) + random_prompts(
        n_short, 1024, vocab, seed=12
    )
    for i, p in enumerate(prompts):
        core.add_request(f"skewed-{i}", p, greedy(out_hi))
    reqs = list(core.requests.values())
    while min(r.num_output_tokens for r in reqs) < out_lo:
        core.step()
    sync_device()
    t = time.perf_counter()
    while core.has_unfinished():
        core.step()
    dt = time.perf_counter() - t
    reset_prefix_cache(core)
    tokens = sum(len(p) for p in prompts) + len(prompts) * (out_lo + out_hi) / 2
    step_bytes = step_weight_bytes(core) + tokens * kv_bytes_per_token(core)
    steps = out_hi - out_lo
    res = {"long_prompt": LONG_PROMPT, "short_requests": n_short, "steps": steps,
           "tok_s": len(prompts) * steps / dt, "step_ms": dt / steps * 1e3,
           "ceiling_step_ms": step_bytes / (ceil["copy_GBps"] * 1e9) * 1e3}  # fmt: skip
    res["of_ceiling"] = res["ceiling_step_ms"] / res["step_ms"]
    print(f"skewed: 1 x {LONG_PROMPT} + {n_short} x 1024 decoding: {res['tok_s']:.0f} tok/s, "
          f"{res['step_ms']:.2f} ms a step ({res['of_ceiling']:.0%} of the ceiling's "
          f"{res['ceiling_step_ms']:.2f})", flush=True)  # fmt: skip
    return res


def run_cold(core: EngineCore, batches: list[int]) -> list[dict]:
    """The first batch of each size against the same batch again: what a request still pays
    for compiles or captures after start; the first round's slowest steps (with the running
    and waiting requests before each) against the second round's same steps say where."""
    rows = []
    vocab = core.model_config.vocab_size
    for b in batches:
        times, steps = [], []
        for rep in range(2):
            prompts = random_prompts(b, 1024, vocab, seed=100 * b + rep)
            sync_device()
            t = time.perf_counter()
            for i, p in enumerate(prompts):
                core.add_request(f"cold-{b}-{rep}-{i}", p, greedy(16))
            steps.append(timed_steps(core))
            times.append(time.perf_counter() - t)
            reset_prefix_cache(core)
        slowest = sorted(range(len(steps[0])), key=lambda i: -steps[0][i]["s"])[:3]
        second = [steps[1][i] if i < len(steps[1]) else None for i in slowest]
        rows.append({"batch": b, "first_s": times[0], "second_s": times[1],
                     "slowest_first": [steps[0][i] | {"step": i} for i in slowest],
                     "same_steps_second": second})  # fmt: skip
        print(f"cold b={b}: first {times[0]:.2f} s, second {times[1]:.2f} s; slowest first "
              f"steps {rows[-1]['slowest_first']}, second {second}", flush=True)  # fmt: skip
    return rows


def timed_steps(core: EngineCore) -> list[dict]:
    """Steps until every request is done: each one's seconds, and the running and waiting
    requests before it."""
    steps = []
    while core.has_unfinished():
        stats = core.stats()
        t = time.perf_counter()
        core.step()
        steps.append({"s": time.perf_counter() - t, "running": stats.num_running,
                      "waiting": stats.num_waiting})  # fmt: skip
    return steps


def run_kernels(ceil: dict) -> dict:
    from benchmarks.kernels_h200 import DecodeShapes
    from benchmarks.long_context_sweep import decode_row, prefill_row

    shapes = DecodeShapes()
    decode = [decode_row(shapes, b, ctx, None) for b, ctx in ((32, 32768), (8, 131072))]
    for r in decode:
        r["of_copy"] = r["gbs"] / ceil["copy_GBps"]
        print(f"kernel decode B={r['batch']} ctx={r['ctx']}: {r['us']:.0f} us, "
              f"{100 * r['of_copy']:.0f}% of copy", flush=True)  # fmt: skip
    del shapes
    torch.cuda.empty_cache()
    mm = ceil["bf16_matmul_TFLOPs"]
    prefill = [prefill_row(q, L, None, mm) for q, L in ((32768, 32768), (16384, 131072))]
    for r in prefill:
        print(f"kernel prefill q={r['qlen']} L={r['seq_len']}: {r['tflops']:.0f} TFLOP/s "
              f"({100 * r['of_matmul']:.0f}% of matmul)", flush=True)  # fmt: skip
    return {"decode": decode, "prefill": prefill}


def start_passes_summary(core: EngineCore) -> dict | None:
    """What the start compiled ahead, and what its passes still compiled at launch."""
    report = core.runner.start_report
    if report is None:
        return None
    ahead = report.ahead
    return {
        "seconds": report.seconds,
        "late_compiles": report.late_compiles,
        "loaded_from_disk_cache": report.cached,
        "recorded": report.recorded,  # False: the kernel list came from the start manifest
        "ahead": None if ahead is None else {"kernels": ahead.kernels, "cached": ahead.cached,
                                             "failed": ahead.failed,
                                             "workers": ahead.workers, "seconds": ahead.seconds,
                                             "compile_s": ahead.compile_s},
    }  # fmt: skip


def run_engine(args: argparse.Namespace, parts: set[str], ceil: dict, result: dict,
               save: Any) -> None:  # noqa: ANN401 - a callback  # fmt: skip
    release_memory()  # the ceilings' and kernels' buffers: the engine sizes its pool from free
    t = time.perf_counter()
    core = build_engine(
        args.model, context_length=CONTEXT, enable_prefix_cache=False,
        max_num_batched_tokens=args.budget, chunked_prefill_size=args.chunk,
        kv_cache_dtype=args.kv_cache_dtype, chunk_attention_budget=args.chunk_attention_budget,
        prefill_attention_backend=args.prefill_attention_backend,
    )  # fmt: skip
    sched = core.config.scheduler
    result["engine"] = {"startup_s": time.perf_counter() - t, "kv_tokens": kv_capacity_tokens(core),
                        "weights_GB": weight_bytes(core) / 1e9,
                        "budget": sched.max_num_batched_tokens,
                        "chunk": sched.chunked_prefill_size,
                        "chunk_attention_budget": sched.chunk_attention_budget}  # fmt: skip
    result["engine"]["engine_startup_s"] = core.startup_s  # as the startup log says
    result["engine"]["start_passes"] = start_passes_summary(core)
    print(f"engine: {result['engine']}", flush=True)
    if "cold" in parts:
        result["cold"] = run_cold(core, args.cold_batches)
        save()
    if "run32k" in parts:
        result["run32k"] = run_32k(core, ceil, args.requests, 32768, args.outputs)
        save()
    if "prefill" in parts:
        result["prefill"] = run_whole_prompts(core, ceil, [32768, LONG_PROMPT])
        save()
    if "short" in parts:
        result["short"] = run_short(core, ceil, [1, 64, 256])
        save()
    if "mixed" in parts:
        result["mixed"] = run_mixed(core, 16)
        save()
    if "skewed" in parts:
        result["skewed"] = run_skewed(core, ceil, args.skewed_short, 8, 136)
        save()
    library = getattr(core.runner.backend, "prefill_library", None)
    if library is not None:  # cuDNN's graphs: built once per shape bucket, on first use
        result["engine"]["cudnn_graph_builds"] = library.builds
        save()
    del core
    release_memory()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=LLAMA_31_8B)
    ap.add_argument("--parts", default="all")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--outputs", type=int, default=256, help="run32k's output tokens each")
    ap.add_argument("--cold-batches", type=lambda v: [int(b) for b in v.split(",")],
                    default=[1, 64, 256], help="cold's batches (comma list)")  # fmt: skip
    ap.add_argument("--budget", type=int, help="max_num_batched_tokens (engine default)")
    ap.add_argument("--chunk", type=int, help="chunked_prefill_size (engine default)")
    ap.add_argument("--kv-cache-dtype", default="auto", help="auto (bf16) or fp8_e4m3")
    ap.add_argument("--chunk-attention-budget", type=int, help="the scheduler's (default off)")
    ap.add_argument("--prefill-attention-backend", default="auto", help="auto, triton or cudnn")
    ap.add_argument("--skewed-short", type=int, default=31, help="skewed's 1K requests")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--tag", default="h200")
    args = ap.parse_args()
    all_parts = {"kernels", "cold", "run32k", "prefill", "short", "mixed", "skewed"}
    parts = all_parts if args.parts == "all" else set(args.parts.split(","))
    result: dict[str, Any] = {"model": args.model, "dtype": "bfloat16", "weights": "dummy",
                              "kv_cache_dtype": args.kv_cache_dtype,
                              "prefill_attention_backend": args.prefill_attention_backend,
                              "context_length": CONTEXT,
                              "decode_balanced": os.environ.get(BALANCED_ENV, "1")}  # fmt: skip
    out_dir = None if args.out_dir is None else Path(args.out_dir)

    def save() -> None:  # after every part, so a run cut short keeps what it measured
        print(f"wrote {write_result(f'long_context_{args.tag}', result, out_dir)}", flush=True)

    ceil = gpu_ceilings()
    result["ceilings"] = ceil
    print(f"ceilings: {ceil}", flush=True)
    if "kernels" in parts:
        result["kernels"] = run_kernels(ceil)
        save()
    if parts & all_parts - {"kernels"}:
        run_engine(args, parts, ceil, result, save)
    save()


if __name__ == "__main__":
    main()
