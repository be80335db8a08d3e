"""One side of ``benchmarks/code_ab.py``: decode rates and an offline run of the kvserve found on
PYTHONPATH, written as JSON. Run as a plain script in a fresh process per measurement.

Self-contained on purpose: it is run against source trees of other commits (older module
layouts, benchmarks not a package), so it imports nothing from benchmarks/ and only kvserve's
public names (``LLM``, ``SamplingParams``) plus the engine core that ``LLM.engine`` holds, used
through calls both layouts have (``add_request``, ``step``, ``has_unfinished``, ``requests``).
The decode rate is roofline.py's: tokens decoded between every request of the batch having 64
and 192 outputs, over the time between the two.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1000, vocab - 1000, (n, length), generator=gen).tolist()


def reset_prefix_cache(engine: Any) -> bool:  # noqa: ANN401 - either layout's EngineCore
    """Empty the prefix cache between parts where this layout has the call (both do today)."""
    reset = getattr(getattr(engine, "kv", None), "reset_prefix_cache", None)
    if reset is None:
        return False
    reset()
    return True


def decode_rate(engine: Any, params_cls: Any, batch: int, ctx: int, lo: int, hi: int) -> dict:  # noqa: ANN401
    params = params_cls(temperature=0, max_tokens=hi, ignore_eos=True)
    prompts = random_prompts(batch, ctx, engine.model_config.vocab_size, seed=batch * 7 + ctx)
    for i, p in enumerate(prompts):
        engine.add_request(f"b{batch}-c{ctx}-{i}", p, params)
    reqs = list(engine.requests.values())
    t_lo = None
    while engine.has_unfinished():
        engine.step()
        if t_lo is None and min(r.num_output_tokens for r in reqs) >= lo:
            sync()
            t_lo = time.perf_counter()
    t_hi = time.perf_counter()
    assert t_lo is not None
    return {"tok_s": batch * (hi - lo) / (t_hi - t_lo), "step_ms": (t_hi - t_lo) / (hi - lo) * 1e3}


def offline(engine: Any, params_cls: Any, num: int, in_len: int, out_len: int) -> dict:  # noqa: ANN401
    params = params_cls(temperature=0, max_tokens=out_len, ignore_eos=True)
    prompts = random_prompts(num, in_len, engine.model_config.vocab_size, seed=1)
    sync()
    t = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"o{i}", p, params)
    produced = 0
    while engine.has_unfinished():
        produced += sum(len(o.new_token_ids) for o in engine.step())
    wall = time.perf_counter() - t
    assert produced == num * out_len, (produced, num * out_len)
    return {"requests": num, "input_len": in_len, "output_len": out_len, "wall_s": wall,
            "output_tok_s": produced / wall}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--out-lo", type=int, default=64)
    ap.add_argument("--out-hi", type=int, default=192)
    ap.add_argument("--offline", default="200,1024,1024", help="requests,input_len,output_len")
    ap.add_argument("--budget", type=int, default=16384, help="tokens per step")
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--json-out", required=True)
    args = ap.parse_args()
    import kvserve
    from kvserve import LLM, SamplingParams

    t = time.perf_counter()
    llm = LLM(args.model, load_format="dummy", device=args.device, dtype=args.dtype,
              max_num_batched_tokens=args.budget, chunked_prefill_size=args.budget,
              max_running_requests=args.max_running)  # fmt: skip
    engine = llm.engine
    result: dict[str, Any] = {"kvserve_file": os.path.realpath(kvserve.__file__),
                              "startup_s": time.perf_counter() - t, "decode": {}}  # fmt: skip
    for b in (int(x) for x in args.batches.split(",")):
        rate = decode_rate(engine, SamplingParams, b, args.context, args.out_lo, args.out_hi)
        result["decode"][str(b)] = rate
        result["prefix_cache_reset"] = reset_prefix_cache(engine)
        print(f"decode b={b}: {rate['tok_s']:.1f} tok/s", flush=True)
    num, in_len, out_len = (int(x) for x in args.offline.split(","))
    result["offline"] = offline(engine, SamplingParams, num, in_len, out_len)
    print(f"offline: {result['offline']['output_tok_s']:.1f} output tok/s", flush=True)
    with open(args.json_out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
