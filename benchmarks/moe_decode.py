"""Mixture-of-experts decode and offline throughput against the bytes actually read.

    python -m benchmarks.moe_decode --model benchmarks/configs/qwen3-30b-a3b \
        --batches 1,64,256 --offline 1000
    python -m benchmarks.moe_decode --model benchmarks/configs/glm-4.5-air \
        --formats fp8-block,nvfp4 --tag glm45air_h200

``--formats`` (default bf16) names lowbit_decode.py's formats: ``fp8-block`` writes Qwen3-FP8's
``quant_method: fp8`` with 128x128 blocks into a copy of config.json, ``fp8`` / ``nvfp4`` /
``mxfp4`` quantize online; weights are dummy in the format's own layout, experts included.
``+kv8`` after a format stores the KV cache in FP8 (GLM-4.5-Air's FP8 weights leave an H200
about 120K tokens of bf16 KV: 64 requests at 1K context, not 256).
Expert bytes count every tensor of the expert stacks (FP8 or packed FP4 values and scales).

Decode at 1K context: tok/s between output lengths 64 and 192 (as roofline.py's decode part).
Its ceiling counts the bytes one step must read: every non-expert weight (attention, norms,
router, LM head; the embedding table only for the rows looked up), the experts the batch
touches, and the KV cache. Experts touched per layer are counted from the routers' choices
for a batch of random hidden states of that size, so the ceiling follows the routing the
weights produce. Offline 1000 x (1024 in, 1024 out) is reported with roofline.py's floor
counted with the active parameters (non-expert weights + top-k experts per token) over its
fewest decode steps (waves of the running cap, and no step holding more context than the KV
pool), each reading the experts its mean row count touches. ``--prefill-lengths`` adds
roofline.py's prefill part (its FLOPs from the same active parameters, causal attention
included).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks import roofline
from benchmarks.common import (
    build_engine,
    decode_rate,
    gpu_ceilings,
    kv_bytes_per_token,
    kv_capacity_tokens,
    matmul_ceiling_tflops,
    max_running_requests,
    release_memory,
    step_weight_bytes,
    write_result,
)
from benchmarks.lowbit_decode import FORMATS, format_settings, model_dir, parse_formats
from benchmarks.roofline import run_offline, run_prefill
from kvserve.engine.engine_core import EngineCore
from kvserve.layers.moe import SparseMoE
from kvserve.layers.moe_router import select_experts

# Format suffixes: only the KV cache's dtype (lowbit_decode's FP8 kernel suffixes choose the
# dense projections' kernels, not the experts')
SUFFIXES = ("kv8",)


def _moe_layers(core: EngineCore) -> list[SparseMoE]:
    return [m for m in core.runner.model.modules() if isinstance(m, SparseMoE)]


def weight_split(core: EngineCore) -> dict[str, float]:
    """Bytes of the expert stacks (a stacked shared expert's too), of one expert's three
    matrices, and of everything else that a step reads (the embedding table is read one row per
    token, so it is left out)."""
    expert_total = sum(_stack_bytes(m) for m in _moe_layers(core))
    first = _moe_layers(core)[0]
    per_expert = _stack_bytes(first) / first.stacked_experts
    other = step_weight_bytes(core) - expert_total
    return {"expert_bytes_total": expert_total, "bytes_per_expert": per_expert,
            "non_expert_bytes": other}  # fmt: skip


def _stack_bytes(moe: SparseMoE) -> int:
    """The expert stacks in their format: values, block scales, row scales."""
    return sum(p.nbytes for _, p in moe.named_parameters(recurse=False))


def experts_touched(core: EngineCore, batch: int) -> float:
    """Mean distinct experts per MoE layer that each layer's router picks for ``batch`` random
    hidden states (with dummy weights the engine's own hidden states are as random), plus a
    stacked shared expert, which every step reads."""
    layers = _moe_layers(core)
    first = layers[0].gate.weight
    gen = torch.Generator(device=first.device).manual_seed(batch)
    x = torch.randn(batch, first.shape[1], device=first.device, generator=gen)
    counts = []
    with torch.inference_mode():
        for layer in layers:
            logits = torch.nn.functional.linear(x, layer.gate.weight)
            _, ids = select_experts(logits, layer.cfg, layer.gate.e_score_correction_bias)
            counts.append(int(ids.unique().numel()) + int(layer.shared_expert))
    return sum(counts) / len(counts)


def offline_floor(
    core: EngineCore, ceil: dict, num: int, in_len: int, out_len: int, matmul_tflops: float
) -> dict:
    """roofline.py's floor, its FLOPs from the MoE's active parameters (``common.matmul_params``:
    the non-expert weights and a token's top-k experts) and its fewest decode steps, each
    reading the experts their mean row count touches."""
    split, layers = weight_split(core), _moe_layers(core)
    rows = -(-num * out_len // roofline.decode_steps_floor(core, num, in_len, out_len))
    touched = experts_touched(core, rows) * len(layers) * split["bytes_per_expert"]
    return roofline.offline_floor(
        core, ceil, num, in_len, out_len, split["non_expert_bytes"] + touched, matmul_tflops
    )


def run_decode(core: EngineCore, ceil: dict, batches: list[int], ctx: int) -> list[dict]:
    split, kv_tok, rows = weight_split(core), kv_bytes_per_token(core), []
    layers = len(_moe_layers(core))
    for b in batches:
        lo, hi = 64, 192
        need, pool = b * (ctx + hi), kv_capacity_tokens(core)
        if need > pool:
            why = f"KV does not fit: {need} tokens, the pool holds {pool}"
            rows.append({"batch": b, "context": ctx, "skipped": why})
            print(f"moe decode b={b}: skipped, {why}", flush=True)
            continue
        touched = experts_touched(core, b)
        r = decode_rate(core, b, ctx, lo, hi)
        expert_bytes = touched * layers * split["bytes_per_expert"]
        bytes_step = split["non_expert_bytes"] + expert_bytes + b * (ctx + (lo + hi) / 2) * kv_tok
        achieved = bytes_step / (r["step_ms"] / 1e3) / 1e9
        ceiling_tok_s = b / (bytes_step / (ceil["copy_GBps"] * 1e9))
        rows.append({"batch": b, "context": ctx, **r, "experts_touched_per_layer": touched,
                     "bytes_per_step": bytes_step, "achieved_GBps": achieved,
                     "ceiling_tok_s": ceiling_tok_s,
                     "share_of_copy_ceiling": achieved / ceil["copy_GBps"]})  # fmt: skip
        print(f"moe decode b={b}: {r['tok_s']:.0f} tok/s (ceiling {ceiling_tok_s:.0f}), "
              f"{touched:.1f} experts/layer, {100 * achieved / ceil['copy_GBps']:.0f}% of copy bw",
              flush=True)  # fmt: skip
    return rows


def unblockable_dense(model: str, qc: dict[str, Any] | None) -> dict[str, Any] | None:
    """Block-wise FP8 with the dense MLP layers whose intermediate size does not split into
    128-row blocks left unquantized (GLM-4.5-Air's layer 0: 10944 rows), as a block-FP8
    checkpoint of that shape has to keep them (vLLM refuses such a layer too)."""
    if not qc or not qc.get("weight_block_size"):
        return qc
    config = json.loads((Path(model) / "config.json").read_text())
    if config.get("intermediate_size", 0) % qc["weight_block_size"][0] == 0:
        return qc
    dense = list(range(config.get("first_k_dense_replace", 0)))
    dense += config.get("mlp_only_layers") or []
    return {**qc, "modules_to_not_convert": [f"model.layers.{i}.mlp" for i in dense]}


def run_format(name: str, args: argparse.Namespace, ceil: dict, tmp: Path) -> dict[str, Any]:
    """One engine in format ``name``: weights, decode rows, the offline run if asked."""
    base, *suffixes = name.split("+")
    qc = unblockable_dense(args.model, FORMATS[base][1])
    settings = {**format_settings(base, suffixes), "mem_fraction_static": args.mem_fraction_static,
                "max_running_requests": args.max_running}  # fmt: skip
    core = build_engine(model_dir(args.model, qc, tmp), **settings)  # None: the engine's default
    split = weight_split(core)
    gb = {k: v / 1e9 for k, v in split.items()}
    print(f"{name}: experts {gb['expert_bytes_total']:.1f} GB, other "
          f"{gb['non_expert_bytes']:.1f} GB, start {core.startup_s:.0f} s", flush=True)  # fmt: skip
    out: dict[str, Any] = {"startup_s": core.startup_s, "weights": split,
                           "mem_fraction_static": core.config.cache.mem_fraction_static,
                           "kv_capacity_tokens": kv_capacity_tokens(core),
                           "max_running_requests": max_running_requests(core)}  # fmt: skip
    lengths = [int(n) for n in args.prefill_lengths.split(",") if n]
    rate = matmul_ceiling_tflops(ceil, fp8_tensor_cores=base.startswith("fp8"))
    if lengths:
        out["prefill"] = run_prefill(core, ceil, lengths, rate)
    batches = [int(b) for b in args.batches.split(",") if b]
    out["decode"] = run_decode(core, ceil, batches, args.context)
    if args.offline:
        floor = offline_floor(core, ceil, args.offline, 1024, 1024, rate)
        out["offline"] = run_offline(core, ceil, args.offline, 1024, 1024, floor=floor)
    del core
    release_memory()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="benchmarks/configs/qwen3-30b-a3b")
    p.add_argument("--formats", default="bf16",
                   help=f"comma-separated: {', '.join(FORMATS)}, each optionally +kv8")  # fmt: skip
    p.add_argument("--batches", default="1,64,256")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--prefill-lengths", default="", help="prompt lengths to time prefill at")
    p.add_argument("--offline", type=int, default=0, help="offline requests (0: skip)")
    p.add_argument("--mem-fraction-static", type=float, default=None,
                   help="share of GPU memory for weights + KV (default: the engine's)")  # fmt: skip
    p.add_argument("--max-running", type=int, default=None,
                   help="running cap (default: the engine's, from the KV pool)")  # fmt: skip
    p.add_argument("--tag", default="h200")
    p.add_argument("--out-dir", default=None)
    args = p.parse_args()
    formats = parse_formats(args.formats, SUFFIXES)
    ceil = gpu_ceilings()
    result: dict[str, Any] = {"model": args.model, "ceilings": ceil, "formats": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in formats:
            try:
                result["formats"][name] = run_format(name, args, ceil, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - one failing format must not lose the others
                traceback.print_exc()
                print(f"{name}: failed: {exc!r}", flush=True)
                result["formats"][name] = {"error": repr(exc)}
                release_memory()
    if formats == ["bf16"]:  # the layout of earlier result files
        result.update(result.pop("formats")["bf16"])
    path = write_result(f"moe_decode_{args.tag}", result, args.out_dir)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
