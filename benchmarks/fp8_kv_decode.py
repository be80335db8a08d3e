"""Decode attention over an FP8 (e4m3) KV cache against the same kernel over bf16, one layer.

    python -m benchmarks.fp8_kv_decode --out-dir benchmarks/results
    python -m benchmarks.fp8_kv_decode --sweep      # tiles, stages, occupancy
    python -m benchmarks.fp8_kv_decode --prefill    # the prefill kernel, bf16 and FP8 caches

Llama-3-8B heads (32 q, 8 kv, head_dim 128, page 16), batch x context 32 x 32K, 8 x 128K,
64 x 1K and 256 x 1K (where offline FP8 + FP8 KV runs spend most of a step: there the FP8 cache
read at about half of copy bandwidth, lowbit_decode_h200_mr512_2026-12-02.json). Each shape is
timed inside one CUDA graph of several calls on different random page sets (so the cache is not
served from L2), bf16 and FP8 in the same run; bytes are the K/V read
once plus q/out/page tables, against device-to-device copy bandwidth. The FP8 cache reads half
the bytes, so at long context its time should approach half of bf16's.

Writes fp8_kv_decode_<tag>_<date>.json.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import replace
from typing import Any

import torch

from benchmarks.common import captured_ms, copy_bandwidth_gbs, write_result
from kvserve.kernels.decode_attention import (
    FP8_DECODE_CONFIG,
    DecodeConfig,
    paged_decode_attention,
)
from kvserve.kernels.prefill_attention import (
    PrefillConfig,
    default_prefill_config,
    paged_prefill_attention,
)
from kvserve.kernels.store_kv_cache import store_kv_cache

HQ, HKV, HEAD_DIM, PAGE = 32, 8, 128, 16
SHAPES = ((32, 32768), (8, 131072), (64, 1024), (1, 1024), (8, 4096), (256, 1024))
CALLS_PER_GRAPH = 4
ERROR_CONFIGS = ("default", "q2")  # configs whose error is measured (their q terms)
# FP8 configs timed by default (the default first): neighbours of the default tile and split
# counts that are and are not whole waves of the kernel's occupancy
FP8_CONFIGS = {
    "default": FP8_DECODE_CONFIG,
    "n64_s3_pps8": replace(FP8_DECODE_CONFIG, programs_per_sm=8),
    "n128_s2_pps3": replace(FP8_DECODE_CONFIG, block_n=128, num_stages=2, programs_per_sm=3),
    "n128_s2_pps6": replace(FP8_DECODE_CONFIG, block_n=128, num_stages=2, programs_per_sm=6),
    "q2": replace(FP8_DECODE_CONFIG, fp8_q_terms=2),  # q as two e4m3 terms: one MMA more a tile
}


def sweep_configs() -> dict[str, DecodeConfig]:
    """--sweep: tiles, stages and split counts (programs an SM; 4 warps and the fused merge)."""
    out = {}
    for block_n, stages, per_sm in itertools.product((64, 128), (2, 3, 4), (3, 4, 6, 8)):
        out[f"n{block_n}_s{stages}_pps{per_sm}"] = replace(
            FP8_DECODE_CONFIG, block_n=block_n, num_stages=stages, programs_per_sm=per_sm
        )
    return out


def time_shape(
    batch: int, ctx: int, kv_dtype: torch.dtype, cache: torch.Tensor, cfg: DecodeConfig
) -> float:
    """ms per call: CALLS_PER_GRAPH calls on their own random page sets in one graph."""
    pages = ctx // PAGE
    scales = (torch.tensor([0.05], device="cuda"), torch.tensor([0.05], device="cuda"))
    kv_scales = scales if kv_dtype == torch.float8_e4m3fn else None
    calls = []
    for _ in range(CALLS_PER_GRAPH):
        perm = torch.randperm(cache.shape[1], device="cuda")[: batch * pages]
        tables = perm.view(batch, pages).to(torch.int32)
        lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, HQ, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        calls.append((q, tables, lens, torch.empty_like(q)))

    def run() -> None:
        for q, tables, lens, out in calls:
            paged_decode_attention(
                q, cache, tables, lens, HEAD_DIM**-0.5, out, kv_scales, config=cfg
            )

    return captured_ms(run) / CALLS_PER_GRAPH


def measure(
    kv_dtype: torch.dtype,
    copy_gbs: float,
    name: str,
    cfg: DecodeConfig,
    shapes=SHAPES,
) -> list[dict[str, Any]]:
    max_tokens = max(b * c for b, c in SHAPES) * 2  # random page subsets from twice the need
    shape = (2, max_tokens // PAGE, PAGE, HKV, HEAD_DIM)
    cache = torch.randn(shape, dtype=torch.bfloat16, device="cuda").to(kv_dtype)
    rows = []
    for batch, ctx in shapes:
        try:
            ms = time_shape(batch, ctx, kv_dtype, cache, cfg)
        except Exception as exc:  # a config that does not compile must not end the sweep
            print(f"{name} B={batch} ctx={ctx}: failed: {exc!r}"[:300], flush=True)
            rows.append({"batch": batch, "ctx": ctx, "error": repr(exc)[:300]})
            continue
        kv_bytes = 2 * batch * ctx * HKV * HEAD_DIM * kv_dtype.itemsize
        total = kv_bytes + 2 * batch * HQ * HEAD_DIM * 2 + batch * (ctx // PAGE) * 4
        gbs = total / ms / 1e6
        rows.append({"batch": batch, "ctx": ctx, "us": ms * 1e3, "bytes": total, "GBps": gbs,
                     "of_copy": gbs / copy_gbs})  # fmt: skip
        print(f"{kv_dtype} {name} B={batch} ctx={ctx}: {ms * 1e3:.0f} us, {gbs:.0f} GB/s "
              f"({100 * gbs / copy_gbs:.0f}% of copy)", flush=True)  # fmt: skip
    del cache
    torch.cuda.empty_cache()
    return rows


def accuracy(cfg: DecodeConfig = FP8_DECODE_CONFIG) -> dict[str, float]:
    """RMS error of the FP8 decode kernel (under ``cfg``) against fp32 attention over the
    unquantized keys and values and over the FP8 cache's own (dequantized) ones, the cache
    written by the store kernel; 8 sequences of up to 4K tokens."""
    torch.manual_seed(0)
    pages, batch, ctx = 4096, 8, 4000
    kv = torch.randn(2, pages * PAGE, HKV, HEAD_DIM, device="cuda")
    scales = (torch.tensor([0.02], device="cuda"), torch.tensor([0.02], device="cuda"))
    cache = torch.zeros(2, pages, PAGE, HKV, HEAD_DIM, device="cuda", dtype=torch.float8_e4m3fn)
    store_kv_cache(kv[0], kv[1], cache, torch.arange(pages * PAGE, device="cuda"), scales)
    stored = (kv / 0.02).clamp(-448, 448).to(torch.float8_e4m3fn).float() * 0.02
    tables = torch.randperm(pages, device="cuda")[: batch * 256].view(batch, 256).to(torch.int32)
    lens = torch.randint(1, ctx, (batch,), device="cuda", dtype=torch.int32)
    q = torch.randn(batch, HQ, HEAD_DIM, dtype=torch.bfloat16, device="cuda") * 1.5

    def reference(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(batch, HQ, HEAD_DIM, device="cuda")
        for b in range(batch):
            toks = torch.arange(int(lens[b]), device="cuda")
            slots = tables[b, toks // PAGE].long() * PAGE + toks % PAGE
            k, v = (x[slots].repeat_interleave(HQ // HKV, 1) for x in (keys, values))
            s = torch.einsum("hd,thd->ht", q[b].float(), k) * HEAD_DIM**-0.5
            out[b] = torch.einsum("ht,thd->hd", s.softmax(-1), v)
        return out

    exact, of_cache = reference(kv[0], kv[1]), reference(stored[0], stored[1])
    o = paged_decode_attention(q, cache, tables, lens, HEAD_DIM**-0.5, None, scales, config=cfg)
    o = o.float()
    rms = lambda x: x.pow(2).mean().sqrt().item()  # noqa: E731
    out = {"output_rms": rms(exact), "cache_rounding": rms(of_cache - exact),
           "kernel_vs_exact": rms(o - exact), "kernel_vs_cache": rms(o - of_cache)}  # fmt: skip
    print(out, flush=True)
    return out


MERGE_SHAPES = ((1, 1024), (8, 4096), (32, 32768), (8, 131072))


def compare_fused_merge(args: argparse.Namespace) -> None:
    """The split merge as its own kernel vs done by the last-arriving split, bf16 and FP8."""
    copy_gbs = copy_bandwidth_gbs()
    out: dict[str, Any] = {"copy_GBps": copy_gbs}
    for kv_dtype, base in (
        (torch.bfloat16, DecodeConfig()),
        (torch.float8_e4m3fn, FP8_DECODE_CONFIG),
    ):
        for fused in (False, True):
            name = f"{str(kv_dtype).removeprefix('torch.')}_fused{int(fused)}"
            cfg = replace(base, fused_merge=fused)
            out[name] = measure(kv_dtype, copy_gbs, name, cfg, MERGE_SHAPES)
    print(f"wrote {write_result(f'fp8_kv_fused_merge_{args.tag}', out, args.out_dir)}")


# (chunk rows, context) of one sequence: a whole 8K prompt, and 2K chunks behind 8K / 32K
PREFILL_SHAPES = ((8192, 8192), (2048, 10240), (2048, 32768))


def prefill_configs() -> dict[str, tuple[torch.dtype, PrefillConfig]]:
    """The prefill kernel's cache and config: bf16's default, and FP8 (on FP8 tensor cores) at
    its default, with q's two e4m3 terms, and at other tiles that do not spill."""
    bf16 = default_prefill_config(HEAD_DIM, torch.bfloat16)
    fp8 = default_prefill_config(HEAD_DIM, torch.bfloat16, fp8_cache=True)
    e4m3 = torch.float8_e4m3fn
    return {
        "bf16": (torch.bfloat16, bf16),
        "fp8_default": (e4m3, fp8),
        "fp8_q2": (e4m3, replace(fp8, fp8_q_terms=2)),
        **{
            f"fp8_tc_m{m}_n{n}_w{w}_s{st}": (e4m3, replace(fp8, block_m=m, block_n=n,
                                                           num_warps=w, num_stages=st))
            for m, n, w, st in ((128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 4),
                                (64, 128, 4, 3), (256, 64, 16, 3))
        },
    }  # fmt: skip


def time_prefill(rows: int, ctx: int, cache: torch.Tensor, cfg: PrefillConfig) -> float:
    """ms of one prefill call: ``rows`` query rows ending a ``ctx``-token sequence."""
    pages = ctx // PAGE
    table = torch.randperm(cache.shape[1], device="cuda")[:pages].view(1, pages).to(torch.int32)
    starts = torch.tensor([0, rows], dtype=torch.int32, device="cuda")
    lens = torch.tensor([ctx], dtype=torch.int32, device="cuda")
    q = torch.randn(rows, HQ, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    one = torch.tensor([0.05], device="cuda")
    fp8 = cache.dtype == torch.float8_e4m3fn

    def run() -> None:
        paged_prefill_attention(q, cache, starts, lens, table, rows, HEAD_DIM**-0.5,
                                (one, one) if fp8 else None, config=cfg)  # fmt: skip

    return captured_ms(run)


def prefill_accuracy(cfg: PrefillConfig) -> dict[str, float]:
    """RMS error of a 1K-row chunk at 4K context over an FP8 cache (the store kernel's) against
    fp32 causal attention over the unquantized keys and values and over the cache's own."""
    torch.manual_seed(0)
    rows, ctx = 1024, 4096
    kv = torch.randn(2, ctx, HKV, HEAD_DIM, device="cuda")
    scales = (torch.tensor([0.02], device="cuda"), torch.tensor([0.02], device="cuda"))
    cache = torch.zeros(2, ctx // PAGE, PAGE, HKV, HEAD_DIM, device="cuda",
                        dtype=torch.float8_e4m3fn)  # fmt: skip
    store_kv_cache(kv[0], kv[1], cache, torch.arange(ctx, device="cuda"), scales)
    stored = (kv / 0.02).clamp(-448, 448).to(torch.float8_e4m3fn).float() * 0.02
    q = torch.randn(rows, HQ, HEAD_DIM, dtype=torch.bfloat16, device="cuda") * 1.5
    table = torch.arange(ctx // PAGE, device="cuda", dtype=torch.int32).view(1, -1)
    starts = torch.tensor([0, rows], dtype=torch.int32, device="cuda")
    lens = torch.tensor([ctx], dtype=torch.int32, device="cuda")

    def reference(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        k, v = (x.repeat_interleave(HQ // HKV, 1).transpose(0, 1) for x in (keys, values))
        mask = (
            torch.arange(ctx, device="cuda")[None, :]
            <= torch.arange(ctx - rows, ctx, device="cuda")[:, None]
        )
        out = torch.nn.functional.scaled_dot_product_attention(
            q.float().transpose(0, 1), k, v, attn_mask=mask, scale=HEAD_DIM**-0.5
        )
        return out.transpose(0, 1)

    exact, of_cache = reference(kv[0], kv[1]), reference(stored[0], stored[1])
    o = paged_prefill_attention(q, cache, starts, lens, table, rows, HEAD_DIM**-0.5, scales,
                                config=cfg).float()  # fmt: skip
    rms = lambda x: x.pow(2).mean().sqrt().item()  # noqa: E731
    return {"output_rms": rms(exact), "cache_rounding": rms(of_cache - exact),
            "kernel_vs_exact": rms(o - exact), "kernel_vs_cache": rms(o - of_cache)}  # fmt: skip


def compare_prefill(args: argparse.Namespace) -> None:
    """The prefill kernel over a bf16 cache and over FP8 (on FP8 tensor cores);
    TFLOP/s count causal attention's multiply-adds (4 * rows * keys seen * D a head)."""
    shape = (2, 2 * 32768 // PAGE, PAGE, HKV, HEAD_DIM)
    out: dict[str, Any] = {"accuracy": {}}
    caches: dict[torch.dtype, torch.Tensor] = {}
    for name, (dtype, cfg) in prefill_configs().items():
        if dtype not in caches:
            caches[dtype] = torch.randn(shape, dtype=torch.bfloat16, device="cuda").to(dtype)
        out[name] = {"config": str(cfg), "shapes": []}
        for rows, ctx in PREFILL_SHAPES:
            try:
                ms = time_prefill(rows, ctx, caches[dtype], cfg)
            except Exception as exc:  # a config that does not compile must not end the run
                print(f"prefill {name} rows={rows} ctx={ctx}: failed {exc!r}"[:300], flush=True)
                continue
            keys_seen = rows * (ctx - rows) + rows * (rows + 1) / 2
            tflops = 4 * keys_seen * HEAD_DIM * HQ / ms / 1e9
            out[name]["shapes"].append({"rows": rows, "ctx": ctx, "ms": ms, "TFLOPs": tflops})
            print(f"prefill {name} rows={rows} ctx={ctx}: {ms:.3f} ms, {tflops:.0f} TFLOP/s",
                  flush=True)  # fmt: skip
        if dtype == torch.float8_e4m3fn and name in ("fp8_default", "fp8_q2"):
            out["accuracy"][name] = prefill_accuracy(cfg)
            print(f"accuracy {name}: {out['accuracy'][name]}", flush=True)
    print(f"wrote {write_result(f'fp8_kv_prefill_{args.tag}', out, args.out_dir)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--tag", default="h200")
    ap.add_argument("--sweep", action="store_true", help="tiles, stages and occupancy")
    ap.add_argument("--prefill", action="store_true", help="the prefill kernel, bf16 and FP8")
    ap.add_argument("--fused-merge", action="store_true", help="merge kernel vs last arrival")
    args = ap.parse_args()
    if args.fused_merge:
        return compare_fused_merge(args)
    if args.prefill:
        return compare_prefill(args)
    copy_gbs = copy_bandwidth_gbs()
    errors = {name: accuracy(FP8_CONFIGS[name]) for name in ERROR_CONFIGS}
    configs = sweep_configs() if args.sweep else FP8_CONFIGS
    bf16 = measure(torch.bfloat16, copy_gbs, "bf16", DecodeConfig())
    fp8 = {n: measure(torch.float8_e4m3fn, copy_gbs, n, c) for n, c in configs.items()}
    speedup = {
        name: [{"batch": a["batch"], "ctx": a["ctx"], "fp8_speedup": a["us"] / b["us"]}
               for a, b in zip(bf16, rows, strict=True) if "us" in b]
        for name, rows in fp8.items()
    }  # fmt: skip
    ranked = sorted(((r["fp8_speedup"], n, r) for n, rows in speedup.items() for r in rows),
                    key=lambda t: -t[0])  # fmt: skip
    for x, name, r in ranked[: 40 if args.sweep else len(ranked)]:
        print(f"{name} B={r['batch']} ctx={r['ctx']}: FP8 KV {x:.2f}x bf16")
    result = {"heads": {"q": HQ, "kv": HKV, "head_dim": HEAD_DIM, "page": PAGE},
              "copy_GBps": copy_gbs, "errors": errors, "bf16": bf16, "fp8_e4m3": fp8,
              "fp8_configs": {k: vars(v) for k, v in configs.items()},
              "speedup": speedup}  # fmt: skip
    print(f"wrote {write_result(f'fp8_kv_decode_{args.tag}', result, args.out_dir)}")


if __name__ == "__main__":
    main()
