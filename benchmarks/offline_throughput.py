"""Offline throughput on this CPU: the bundled SmolLM2, prompts of 128-512 random tokens, 128
output tokens each (ignore_eos). kvserve at several concurrencies against Hugging Face
transformers ``generate`` (batched, left-padded) on the same prompts, in one run.

    .venv/bin/python -m benchmarks.offline_throughput [--num-prompts 64] [--concurrency 1,8,32]

Writes benchmarks/results/offline_throughput_<date>.json. Decode on a CPU is bound by memory
bandwidth; the ceiling stated is one read of the weights per step at the measured copy rate.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import (
    copy_bandwidth_gbs,
    greedy,
    reference_model,
    reset_prefix_cache,
    step_weight_bytes,
    write_result,
)
from kvserve import LLM, SamplingParams


def make_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(128, 513, (n,), generator=gen).tolist()
    # Skip the low ids where SmolLM2 keeps its special tokens.
    return [torch.randint(100, vocab, (L,), generator=gen).tolist() for L in lengths]


def run_kvserve(llm: LLM, prompts: list[list[int]], out_len: int) -> dict[str, float]:
    t = time.perf_counter()
    outs = llm.generate(prompts, greedy(out_len))
    wall = time.perf_counter() - t
    generated = sum(len(o.token_ids) for o in outs)
    assert generated == len(prompts) * out_len
    return {"wall_s": wall, "output_tokens": generated, "output_tok_s": generated / wall}


def run_hf(model, prompts: list[list[int]], out_len: int, batch: int) -> dict[str, float]:
    t, generated = time.perf_counter(), 0
    for i in range(0, len(prompts), batch):
        group = prompts[i : i + batch]
        width = max(len(p) for p in group)
        ids = torch.full((len(group), width), 2, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, p in enumerate(group):
            ids[j, width - len(p) :] = torch.tensor(p)
            mask[j, width - len(p) :] = 1
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=mask, max_new_tokens=out_len, min_new_tokens=out_len,
                do_sample=False, pad_token_id=2,
            )  # fmt: skip
        generated += (out.shape[1] - width) * len(group)
    wall = time.perf_counter() - t
    rate = generated / wall
    return {"batch": batch, "wall_s": wall, "output_tokens": generated, "output_tok_s": rate}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--hf-batches", default="8,32")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    kv, prompts, llm = {}, [], None
    for c in levels:
        llm = LLM(device="cpu", dtype=args.dtype, max_running_requests=c)
        prompts = make_prompts(args.num_prompts, llm.engine.model_config.vocab_size, seed=0)
        llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up
        reset_prefix_cache(llm.engine)
        kv[c] = run_kvserve(llm, prompts, args.output_len)
        print(f"kvserve concurrency {c}: {kv[c]['output_tok_s']:.1f} output tok/s", flush=True)
    assert llm is not None
    ref = reference_model(llm.engine.source.path, args.dtype)
    hf = {}
    for b in [int(x) for x in args.hf_batches.split(",")]:
        hf[b] = run_hf(ref, prompts, args.output_len, b)
        print(f"transformers batch {b}: {hf[b]['output_tok_s']:.1f} output tok/s", flush=True)
    best_hf = max(r["output_tok_s"] for r in hf.values())
    wbytes = step_weight_bytes(llm.engine)
    bw = copy_bandwidth_gbs("cpu")
    payload = {
        "model": "SmolLM2-135M-Instruct Q4_1 GGUF (dequantized)",
        "dtype": args.dtype,
        "num_prompts": args.num_prompts,
        "input_len_range": [128, 512],
        "output_len": args.output_len,
        "kvserve": {str(c): r for c, r in kv.items()},
        "transformers": {str(b): r for b, r in hf.items()},
        "ratio_at_max_concurrency_vs_best_transformers": kv[max(levels)]["output_tok_s"] / best_hf,
        "ceiling": {
            "copy_bandwidth_GBps": bw,
            "step_weight_bytes": wbytes,
            "decode_steps_per_s_ceiling": bw * 1e9 / wbytes,
            "note": "one read of the weights per decode step; KV reads excluded",
        },
    }
    path = write_result("offline_throughput", payload)
    ratio = payload["ratio_at_max_concurrency_vs_best_transformers"]
    print(f"ratio kvserve@{max(levels)} / best transformers = {ratio:.2f}; wrote {path}")


if __name__ == "__main__":
    main()
